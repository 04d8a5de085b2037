package scriptbatch_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/scriptbatch"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// echo answers with its argument: each caller must get its own back.
var echo = redis.NewScript(`return ARGV[1]`)

// counting counts the scripts that go out in pipelines of more than one.
type counting struct {
	*redis.Client
	batched atomic.Int64
}

func (c *counting) Pipeline() redis.Pipeliner { return &countedPipe{c.Client.Pipeline(), c} }

type countedPipe struct {
	redis.Pipeliner
	c *counting
}

func (p *countedPipe) Exec(ctx context.Context) ([]redis.Cmder, error) {
	if n := p.Len(); n > 1 {
		p.c.batched.Add(int64(n))
	}
	return p.Pipeliner.Exec(ctx)
}

// pooled returns a client of rdb's server with a pool of size connections.
func pooled(t *testing.T, rdb *redis.Client, size int) *redis.Client {
	t.Helper()
	opts := *rdb.Options()
	opts.PoolSize = size
	c := redis.NewClient(&opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// echoes has workers send rounds scripts each through s, with ctx, and
// checks that every reply is the caller's own.
func echoes(t *testing.T, ctx context.Context, s *scriptbatch.Sender, workers, rounds int) {
	t.Helper()
	workload.Each(t, workers, func(w int) error {
		for i := range rounds {
			want := strconv.Itoa(w) + ":" + strconv.Itoa(i)
			got, err := s.Run(ctx, echo, []string{"k"}, want).Text()
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("worker %d got %q, sent %q", w, got, want)
			}
		}
		return nil
	})
}

// batched sends 50 scripts from each of workers goroutines through a
// Sender on a pool of size connections, and returns how many went out in
// batches.
func batched(t *testing.T, ctx context.Context, size, workers int) int64 {
	rdb, _ := testserver.Redis(t)
	counted := &counting{Client: pooled(t, rdb, size)}
	s := scriptbatch.New(counted, scriptbatch.Limit(counted.Client))
	echoes(t, ctx, s, workers, 50)
	require.NoError(t, s.Close(ctx))
	return counted.batched.Load()
}

// Scripts of more concurrent callers than the client has connections go
// out together, and each caller gets its own script's reply: with a ctx
// that cannot end (sent on the caller's goroutine) and with one that can
// (sent on the Sender's).
func TestConcurrentCallsShareRoundTrips(t *testing.T) {
	t.Parallel()
	for name, ctx := range map[string]context.Context{"background": context.Background(), "cancellable": t.Context()} {
		require.Positive(t, batched(t, ctx, 4, 32), "%s: no script went out in a batch", name)
	}
}

// While a connection is free, no call is held back for a batch: it would
// wait a round trip for nothing.
func TestNoBatchWhileAConnectionIsFree(t *testing.T) {
	t.Parallel()
	require.Zero(t, batched(t, t.Context(), 16, 8), "scripts were batched with connections to spare")
}

// A batch sent after Redis lost its scripts still runs them all.
func TestBatchAfterScriptFlush(t *testing.T) {
	t.Parallel()
	srv := testserver.OwnRedis(t)
	rdb := srv.Client(t)
	s := scriptbatch.New(pooled(t, rdb, 2), 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	echoes(t, t.Context(), s, 16, 40)
	<-done
	require.NoError(t, s.Close(t.Context()))
}

func TestLimitIsThePoolSize(t *testing.T) {
	t.Parallel()
	limit := func(rdb interface{ Close() error }) int {
		defer rdb.Close()
		return scriptbatch.Limit(rdb)
	}
	require.Equal(t, 7, limit(redis.NewClient(&redis.Options{PoolSize: 7})))
	require.Equal(t, 2, limit(redis.NewClient(&redis.Options{PoolSize: 1})), "never below 2")
	require.Equal(t, 9, limit(redis.NewClusterClient(&redis.ClusterOptions{PoolSize: 9})))
}

// On a network that stopped answering, Run returns when ctx ends, although
// go-redis, which ignores ctx deadlines by default, is still waiting for
// the reply; Close waits for that call to end. A client that honours ctx
// deadlines does the same by itself, on the caller's goroutine, for a ctx
// with a deadline; a ctx that is only cancelled is watched as on any
// client. The error is the same on both.
func TestRunReturnsWhenCtxEndsOnAStuckNetwork(t *testing.T) {
	t.Parallel()
	for _, honours := range []bool{false, true} {
		for _, deadline := range []bool{true, false} {
			t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v/deadline=%v", honours, deadline), func(t *testing.T) {
				t.Parallel()
				stuck(t, honours, deadline)
			})
		}
	}
}

func stuck(t *testing.T, honours, deadline bool) {
	proxy := faultproxy.Start(t, "127.0.0.1:6379")
	// The client's own timeout is 1s: ten times ctx's 100ms, short enough
	// for the test to see the abandoned call end.
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: time.Second, MaxRetries: -1,
		ContextTimeoutEnabled: honours})
	t.Cleanup(func() { rdb.Close() })
	require.Equal(t, honours, scriptbatch.HonoursDeadlines(rdb))
	s := scriptbatch.New(rdb, scriptbatch.Limit(rdb))
	require.NoError(t, s.Run(t.Context(), echo, []string{"k"}, "warm").Err())

	proxy.Blackhole()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	if !deadline {
		ctx, cancel = context.WithCancel(t.Context())
		time.AfterFunc(100*time.Millisecond, cancel)
	}
	defer cancel()
	began := time.Now()
	err := s.Run(ctx, echo, []string{"k"}, "stuck").Err()
	took := time.Since(began)
	require.ErrorIs(t, err, scriptbatch.ErrAbandoned)
	// Not ctx.Err(): a client that honours deadlines sets the socket's to
	// ctx's, and its read may time out a moment before ctx's own timer
	// fires, when ctx.Err() is still nil.
	want := context.DeadlineExceeded
	if !deadline {
		want = context.Canceled
	}
	require.ErrorIs(t, err, want)
	require.Less(t, took, 500*time.Millisecond, "Run waited for the client's timeout")
	t.Logf("Run returned %v after it began, ctx ended after 100ms: %v", took, err)

	if !honours || !deadline {
		short, cancelShort := context.WithTimeout(t.Context(), 10*time.Millisecond)
		defer cancelShort()
		require.Error(t, s.Close(short), "the abandoned call is still under way")
	}
	require.NoError(t, s.Close(t.Context()), "the abandoned call never ended")
}

// Which clients end a call by its ctx's deadline by themselves.
func TestHonoursDeadlines(t *testing.T) {
	t.Parallel()
	honours := func(rdb interface {
		redis.Scripter
		Close() error
	}) bool {
		defer rdb.Close()
		return scriptbatch.HonoursDeadlines(rdb)
	}
	on := true
	require.False(t, honours(redis.NewClient(&redis.Options{})), "go-redis's default")
	require.True(t, honours(redis.NewClient(&redis.Options{ContextTimeoutEnabled: on})))
	require.True(t, honours(redis.NewClient(&redis.Options{ContextTimeoutEnabled: on, ReadTimeout: -1})), "no timeout of its own")
	require.False(t, honours(redis.NewClient(&redis.Options{ContextTimeoutEnabled: on, ReadTimeout: -2})), "no deadlines at all")
	require.False(t, honours(redis.NewClient(&redis.Options{ContextTimeoutEnabled: on, WriteTimeout: -2})), "no write deadlines")
	require.True(t, honours(redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: on})))
	require.True(t, honours(redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: on}).(*redis.Client)))
	require.True(t, honours(redis.NewRing(&redis.RingOptions{ContextTimeoutEnabled: on})))
	require.False(t, honours(redis.NewRing(&redis.RingOptions{ContextTimeoutEnabled: on, ReadTimeout: -2})))
	require.False(t, honours(redis.NewRing(&redis.RingOptions{})))
	require.False(t, honours(redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: on})), "routing policies look up on their own clock")
	require.True(t, honours(redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: on, DisableRoutingPolicies: true})))
	require.False(t, honours(redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: on, DisableRoutingPolicies: true, ReadOnly: true})))
	require.False(t, honours(redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: on, DisableRoutingPolicies: true, ReadTimeout: -2})))
	require.False(t, honours(&counting{Client: redis.NewClient(&redis.Options{ContextTimeoutEnabled: on})}), "a wrapper")
}

// Close ends the goroutines that wait for work at once, even with a ctx
// that has ended, and reports none under way; calls after Close still run.
func TestCloseEndsIdleGoroutines(t *testing.T) {
	t.Parallel()
	rdb, _ := testserver.Redis(t)
	s := scriptbatch.New(rdb, scriptbatch.Limit(rdb))
	echoes(t, t.Context(), s, 8, 20) // leaves goroutines waiting for work
	done, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, s.Close(done))
	require.Equal(t, "after", s.Run(t.Context(), echo, []string{"k"}, "after").Val())
	require.NoError(t, s.Close(t.Context()))
}

// held is a go-redis hook that holds back every call until go is closed.
type held struct{ go_ chan struct{} }

func (h *held) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *held) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { <-h.go_; return next(ctx, cmd) }
}

func (h *held) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { <-h.go_; return next(ctx, cmds) }
}

// Calls whose callers gave up while they waited for a batch are not sent:
// their callers' clean-up may already have run, and the scripts must not
// run after it. (go-redis itself sends nothing on an ended ctx, but a batch
// goes out on a ctx that its callers' deadlines do not end.) Start's
// channel says when a call is over.
func TestCallAbandonedInTheQueueIsNotSent(t *testing.T) {
	t.Parallel()
	rdb, prefix := testserver.Redis(t)
	h := &held{go_: make(chan struct{})}
	via := pooled(t, rdb, 1)
	via.AddHook(h)
	s := scriptbatch.New(via, 1)
	t.Cleanup(func() { require.NoError(t, s.Close(context.Background())) })
	incr := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
	key := prefix + "n"

	first := make(chan error, 1)
	go func() { first <- s.Run(t.Context(), incr, []string{key}).Err() }()
	require.Eventually(t, func() bool { return s.Pending() == 1 }, 5*time.Second, time.Millisecond)
	short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	var ends []<-chan struct{}
	abandoned := make(chan (<-chan struct{}), 2)
	for range 2 {
		go func() {
			cmd, ended := s.Start(short, incr, []string{key})
			if !errors.Is(cmd.Err(), scriptbatch.ErrAbandoned) {
				t.Errorf("an abandoned call returned %v", cmd.Err())
			}
			abandoned <- ended
		}()
	}
	for range 2 {
		ends = append(ends, <-abandoned)
	}
	close(h.go_)
	require.NoError(t, <-first)
	for _, ended := range ends {
		<-ended
	}
	n, err := rdb.Get(t.Context(), key).Int()
	require.NoError(t, err)
	require.Equal(t, 1, n, "the abandoned call was sent")
}
