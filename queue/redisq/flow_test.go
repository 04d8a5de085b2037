package redisq_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// Consumers closed while producers keep adding jobs: every job whose Enqueue
// or Submit returned nil is handled, by a consumer that starts afterwards if
// need be; none is lost. Delivery is at least once, so some may run twice.
func TestCloseUnderLoad(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	const enqueuers, submitters, perProducer = 3, 2, 150
	var (
		mu      sync.Mutex
		handled = map[string]int{} // job → times handled
		busy    = make(chan struct{})
		once    sync.Once
	)
	handler := func(_ context.Context, job queue.Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		handled[string(job.Payload)]++
		if len(handled) == 100 {
			once.Do(func() { close(busy) })
		}
		return job.Payload, nil
	}
	cfg := redisq.Config{Partitions: 4, MaxBatch: 10, Handler: handler}
	a := instance(t, client, prefix, cfg)
	b := instance(t, client, prefix, cfg)
	producer := instance(t, client, prefix, redisq.Config{Partitions: 4})

	var (
		wg       sync.WaitGroup
		accepted = make(chan string, (enqueuers+submitters)*perProducer)
		errs     = make(chan error, enqueuers+submitters)
	)
	for p := range enqueuers + submitters {
		wg.Go(func() {
			for i := range perProducer {
				job := fmt.Sprintf("%d:%d", p, i)
				key := "key-" + strconv.Itoa(i%7)
				if p < enqueuers {
					if err := producer.Enqueue(t.Context(), key, []byte(job)); err != nil {
						errs <- err
						return
					}
				} else if v, err := producer.Submit(t.Context(), key, []byte(job)); err != nil || string(v) != job {
					errs <- fmt.Errorf("submit %s: %q, %w", job, v, err)
					return
				}
				accepted <- job
			}
		})
	}
	<-busy
	before := len(accepted)
	closing := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(t, a.Close(ctx))
	require.NoError(t, b.Close(ctx))
	t.Logf("both consumers closed in %v, %d of %d jobs accepted before", time.Since(closing), before, cap(accepted))
	// Nothing consumes now; the producers go on (the submitters wait) until
	// the last consumer starts.
	instance(t, client, prefix, cfg)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	close(accepted)
	require.Len(t, accepted, (enqueuers+submitters)*perProducer)
	waitDepth(t, producer, 0)
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for job := range accepted {
		require.NotZero(t, handled[job], "job %s was accepted and never handled", job)
		if handled[job] > 1 {
			twice++
		}
	}
	t.Logf("%d jobs, %d handled more than once", len(handled), twice)
}

// Jobs keep flowing on many keys while an instance joins and another leaves:
// each key's jobs are handled in each producer's order (a job repeated right
// after a hand-over at most), and none is lost.
func TestRebalanceUnderFlow(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	const producers = 2
	keys := make([]string, 12)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	cfg := func(name string) redisq.Config {
		return redisq.Config{Partitions: 8, LeaseTTL: 400 * time.Millisecond, Handler: record(client, prefix, name)}
	}
	a := instance(t, client, prefix, cfg("a"))
	b := instance(t, client, prefix, cfg("b"))
	producer := instance(t, client, prefix, redisq.Config{Partitions: 8})

	var (
		wg   sync.WaitGroup
		stop = make(chan struct{})
		sent = make([]int, producers) // rounds each producer enqueued: one job per key
		errs = make(chan error, producers)
	)
	for p := range producers {
		wg.Go(func() {
			// Paced, so the flow lasts through the hand-overs without
			// flooding two cores.
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for seq := 1; ; seq++ {
				for _, k := range keys {
					if err := producer.Enqueue(t.Context(), k, fmt.Appendf(nil, "p%d:%d", p, seq)); err != nil {
						errs <- err
						return
					}
				}
				sent[p] = seq
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
	}
	owns := func(q *redisq.Queue, n int) func() bool { return func() bool { return len(q.Owned()) == n } }
	require.Eventually(t, func() bool { return owns(a, 4)() && owns(b, 4)() }, 10*time.Second, 10*time.Millisecond)
	c := instance(t, client, prefix, cfg("c"))
	require.Eventually(t, func() bool { return len(c.Owned()) >= 2 }, 10*time.Second, 10*time.Millisecond, "c joined and took a share")
	require.NoError(t, a.Close(t.Context()))
	require.Eventually(t, func() bool { return owns(b, 4)() && owns(c, 4)() }, 10*time.Second, 10*time.Millisecond, "a left: b and c share its partitions")
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	waitDepth(t, producer, 0)

	consumers := map[string]int{}
	for _, k := range keys {
		last, byConsumer := requireKeyOrder(t, client, prefix, k)
		for c, n := range byConsumer {
			consumers[c] += n
		}
		for p, n := range sent {
			require.Equal(t, n, last["p"+strconv.Itoa(p)], "key %s: producer %d's jobs all handled", k, p)
		}
	}
	total := 0
	for _, n := range sent {
		total += n * len(keys)
	}
	t.Logf("%d jobs enqueued, %d handled (repeats included), per consumer: %v", total, handledLen(t, client, prefix, keys), consumers)
	require.Len(t, consumers, 3, "every instance handled jobs")
}
