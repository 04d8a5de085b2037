// Package harness drives one operation from many goroutines in several OS
// processes at once, against one hot key or many keys, and reports what
// happened, so a test can check an invariant afterwards ("never oversold",
// "exactly one claim per key").
//
// Separate processes are the point: a process-local lock serialises the
// goroutines of one process and nothing else, which is exactly the bug the
// strategies exist to prevent. The harness re-executes the test binary, running
// only the calling (sub)test, which then acts as a worker process: see [Run].
package harness

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contend/contend"
)

// Config says how much load to make.
type Config struct {
	// Processes is how many worker processes run the operation. At 0 or 1 the
	// calling process runs it itself.
	Processes int
	// Goroutines is how many goroutines each process runs. Default: 1.
	Goroutines int
	// Ops is how many operations each goroutine runs. Zero means no limit;
	// then Duration must be set.
	Ops int
	// Total, when set, is how many operations run in all, across processes
	// and goroutines: each process gets its share, and its goroutines take
	// operations from it until it is gone. It replaces Ops.
	Total int
	// Duration stops the run after this long. Zero means no limit; then Ops
	// must be set.
	Duration time.Duration
	// Keys are the keys operations go to. Default: one hot key, "hot".
	Keys []string
	// Spread picks a random key for each operation. Otherwise every goroutine
	// walks Keys in order, operation i going to Keys[i%len(Keys)], so all
	// goroutines race for each key in turn ("rounds").
	Spread bool
	// Stall is how long a run may go with operations in flight and none
	// returning before it is taken as stuck: every operation waits for
	// others to finish (the holder of its key, a connection), so when none
	// has finished for this long, none will. A stuck run stops waiting and
	// reports it in [Result.Stalled]. Default: 20s.
	Stall time.Duration
}

// DefaultStall is [Config.Stall]'s default.
const DefaultStall = 20 * time.Second

func (c Config) withDefaults() Config {
	if c.Goroutines <= 0 {
		c.Goroutines = 1
	}
	if len(c.Keys) == 0 {
		c.Keys = []string{"hot"}
	}
	if c.Stall <= 0 {
		c.Stall = DefaultStall
	}
	return c
}

// An Op is the operation under test. It returns nil for a success, an error
// matching [contend.ErrConflict] for a lost race (a conflict, "sold out",
// "already claimed"), and any other error for a failure.
type Op func(ctx context.Context, key string) error

// Count tallies the outcomes of operations.
type Count struct {
	Successes int `json:"successes"`
	Conflicts int `json:"conflicts"`
	Errors    int `json:"errors"`
}

func (c *Count) add(o Count) {
	c.Successes += o.Successes
	c.Conflicts += o.Conflicts
	c.Errors += o.Errors
}

// Total is the number of operations counted.
func (c Count) Total() int { return c.Successes + c.Conflicts + c.Errors }

// Result is what a run did, summed over its processes.
type Result struct {
	Count
	// PerKey counts outcomes per key.
	PerKey map[string]Count `json:"per_key"`
	// Latencies holds the duration of every operation, sorted.
	Latencies []time.Duration `json:"latencies"`
	// FirstErrors holds up to 10 failure messages, per process.
	FirstErrors []string `json:"first_errors"`
	// Elapsed is the longest time a process spent running operations.
	Elapsed time.Duration `json:"elapsed"`
	// Stalled, when not empty, says that a run stopped waiting because no
	// operation returned for [Config.Stall], and which calls were still in
	// flight: the operation waits forever, or lost a caller. Their
	// goroutines are left behind, and nothing else in the Result is final.
	Stalled string `json:"stalled,omitempty"`
}

func (r *Result) merge(o Result) {
	r.Count.add(o.Count)
	if r.PerKey == nil {
		r.PerKey = map[string]Count{}
	}
	for k, c := range o.PerKey {
		sum := r.PerKey[k]
		sum.add(c)
		r.PerKey[k] = sum
	}
	r.Latencies = append(r.Latencies, o.Latencies...)
	r.FirstErrors = append(r.FirstErrors, o.FirstErrors...)
	r.Elapsed = max(r.Elapsed, o.Elapsed)
	if o.Stalled != "" {
		r.Stalled = strings.TrimPrefix(r.Stalled+"; "+o.Stalled, "; ")
	}
}

// Percentile returns the latency below which p (0 to 1) of operations took.
func (r Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(p * float64(len(r.Latencies)-1))
	return r.Latencies[min(max(i, 0), len(r.Latencies)-1)]
}

// Throughput returns operations per second.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Total()) / r.Elapsed.Seconds()
}

const maxErrorSamples = 10

// Local runs op from cfg.Goroutines goroutines of this process, ignoring
// cfg.Processes, and returns what happened. It stops early when ctx ends,
// and stops waiting when the run stalls (see [Config.Stall]).
func Local(ctx context.Context, cfg Config, op Op) Result {
	cfg = cfg.withDefaults()
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	var (
		mu     sync.Mutex // protects res
		res    = Result{PerKey: map[string]Count{}}
		wg     sync.WaitGroup
		left   atomic.Int64 // operations of cfg.Total not yet taken
		flying = newInFlight(cfg.Goroutines)
	)
	left.Store(int64(cfg.Total))
	start := time.Now()
	for g := range cfg.Goroutines {
		wg.Go(func() {
			var (
				local   = Result{PerKey: map[string]Count{}}
				samples []string
			)
			for i := 0; cfg.Total > 0 || cfg.Ops == 0 || i < cfg.Ops; i++ {
				if ctx.Err() != nil || (cfg.Total > 0 && left.Add(-1) < 0) {
					break
				}
				key := cfg.Keys[i%len(cfg.Keys)]
				if cfg.Spread {
					key = cfg.Keys[rand.IntN(len(cfg.Keys))]
				}
				began := flying.begin(g, key)
				err := op(ctx, key)
				took := flying.end(g, began)
				var c Count
				switch {
				case err == nil:
					c.Successes = 1
				case errors.Is(err, contend.ErrConflict):
					c.Conflicts = 1
				case cfg.Duration > 0 && ctx.Err() != nil:
					// The run's own deadline cut this operation short: it did
					// not fail, it was not allowed to finish.
					continue
				default:
					c.Errors = 1
					if len(samples) < maxErrorSamples {
						samples = append(samples, err.Error())
					}
				}
				local.Latencies = append(local.Latencies, took)
				local.Count.add(c)
				kc := local.PerKey[key]
				kc.add(c)
				local.PerKey[key] = kc
			}
			mu.Lock()
			defer mu.Unlock()
			res.merge(local)
			if room := maxErrorSamples - len(res.FirstErrors); room > 0 {
				res.FirstErrors = append(res.FirstErrors, samples[:min(room, len(samples))]...)
			}
		})
	}
	if stalled := flying.watch(&wg, cfg.Stall); stalled != "" {
		return Result{Stalled: stalled, Elapsed: time.Since(start)}
	}
	res.Elapsed = time.Since(start)
	sortLatencies(&res)
	return res
}

func sortLatencies(r *Result) { slices.Sort(r.Latencies) }
