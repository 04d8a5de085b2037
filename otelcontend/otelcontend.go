// Package otelcontend turns the events of contend's guards into
// OpenTelemetry metrics and spans: a [contend.Observer] in a module of its
// own (github.com/contend/contend/otelcontend), so that importing contend
// never brings OpenTelemetry in.
//
//	obs, err := otelcontend.New(nil, nil) // the global providers
//	locks, err := distlock.NewClient(rdb, distlock.Config{Observer: obs})
//
// The module is released with the root module, under tags
// otelcontend/vX.Y.Z beside vX.Y.Z, and requires the root module at the
// same version.
//
// Metrics, each with the attributes contend.strategy and contend.event:
//
//	contend.wait       histogram (s)  obtained and gave-up: how long callers waited for a key
//	contend.hold       histogram (s)  released and lost: how long a key was held, or fn ran
//	contend.conflicts  counter        conflict and gave-up: races lost
//	contend.retries    counter        retry: attempts made again
//	contend.losses     counter        lost: holds that ended before their holder let go
//	contend.failures   counter        failed and dead-lettered: backend or handler errors
//	contend.expired    counter        expired: records a cleanup removed (idempotency keys)
//
// Keys go on spans only: as a metric attribute they would make one series
// per key.
//
// Spans: one per guarded call, named "contend." plus the strategy, made when
// the call's end is reported (released, lost, conflict, gave-up) and dated
// back by the event's Wait and Hold, so that it covers the call from its
// start; it is the child of the span in the ctx the guard reported with,
// the caller's. An "obtained" span event marks when the key was got.
// Retries, failures and dead letters become events of the span in ctx, if
// there is one.
package otelcontend

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/contend/contend"
)

// ScopeName is the instrumentation scope of the Observer's meter and
// tracer.
const ScopeName = "github.com/contend/contend/otelcontend"

// Observer is a [contend.Observer] that records metrics and spans. It is
// safe for simultaneous use by multiple goroutines.
type Observer struct {
	tracer     trace.Tracer
	wait, hold metric.Float64Histogram
	conflicts  metric.Int64Counter
	retries    metric.Int64Counter
	losses     metric.Int64Counter
	failures   metric.Int64Counter
	expired    metric.Int64Counter
}

var _ contend.Observer = (*Observer)(nil)

// New returns an Observer that records on mp's meter and tp's tracer; nil
// means the global provider (otel.GetMeterProvider, otel.GetTracerProvider).
// It fails only when an instrument cannot be made.
func New(mp metric.MeterProvider, tp trace.TracerProvider) (*Observer, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(ScopeName)
	o := &Observer{tracer: tp.Tracer(ScopeName)}
	var err error
	// Waits for a lock run from a round trip to seconds.
	buckets := metric.WithExplicitBucketBoundaries(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
	if o.wait, err = m.Float64Histogram("contend.wait", metric.WithUnit("s"), buckets,
		metric.WithDescription("How long callers waited to get a key, or before they gave up.")); err != nil {
		return nil, err
	}
	if o.hold, err = m.Float64Histogram("contend.hold", metric.WithUnit("s"), buckets,
		metric.WithDescription("How long a key was held, or its fn or job ran.")); err != nil {
		return nil, err
	}
	counters := []struct {
		c           *metric.Int64Counter
		name, about string
	}{
		{&o.conflicts, "contend.conflicts", "Races lost: a key found held, or a wait given up."},
		{&o.retries, "contend.retries", "Attempts made again after a lost race or a deadlock."},
		{&o.losses, "contend.losses", "Holds that ended before their holder let go."},
		{&o.failures, "contend.failures", "Backend or handler failures, and jobs dead-lettered."},
		{&o.expired, "contend.expired", "Records a cleanup removed once their time was up."},
	}
	for _, c := range counters {
		if *c.c, err = m.Int64Counter(c.name, metric.WithUnit("{event}"), metric.WithDescription(c.about)); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Observe implements [contend.Observer].
func (o *Observer) Observe(ctx context.Context, e contend.Event) {
	now := time.Now()
	attrs := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("contend.strategy", string(e.Strategy)),
		attribute.String("contend.event", e.Kind.String()),
	))
	switch e.Kind {
	case contend.EventObtained:
		o.wait.Record(ctx, e.Wait.Seconds(), attrs)
	case contend.EventConflict:
		o.conflicts.Add(ctx, 1, attrs)
		o.span(ctx, e, now)
	case contend.EventGaveUp:
		o.conflicts.Add(ctx, 1, attrs)
		o.wait.Record(ctx, e.Wait.Seconds(), attrs)
		o.span(ctx, e, now)
	case contend.EventReleased:
		o.hold.Record(ctx, e.Hold.Seconds(), attrs)
		o.span(ctx, e, now)
	case contend.EventLost:
		o.losses.Add(ctx, 1, attrs)
		o.hold.Record(ctx, e.Hold.Seconds(), attrs)
		o.span(ctx, e, now)
	case contend.EventRetry:
		o.retries.Add(ctx, 1, attrs)
		o.annotate(ctx, e, now)
	case contend.EventFailed, contend.EventDeadLettered:
		o.failures.Add(ctx, 1, attrs)
		o.annotate(ctx, e, now)
	case contend.EventExpired:
		// A cleanup's, not a call's: no span of its own, and one event per
		// record would flood the caller's.
		o.expired.Add(ctx, 1, attrs)
	}
}

// span records the call that e ends as a span from its start, now less its
// wait and hold, to now.
func (o *Observer) span(ctx context.Context, e contend.Event, now time.Time) {
	start := now.Add(-e.Hold - e.Wait)
	_, span := o.tracer.Start(ctx, "contend."+string(e.Strategy),
		trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(o.attributes(e)...),
	)
	if e.Kind == contend.EventReleased || e.Kind == contend.EventLost {
		span.AddEvent("obtained", trace.WithTimestamp(start.Add(e.Wait)))
	}
	if e.Err != nil {
		span.RecordError(e.Err, trace.WithTimestamp(now))
		span.SetStatus(codes.Error, e.Kind.String())
	}
	span.End(trace.WithTimestamp(now))
}

// annotate adds e to the span in ctx, if it records.
func (o *Observer) annotate(ctx context.Context, e contend.Event, now time.Time) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := o.attributes(e)
	if e.Err != nil {
		attrs = append(attrs, attribute.String("exception.message", e.Err.Error()))
	}
	span.AddEvent("contend."+e.Kind.String(), trace.WithTimestamp(now), trace.WithAttributes(attrs...))
}

func (o *Observer) attributes(e contend.Event) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String("contend.strategy", string(e.Strategy)),
		attribute.String("contend.key", e.Key),
		attribute.String("contend.event", e.Kind.String()),
	}
	if e.Attempts != 0 {
		attrs = append(attrs, attribute.Int("contend.attempts", e.Attempts))
	}
	if e.Fence != 0 {
		attrs = append(attrs, attribute.Int64("contend.fence", e.Fence))
	}
	return attrs
}
