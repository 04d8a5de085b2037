package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
)

// BenchmarkObserve prices the Observer on the hot path, an uncontended
// TryObtain and Release: observer=none has no Observer, observer=noop one
// that does nothing, so the difference is what the events cost to build
// and time. Both must allocate the same. cpu-ns/op, this process's CPU
// time per op, shows the cost more steadily than the time per op, which
// the round trip to Redis dominates.
func BenchmarkObserve(b *testing.B) {
	noop := contend.ObserverFunc(func(context.Context, contend.Event) {})
	for _, bc := range []struct {
		name     string
		observer contend.Observer
	}{{"observer=none", nil}, {"observer=noop", noop}} {
		b.Run(bc.name, func(b *testing.B) {
			c, rdb, _ := setup(b, distlock.Config{Observer: bc.observer})
			ctx := b.Context()
			b.ReportAllocs()
			cpu := startCPU(b, rdb)
			for b.Loop() {
				l, err := c.TryObtain(ctx, "k", time.Minute)
				require.NoError(b, err)
				require.NoError(b, l.Release(ctx))
			}
			cpu.report(b)
		})
	}
}
