package otelcontend_test

import (
	"context"
	"fmt"
	"log"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/contend/contend/otelcontend"
	"github.com/contend/contend/queue"
)

// An Observer on a MeterProvider of the application's (here one with an
// in-memory reader, where a service would export to its collector), given
// to a guard's config: every guarded call is then measured.
func ExampleNew() {
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := otelcontend.New(meters, nil) // nil: the global TracerProvider
	if err != nil {
		log.Fatal(err)
	}

	noJobs := func(context.Context, queue.Job) ([]byte, error) { return nil, nil }
	q, err := queue.New(queue.Config{Partitions: 4, Handler: noJobs, Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	go q.Run(ctx)
	defer q.Close(ctx)
	for range 3 {
		if err := q.Do(ctx, "sku-1", func(context.Context) error { return nil }); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
			fmt.Println(m.Name, "calls:", h.DataPoints[0].Count)
		}
	}
	// Unordered output:
	// contend.wait calls: 3
	// contend.hold calls: 3
}
