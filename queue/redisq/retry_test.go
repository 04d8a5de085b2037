package redisq_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

var errPoison = errors.New("poison")

// events collects what Config.Observer reports.
type events struct {
	mu  sync.Mutex // protects all
	all []contend.Event
}

func (e *events) Observe(_ context.Context, ev contend.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// of returns the attempts of the events of kind about key's jobs, in the
// order they were reported.
func (e *events) of(kind contend.EventKind, key string) []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	var attempts []int
	for _, ev := range e.all {
		if ev.Kind == kind && ev.Key == key {
			attempts = append(attempts, ev.Attempts)
		}
	}
	return attempts
}

// waitDepth waits until the streams hold n unacknowledged entries.
func waitDepth(t *testing.T, q *redisq.Queue, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, err := q.Stats(t.Context())
		return err == nil && s.Depth == n
	}, 10*time.Second, time.Millisecond, "depth never reached %d", n)
}

// A batch holding a job that always fails: the batch is delivered again while
// each job has deliveries left, then its jobs run alone; only the poison job
// is dead-lettered, after Retry's deliveries, the others are answered, and
// the key's later jobs run. The Observer and Stats tell the same story.
func testBatchPoison(t *testing.T, client redis.UniversalClient, prefix string) {
	var (
		mu         sync.Mutex
		deliveries = map[string][]int{} // payload → attempts seen
	)
	var seen events
	cfg := redisq.Config{Partitions: 1, Retry: fast, Observer: &seen,
		BatchHandler: func(_ context.Context, jobs []queue.Job) ([]queue.Result, error) {
			res := make([]queue.Result, len(jobs))
			mu.Lock()
			defer mu.Unlock()
			for i, j := range jobs {
				deliveries[string(j.Payload)] = append(deliveries[string(j.Payload)], j.Attempt)
				res[i].Value = append([]byte("done "), j.Payload...)
			}
			for _, j := range jobs {
				if j.Key == "poison" {
					return nil, errPoison
				}
			}
			return res, nil
		}}
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	type answer struct {
		value []byte
		err   error
	}
	keys := []string{"k", "poison", "k"} // one partition: one stream
	answers := make([]chan answer, len(keys))
	for i, k := range keys {
		answers[i] = make(chan answer, 1)
		go func() {
			v, err := producer.Submit(t.Context(), k, []byte(strconv.Itoa(i)))
			answers[i] <- answer{v, err}
		}()
		waitDepth(t, producer, i+1) // in this order, and one batch once a consumer starts
	}
	consumer := instance(t, client, prefix, cfg)
	for i, k := range keys {
		a := <-answers[i]
		if k == "poison" {
			require.ErrorIs(t, a.err, redisq.ErrRemote)
			require.ErrorContains(t, a.err, errPoison.Error())
			continue
		}
		require.NoError(t, a.err)
		require.Equal(t, "done "+strconv.Itoa(i), string(a.value))
	}
	later, err := producer.Submit(t.Context(), "poison", []byte("later"))
	require.ErrorIs(t, err, redisq.ErrRemote, "the poison key's later job is its own batch, and fails too")
	require.Nil(t, later)
	after, err := producer.Submit(t.Context(), "k", []byte("after"))
	require.NoError(t, err, "the partition moves on")
	require.Equal(t, "done after", string(after))

	// MaxAttempts 3: the batch twice, then each job alone once more.
	mu.Lock()
	require.Equal(t, []int{1, 2, 3}, deliveries["1"], "the poison job: Retry's deliveries, no more")
	require.Equal(t, []int{1, 2, 3}, deliveries["0"])
	require.Equal(t, []int{1, 2, 3}, deliveries["2"])
	require.Equal(t, []int{1, 2, 3}, deliveries["later"], "alone from the start")
	mu.Unlock()

	dead, err := producer.DeadLetters(t.Context(), 0, "", 0)
	require.NoError(t, err)
	require.Len(t, dead, 2, "only the poison jobs are dead-lettered")
	for i, payload := range []string{"1", "later"} {
		require.Equal(t, queue.Job{Key: "poison", Payload: []byte(payload), Attempt: 3}, dead[i].Job)
		require.ErrorIs(t, dead[i].Err, redisq.ErrRemote)
		require.ErrorContains(t, dead[i].Err, errPoison.Error())
	}

	require.Equal(t, []int{3, 3}, seen.of(contend.EventDeadLettered, "poison"))
	require.Equal(t, []int{1, 2, 3, 1, 2, 3}, seen.of(contend.EventFailed, "poison"))
	require.Equal(t, []int{1, 1, 2, 2}, seen.of(contend.EventFailed, "k"), "the batch's failures are its jobs' too")
	require.Empty(t, seen.of(contend.EventDeadLettered, "k"))
	seen.mu.Lock()
	leases := map[contend.EventKind]int{}
	for _, e := range seen.all {
		require.Positive(t, e.Fence, "a delivery's events carry its partition lease's fencing token")
		if e.Strategy == "distlock" {
			require.Equal(t, "partition:0", e.Key)
			leases[e.Kind]++
			continue
		}
		require.Equal(t, contend.StrategyQueue, e.Strategy)
	}
	seen.mu.Unlock()
	require.Equal(t, map[contend.EventKind]int{contend.EventObtained: 1}, leases,
		"the consumer's lease on the partition, and no conflict of the other instance's tries")

	waitDepth(t, consumer, 0) // the answer comes before the acknowledgement
	s, err := consumer.Stats(t.Context())
	require.NoError(t, err)
	t.Logf("consumer stats: %+v", s.PartitionStats)
	require.Equal(t, queue.PartitionStats{Handled: 3, Redeliveries: 6 + 2, DeadLetters: 2}, s.PartitionStats)
	require.Equal(t, s.PartitionStats, s.Partitions[0])
	ps, err := producer.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, queue.PartitionStats{}, ps.PartitionStats, "a producer handled nothing, and nothing waits")
}

// The delivery count lives in the stream: an owner that retried a failing
// job and then handed the partition back leaves the count where it was, the
// next owner's claim adds its own delivery, and the job is dead-lettered
// after Retry's deliveries in all.
func TestAttemptsSurviveOwnerChange(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	retry := contend.Retry{MaxAttempts: 5, BaseDelay: time.Microsecond, MaxDelay: time.Microsecond}
	type delivery struct {
		owner   string
		attempt int
	}
	got := make(chan delivery, 8)
	stuck := make(chan struct{})
	handler := func(owner string) queue.Handler {
		return func(ctx context.Context, job queue.Job) ([]byte, error) {
			got <- delivery{owner, job.Attempt}
			if owner == "a" && job.Attempt == 2 {
				close(stuck)
				<-ctx.Done() // until a closes: a hand-over, not a failure
				return nil, ctx.Err()
			}
			return nil, errPoison
		}
	}
	var seenA, seenB events
	a := instance(t, client, prefix, redisq.Config{Partitions: 1, Retry: retry, Observer: &seenA, Handler: handler("a")})
	require.NoError(t, a.Enqueue(t.Context(), "k", nil))
	<-stuck
	require.NoError(t, a.Close(t.Context()))
	sa, err := a.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, queue.PartitionStats{Depth: 1, Redeliveries: 1}, sa.PartitionStats, "a handed the job back")

	b := instance(t, client, prefix, redisq.Config{Partitions: 1, Retry: retry, Observer: &seenB, Handler: handler("b")})
	var all []delivery
	for len(all) < 5 {
		select {
		case d := <-got:
			all = append(all, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("deliveries so far: %v", all)
		}
	}
	// a: 1 fails, 2 is cut short; b's claim is 3 (a's retry was counted).
	require.Equal(t, []delivery{{"a", 1}, {"a", 2}, {"b", 3}, {"b", 4}, {"b", 5}}, all)
	waitDepth(t, b, 0) // the acknowledgement follows the events
	require.Equal(t, []int{1}, seenA.of(contend.EventFailed, "k"), "a hand-over is no failure")
	require.Empty(t, seenA.of(contend.EventDeadLettered, "k"))
	require.Equal(t, []int{3, 4, 5}, seenB.of(contend.EventFailed, "k"))
	require.Equal(t, []int{5}, seenB.of(contend.EventDeadLettered, "k"))
	sb, err := b.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, queue.PartitionStats{Redeliveries: 3, DeadLetters: 1}, sb.PartitionStats)
	dead, err := b.DeadLetters(t.Context(), 0, "", 0)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, 5, dead[0].Job.Attempt)
}

// Depth is read from Redis, the same for every instance: entries never
// delivered plus entries delivered and not acknowledged.
func TestStatsDepth(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	producer := instance(t, client, prefix, redisq.Config{Partitions: 2})
	s, err := producer.Stats(t.Context())
	require.NoError(t, err)
	require.Zero(t, s.Depth, "no stream yet")
	for i := range 5 {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(strconv.Itoa(i))))
	}
	p := producer.Partition("k")
	s, err = producer.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, 5, s.Depth, "no consumer group yet: the stream's length")
	require.Equal(t, 5, s.Partitions[p].Depth)
	require.Zero(t, s.Partitions[1-p].Depth)

	// A consumer that read three entries and died: they still count.
	stream := prefix + "{" + strconv.Itoa(p) + "}"
	require.NoError(t, client.XGroupCreateMkStream(t.Context(), stream, "workers", "0").Err())
	require.NoError(t, client.XReadGroup(t.Context(), &redis.XReadGroupArgs{
		Group: "workers", Consumer: "dead", Streams: []string{stream, ">"}, Count: 3,
	}).Err())
	s, err = producer.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, 5, s.Depth, "2 never delivered + 3 pending")

	handled := make(chan struct{}, 5)
	consumer := instance(t, client, prefix, redisq.Config{Partitions: 2, Handler: func(context.Context, queue.Job) ([]byte, error) {
		handled <- struct{}{}
		return nil, nil
	}})
	for range 5 {
		<-handled
	}
	waitDepth(t, producer, 0)
	s, err = consumer.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, queue.PartitionStats{Handled: 5, Redeliveries: 3}, s.PartitionStats, "the dead consumer's three were redeliveries")
}

// A submitter whose ctx ends before the answer comes gets an error matching
// both ErrConflict and ctx's error, and the Observer hears that it gave up.
func TestSubmitWithoutAnswerIsAConflict(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	var seen events
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1, Observer: &seen}) // nobody consumes
	// Long enough that the XADD, slow on a loaded machine, is in before ctx
	// ends: a ctx that ends during it is a failed add, not a wait given up.
	const wait = time.Second
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	_, err := producer.Submit(ctx, "k", []byte("x"))
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, []int{0}, seen.of(contend.EventGaveUp, "k"))
	seen.mu.Lock()
	defer seen.mu.Unlock()
	require.GreaterOrEqual(t, seen.all[0].Wait, wait*2/3)
	require.ErrorIs(t, seen.all[0].Err, contend.ErrConflict)
}
