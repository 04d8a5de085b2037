package distlock

import (
	"context"
	"testing"
	"time"

	"github.com/contend/contend"
)

// BenchmarkReport is what a hold's events cost by themselves, without the
// round trips they come with: an obtain and a release reported, as
// BenchmarkObserve's op reports them. With observer=none it must cost
// next to nothing and allocate nothing.
func BenchmarkReport(b *testing.B) {
	noop := contend.ObserverFunc(func(context.Context, contend.Event) {})
	for _, bc := range []struct {
		name     string
		observer contend.Observer
	}{{"observer=none", nil}, {"observer=noop", noop}} {
		b.Run(bc.name, func(b *testing.B) {
			c := &Client{base: base{observer: bc.observer}}
			l := newLock(c, &c.base, "k", nil, "token", 1, time.Minute, time.Now().Add(time.Minute))
			ctx := b.Context()
			began := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				l.reportObtained(ctx, began, 1)
				l.reportHold(ctx, contend.EventReleased, nil)
			}
		})
	}
}
