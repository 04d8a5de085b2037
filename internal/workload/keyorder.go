package workload

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// Produce runs producers goroutines at once; each enqueues, jobs times over,
// one job to each of keys keys ("key-0", "key-1", …), with the payload a
// KeyOrder reads: the producer's number and the job's sequence. It fails t
// with every error enqueue returned.
func Produce(t testing.TB, producers, keys, jobs int, enqueue func(ctx context.Context, key string, payload []byte) error) {
	t.Helper()
	Each(t, producers, func(p int) error {
		for seq := range jobs {
			for k := range keys {
				if err := enqueue(t.Context(), "key-"+strconv.Itoa(k), fmt.Appendf(nil, "%d %d", p, seq)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// A KeyOrder checks the jobs of Produce as a queue's handler runs them: a
// job of a key that runs while another of that key runs, or that comes out
// of its producer's order, is bad.
type KeyOrder struct {
	mu     sync.Mutex     // protects last and inside
	last   map[string]int // key/producer → last sequence seen
	inside map[string]int // key → handlers running now
	bad    atomic.Int64
	seen   atomic.Int64
}

// Handle records the run of the job of key with payload, and returns how
// many jobs have run so far, this one included.
func (o *KeyOrder) Handle(key string, payload []byte) (int64, error) {
	var p, seq int
	if _, err := fmt.Sscanf(string(payload), "%d %d", &p, &seq); err != nil {
		return o.seen.Load(), err
	}
	id := key + "/" + strconv.Itoa(p)
	o.mu.Lock()
	if o.last == nil {
		o.last, o.inside = map[string]int{}, map[string]int{}
	}
	if o.inside[key]++; o.inside[key] > 1 {
		o.bad.Add(1)
	}
	prev, ok := o.last[id]
	if ok && seq != prev+1 || !ok && seq != 0 {
		o.bad.Add(1)
	}
	o.last[id] = seq
	o.mu.Unlock()
	n := o.seen.Add(1)
	o.mu.Lock()
	o.inside[key]--
	o.mu.Unlock()
	return n, nil
}

// Seen is how many jobs have run.
func (o *KeyOrder) Seen() int64 { return o.seen.Load() }

// Bad is how many jobs ran beside another of their key or out of order.
func (o *KeyOrder) Bad() int64 { return o.bad.Load() }
