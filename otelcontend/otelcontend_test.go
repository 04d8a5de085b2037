package otelcontend_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/otelcontend"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testRedis connects to the Redis that CONTEND_REDIS_URL names (default: the
// local server on its standard port) and returns a key prefix of this test's
// own, whose keys it deletes at cleanup.
func testRedis(t *testing.T) (*redis.Client, string) {
	t.Helper()
	url := os.Getenv("CONTEND_REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { require.NoError(t, rdb.Close()) })
	require.NoError(t, rdb.Ping(t.Context()).Err(),
		"this test needs Redis: start redis-server on 127.0.0.1:6379 or set CONTEND_REDIS_URL")
	prefix := fmt.Sprintf("otelcontend-test:%s:%d:", t.Name(), time.Now().UnixNano())
	t.Cleanup(func() {
		ctx := context.Background()
		keys, err := rdb.Keys(ctx, prefix+"*").Result()
		require.NoError(t, err)
		if len(keys) > 0 {
			require.NoError(t, rdb.Del(ctx, keys...).Err())
		}
	})
	return rdb, prefix
}

type env struct {
	obs    *otelcontend.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tracer trace.Tracer // the application's, for the callers' spans
}

func setup(t *testing.T) env {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() {
		require.NoError(t, tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
	obs, err := otelcontend.New(mp, tp)
	require.NoError(t, err)
	return env{obs: obs, reader: reader, spans: spans, tracer: tp.Tracer("test")}
}

// metrics collects what the reader holds: each histogram's count and each
// counter's sum, by name, over all attributes.
func (e env) metrics(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, e.reader.Collect(t.Context(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, otelcontend.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					got[m.Name] += int64(p.Count)
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[m.Name] += p.Value
				}
			}
		}
	}
	return got
}

// A real distlock Client on the real Redis: a Do, a conflict and a lost
// lock become metrics, and spans that are children of the caller's span and
// cover each call from its start.
func TestDistlockEventsBecomeMetricsAndSpans(t *testing.T) {
	e := setup(t)
	rdb, prefix := testRedis(t)
	c, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix, Observer: e.obs})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })

	ctx, request := e.tracer.Start(t.Context(), "request")
	const work = 20 * time.Millisecond
	require.NoError(t, c.Do(ctx, "job", func(context.Context) error {
		time.Sleep(work)
		return nil
	}))

	held, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	_, err = c.TryObtain(ctx, "job", time.Minute)
	require.ErrorIs(t, err, contend.ErrConflict)
	// The lease ran out and another holder took the key, with the next
	// fencing token: the release finds the lock gone.
	require.NoError(t, rdb.Set(ctx, prefix+"{job}", "intruder", time.Minute).Err())
	require.NoError(t, rdb.Incr(ctx, prefix+"{job}:fence").Err())
	require.ErrorIs(t, held.Release(ctx), contend.ErrLockLost)
	request.End()

	require.Equal(t, map[string]int64{
		"contend.wait":      2, // the two obtains
		"contend.hold":      2, // released and lost
		"contend.conflicts": 1,
		"contend.losses":    1,
	}, e.metrics(t))

	var calls []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == "contend.distlock" {
			calls = append(calls, s)
		}
	}
	require.Len(t, calls, 3, "one span per call: the Do, the conflict, the lost hold")
	for _, s := range calls {
		require.Equal(t, request.SpanContext().SpanID(), s.Parent().SpanID(), "a child of the caller's span")
		require.Equal(t, request.SpanContext().TraceID(), s.SpanContext().TraceID())
	}
	do, conflict, lost := calls[0], calls[1], calls[2]
	require.GreaterOrEqual(t, do.EndTime().Sub(do.StartTime()), work, "the span covers the call from its start")
	require.Len(t, do.Events(), 1)
	require.Equal(t, "obtained", do.Events()[0].Name)
	require.Equal(t, codes.Unset, do.Status().Code)
	require.Equal(t, codes.Error, conflict.Status().Code)
	require.Equal(t, "conflict", conflict.Status().Description)
	require.Equal(t, codes.Error, lost.Status().Code)
	require.Equal(t, "lost", lost.Status().Description)
	attrs := map[string]any{}
	for _, kv := range do.Attributes() {
		attrs[string(kv.Key)] = kv.Value.AsInterface()
	}
	require.Equal(t, "job", attrs["contend.key"])
	require.Equal(t, "distlock", attrs["contend.strategy"])
	require.Positive(t, attrs["contend.fence"])
}

// Retries and failures count, and mark the span in ctx rather than make
// spans of their own.
func TestRetriesAndFailuresAnnotateTheCallersSpan(t *testing.T) {
	e := setup(t)
	ctx, span := e.tracer.Start(t.Context(), "update")
	e.obs.Observe(ctx, contend.Event{Kind: contend.EventRetry, Strategy: "optimistic", Key: "k", Attempts: 1, Err: contend.ErrConflict})
	e.obs.Observe(ctx, contend.Event{Kind: contend.EventFailed, Strategy: "queue", Key: "k", Attempts: 2, Err: context.DeadlineExceeded})
	span.End()
	require.Equal(t, map[string]int64{"contend.retries": 1, "contend.failures": 1}, e.metrics(t))
	ended := e.spans.Ended()
	require.Len(t, ended, 1)
	var names []string
	for _, ev := range ended[0].Events() {
		names = append(names, ev.Name)
	}
	require.Equal(t, []string{"contend.retry", "contend.failed"}, names)
}

// A record a cleanup removed counts, and makes no span.
func TestExpiredCounts(t *testing.T) {
	e := setup(t)
	for _, key := range []string{"a", "b"} {
		e.obs.Observe(t.Context(), contend.Event{Kind: contend.EventExpired, Strategy: contend.StrategyIdempotency, Key: key, Fence: 7})
	}
	require.Equal(t, map[string]int64{"contend.expired": 2}, e.metrics(t))
	require.Empty(t, e.spans.Ended())
}
