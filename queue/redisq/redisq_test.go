package redisq_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// The parallel tests wait on leases, timers and Redis restarts; one sells
// on PostgreSQL through a few connections. Four at a time: the fault tests'
// leases are a second or less, and a failover's aftermath on a busy
// machine once redelivered a job whose ack met the dead master.
func TestMain(m *testing.M) { testserver.MainWaiting(m, 4) }

var fast = contend.Retry{MaxAttempts: 3, BaseDelay: time.Microsecond, MaxDelay: time.Microsecond}

// instance builds a queue on client/prefix and, when it has a handler, runs
// it until t ends.
func instance(t testing.TB, client redis.UniversalClient, prefix string, cfg redisq.Config) *redisq.Queue {
	t.Helper()
	cfg.Prefix = prefix
	if cfg.Partitions == 0 {
		cfg.Partitions = 4
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = time.Second
	}
	q, err := redisq.New(client, cfg)
	require.NoError(t, err)
	ran := make(chan error, 1)
	if cfg.Handler != nil || cfg.BatchHandler != nil {
		go func() { ran <- q.Run(context.Background()) }()
	} else {
		ran <- nil
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, q.Close(ctx))
		if err := <-ran; !errors.Is(err, contend.ErrClosed) {
			require.NoError(t, err)
		}
	})
	return q
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	client, _ := testserver.Redis(t)
	var nilClient *redis.Client
	for name, c := range map[string]struct {
		rdb redis.UniversalClient
		cfg redisq.Config
	}{
		"nil redis":       {nil, redisq.Config{Partitions: 1}},
		"nil *Client":     {nilClient, redisq.Config{Partitions: 1}},
		"zero partitions": {client, redisq.Config{}},
		"negative ttl":    {client, redisq.Config{Partitions: 1, LeaseTTL: -1}},
	} {
		_, err := redisq.New(c.rdb, c.cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	q, err := redisq.New(client, redisq.Config{Partitions: 1})
	require.NoError(t, err, "a producer needs no handler")
	require.ErrorIs(t, q.Run(t.Context()), contend.ErrInvalid, "a consumer does")
	require.ErrorIs(t, q.Enqueue(t.Context(), "", nil), contend.ErrInvalid)
	require.NoError(t, q.Close(t.Context()))
	require.ErrorIs(t, q.Enqueue(t.Context(), "k", nil), contend.ErrClosed, "a closed queue takes no jobs")
	_, err = q.Submit(t.Context(), "k", nil)
	require.ErrorIs(t, err, contend.ErrClosed)
	_, err = q.Stats(t.Context())
	require.NoError(t, err)
}

func testSubmit(t *testing.T, client redis.UniversalClient, prefix string) {
	instance(t, client, prefix, redisq.Config{Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
		if string(job.Payload) == "fail" {
			return nil, errors.New("no such thing")
		}
		fence, ok := redisq.Fence(ctx)
		if !ok || fence <= 0 {
			return nil, errors.New("no fencing token")
		}
		return []byte(job.Key + ":" + string(job.Payload)), nil
	}, Retry: fast})
	producer := instance(t, client, prefix, redisq.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got, err := producer.Submit(ctx, "sku-1", []byte("buy"))
	require.NoError(t, err)
	require.Equal(t, "sku-1:buy", string(got))

	_, err = producer.Submit(ctx, "sku-1", []byte("fail"))
	require.ErrorIs(t, err, redisq.ErrRemote)
	require.ErrorContains(t, err, "no such thing")
	dead, err := producer.DeadLetters(ctx, producer.Partition("sku-1"), "", 0)
	require.NoError(t, err)
	require.Len(t, dead, 1, "the failed job is a dead letter")
	require.Equal(t, "fail", string(dead[0].Job.Payload))

	got, err = producer.Submit(ctx, "sku-1", []byte("after"))
	require.NoError(t, err, "the key moves on after a dead letter")
	require.Equal(t, "sku-1:after", string(got))
}

// Three consumer instances, four producers: each key's jobs are handled one
// at a time and in each producer's order, whichever instance holds the
// partition.
func testOrderPerKey(t *testing.T, client redis.UniversalClient, prefix string) {
	const producers, keys, jobs = 4, 12, 15
	var order workload.KeyOrder
	done := make(chan struct{})
	handler := func(_ context.Context, job queue.Job) ([]byte, error) {
		n, err := order.Handle(job.Key, job.Payload)
		if n == producers*keys*jobs {
			close(done)
		}
		return nil, err
	}
	for range 3 {
		instance(t, client, prefix, redisq.Config{Handler: handler})
	}
	producer := instance(t, client, prefix, redisq.Config{})
	workload.Produce(t, producers, keys, jobs, producer.Enqueue)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("handled %d of %d jobs", order.Seen(), producers*keys*jobs)
	}
	require.Zero(t, order.Bad(), "jobs of one key ran out of order or overlapped")
}

// Entries a dead owner read and never acknowledged are redelivered by the
// next owner, in order, before new ones.
func testRedeliversPending(t *testing.T, client redis.UniversalClient, prefix string) {
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	for i := range 5 {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(strconv.Itoa(i))))
	}
	// A consumer that reads three entries and dies before acknowledging.
	stream := prefix + "{0}"
	require.NoError(t, client.XGroupCreateMkStream(t.Context(), stream, "workers", "0").Err())
	res, err := client.XReadGroup(t.Context(), &redis.XReadGroupArgs{
		Group: "workers", Consumer: "dead", Streams: []string{stream, ">"}, Count: 3,
	}).Result()
	require.NoError(t, err)
	require.Len(t, res[0].Messages, 3)
	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("5")))

	got := make(chan string, 6)
	instance(t, client, prefix, redisq.Config{Partitions: 1, Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
		got <- string(job.Payload)
		return nil, nil
	}})
	for i := range 6 {
		select {
		case p := <-got:
			require.Equal(t, strconv.Itoa(i), p)
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d was not redelivered", i)
		}
	}
	// The handler answers before the acknowledgement, so wait for it: then
	// nothing is pending, and the trim, which follows the acknowledgements,
	// has left only the last entry (its lower bound).
	require.Eventually(t, func() bool {
		pending, err := client.XPending(t.Context(), stream, "workers").Result()
		n, lerr := client.XLen(t.Context(), stream).Result()
		return err == nil && lerr == nil && pending.Count == 0 && n == 1
	}, 10*time.Second, 10*time.Millisecond)
}

// The oversell workload across instances: three consumers with a batch
// handler sell stock 1000 to 64 buyers; exactly 1000 sold, every buyer
// answered. Stock lives in Redis here (the SQL version is in package queue):
// the handler reads and writes it without any lock, because only one
// instance holds the partition.
func testSellHotKey(t *testing.T, client redis.UniversalClient, prefix string) {
	stockKey := prefix + "stock"
	require.NoError(t, client.Set(t.Context(), stockKey, 1000, 0).Err())
	seller := func(ctx context.Context, jobs []queue.Job) ([]queue.Result, error) {
		stock, err := client.Get(ctx, stockKey).Int()
		if err != nil {
			return nil, err
		}
		sold := min(stock, len(jobs))
		if err := client.Set(ctx, stockKey, stock-sold, 0).Err(); err != nil {
			return nil, err
		}
		res := make([]queue.Result, len(jobs))
		for i := range res {
			res[i].Value = []byte("sold-out")
			if i < sold {
				res[i].Value = []byte("sold")
			}
		}
		return res, nil
	}
	for range 3 {
		instance(t, client, prefix, redisq.Config{Partitions: 4, BatchHandler: seller})
	}
	producer := instance(t, client, prefix, redisq.Config{Partitions: 4})
	var (
		sold, soldOut atomic.Int64
		wg            sync.WaitGroup
		errs          = make(chan error, 64*20)
	)
	for range 64 {
		wg.Go(func() {
			for range 20 {
				v, err := producer.Submit(t.Context(), "hot", nil)
				switch {
				case err != nil:
					errs <- err
				case string(v) == "sold":
					sold.Add(1)
				default:
					soldOut.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 1000, sold.Load())
	require.EqualValues(t, 280, soldOut.Load())
	left, err := client.Get(t.Context(), stockKey).Int()
	require.NoError(t, err)
	require.Zero(t, left)
}

// An owner that died holding a partition's lease, with entries read and not
// acknowledged: once the lease runs out, a live instance takes the partition
// and redelivers them in order. Nothing runs before the lease ends.
func testTakeover(t *testing.T, client redis.UniversalClient, prefix string) {
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	for i := range 3 {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(strconv.Itoa(i))))
	}
	// The dead owner: it obtained the lease, read the entries, and stopped
	// refreshing and acknowledging (its process was killed).
	const ttl = 600 * time.Millisecond
	locks, err := distlock.NewClient(client, distlock.Config{Prefix: prefix + "lease:"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, locks.Close(context.Background())) })
	_, err = locks.TryObtain(t.Context(), "partition:0", ttl)
	require.NoError(t, err)
	died := time.Now()
	stream := prefix + "{0}"
	require.NoError(t, client.XGroupCreateMkStream(t.Context(), stream, "workers", "0").Err())
	require.NoError(t, client.XReadGroup(t.Context(), &redis.XReadGroupArgs{
		Group: "workers", Consumer: "dead", Streams: []string{stream, ">"}, Count: 2,
	}).Err())

	got := make(chan string, 3)
	instance(t, client, prefix, redisq.Config{Partitions: 1, LeaseTTL: ttl, Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
		got <- string(job.Payload)
		return nil, nil
	}})
	for i := range 3 {
		select {
		case p := <-got:
			require.Equal(t, strconv.Itoa(i), p)
			if i == 0 {
				waited := time.Since(died)
				t.Logf("taken over %v after the owner died", waited)
				require.GreaterOrEqual(t, waited, ttl-50*time.Millisecond, "ran while the dead owner's lease was valid")
				// A second of slack for a loaded machine, as the kill test allows.
				require.Less(t, waited, 3*ttl+time.Second, "took more than about one lease to take over")
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d was not redelivered", i)
		}
	}
}

// Instances share the partitions: one alone takes all four; when a second
// joins, each ends with two; when it leaves, the first takes all again.
func testRebalance(t *testing.T, client redis.UniversalClient, prefix string) {
	cfg := redisq.Config{Partitions: 4, LeaseTTL: 400 * time.Millisecond, Handler: func(context.Context, queue.Job) ([]byte, error) { return nil, nil }}
	a := instance(t, client, prefix, cfg)
	owns := func(q *redisq.Queue, n int) func() bool { return func() bool { return len(q.Owned()) == n } }
	require.Eventually(t, owns(a, 4), 10*time.Second, 10*time.Millisecond, "alone, a takes every partition")
	b := instance(t, client, prefix, cfg)
	require.Eventually(t, func() bool { return owns(a, 2)() && owns(b, 2)() }, 10*time.Second, 10*time.Millisecond,
		"after b joins: a owns %v, b owns %v", a.Owned(), b.Owned())
	require.NoError(t, b.Close(t.Context()))
	require.Eventually(t, owns(a, 4), 10*time.Second, 10*time.Millisecond, "after b left, a takes its share")
}

// A job answered twice (delivery is at least once: its owner died between
// the answer and the acknowledgement) whose submitter does not take the
// answers, because its ctx ended at that moment: the later submitters are
// still answered.
func testDuplicateAnswer(t *testing.T, client redis.UniversalClient, prefix string) {
	instance(t, client, prefix, redisq.Config{Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
		return job.Payload, nil
	}})
	producer := instance(t, client, prefix, redisq.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := producer.Submit(ctx, "k", []byte("start the listener"))
	require.NoError(t, err)
	replies, leave, err := producer.StuckSubmitter("twice")
	require.NoError(t, err)
	defer leave()
	require.NoError(t, client.RPush(ctx, replies, "twice|vfirst", "twice|vagain").Err())
	for i := range 3 {
		got, err := producer.Submit(ctx, "k", []byte(strconv.Itoa(i)))
		require.NoError(t, err, "submit %d after a duplicate answer", i)
		require.Equal(t, strconv.Itoa(i), string(got))
	}
}

// Close returns by its ctx's deadline even when a handler does not heed its
// ctx, and says which partitions' workers still run; Run returns once the
// handler has, and a later Close then succeeds.
func TestCloseReturnsByDeadline(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	entered, release := make(chan struct{}), make(chan struct{})
	q, err := redisq.New(client, redisq.Config{Prefix: prefix, Partitions: 1, Handler: func(context.Context, queue.Job) ([]byte, error) {
		close(entered)
		<-release // ignores its ctx
		return nil, nil
	}})
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- q.Run(context.Background()) }()
	require.NoError(t, q.Enqueue(t.Context(), "k", nil))
	<-entered
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	err = q.Close(ctx)
	took := time.Since(began)
	close(release)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "partitions [0]")
	require.Less(t, took, time.Second, "Close waited past its ctx's deadline")
	require.NoError(t, <-ran)
	require.NoError(t, q.Close(t.Context()))
}

// An owner's trim after an acknowledgement stops below an older entry that
// another consumer still has pending (a read that reached Redis late took
// it, and the owner has yet to reclaim it), and deletes the done entries
// below it.
func TestTrimKeepsPending(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	q := instance(t, client, prefix, redisq.Config{Partitions: 1})
	for i := range 5 {
		require.NoError(t, q.Enqueue(t.Context(), "k", []byte(strconv.Itoa(i))))
	}
	stream := prefix + "{0}"
	require.NoError(t, client.XGroupCreateMkStream(t.Context(), stream, "workers", "0").Err())
	readBy := func(consumer string, n int64) []string {
		res, err := client.XReadGroup(t.Context(), &redis.XReadGroupArgs{
			Group: "workers", Consumer: consumer, Streams: []string{stream, ">"}, Count: n,
		}).Result()
		require.NoError(t, err)
		var ids []string
		for _, m := range res[0].Messages {
			ids = append(ids, m.ID)
		}
		return ids
	}
	done := readBy("owner", 1)  // handled and acknowledged before
	late := readBy("late", 2)   // taken by a late read
	batch := readBy("owner", 2) // the batch the owner acknowledges now
	require.NoError(t, q.Acknowledge(t.Context(), 0, done...))
	require.NoError(t, q.Acknowledge(t.Context(), 0, batch...))

	left, err := client.XRange(t.Context(), stream, "-", "+").Result()
	require.NoError(t, err)
	var ids []string
	for _, m := range left {
		ids = append(ids, m.ID)
	}
	require.Equal(t, append(late, batch...), ids, "the trim deleted an entry still pending, or kept a done one")
	pending, err := client.XPending(t.Context(), stream, "workers").Result()
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"late": 2}, pending.Consumers)
}
