package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/testserver"
)

// nodes starts n Redis servers of the test's own, independent masters.
func nodes(t *testing.T, n int) ([]*testserver.OwnedRedis, []*redis.Client, []redis.Scripter) {
	t.Helper()
	var (
		servers []*testserver.OwnedRedis
		clients []*redis.Client
		asNodes []redis.Scripter
	)
	for range n {
		s := testserver.OwnRedis(t)
		// One dial per attempt: a node that is down is down.
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialerRetries: 1})
		t.Cleanup(func() { c.Close() })
		servers, clients, asNodes = append(servers, s), append(clients, c), append(asNodes, c)
	}
	// Bring stopped nodes back before their clients close: a client that
	// failed to dial keeps redialling in a goroutine of go-redis's, every
	// second, until a dial succeeds, and would outlive the test.
	t.Cleanup(func() {
		for i, s := range servers {
			require.NoError(t, s.Start())
			require.Eventually(t, func() bool { return clients[i].Ping(context.Background()).Err() == nil },
				10*time.Second, 10*time.Millisecond)
		}
	})
	return servers, clients, asNodes
}

func newQuorum(t testing.TB, nodes []redis.Scripter) *distlock.Quorum {
	t.Helper()
	// A node that is down is refused at once; the timeout only has to be
	// long enough for a loaded machine's answers.
	q, err := distlock.NewQuorum(nodes, distlock.QuorumConfig{NodeTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close(context.Background())) })
	return q
}

// With 5 nodes, a lock needs 3: it is granted with 2 down, refused with 3
// down, and refused as "no quorum", not as "busy".
func TestQuorumSurvivesAMinority(t *testing.T) {
	t.Parallel()
	servers, clients, asNodes := nodes(t, 5)
	q := newQuorum(t, asNodes)
	ctx := t.Context()

	l, err := q.TryObtain(ctx, "job", 5*time.Second)
	require.NoError(t, err)
	require.Zero(t, l.Fence(), "a quorum offers no fencing tokens")
	for _, c := range clients {
		require.Equal(t, l.Token(), c.Get(ctx, "distlock:{job}").Val())
	}
	require.NoError(t, l.Release(ctx))

	require.NoError(t, servers[0].Stop())
	require.NoError(t, servers[1].Stop())
	l, err = q.TryObtain(ctx, "job", 5*time.Second)
	require.NoError(t, err, "3 of 5 nodes are a majority")
	require.NoError(t, l.Refresh(ctx, 0))
	left, err := l.TTL(ctx)
	require.NoError(t, err)
	require.Greater(t, left, 3*time.Second)
	_, err = q.TryObtain(ctx, "job", 5*time.Second)
	require.ErrorIs(t, err, contend.ErrConflict, "held on the majority")
	require.NotErrorIs(t, err, distlock.ErrNoQuorum)
	require.NoError(t, l.Release(ctx))

	require.NoError(t, servers[2].Stop())
	_, err = q.TryObtain(ctx, "job", 5*time.Second)
	require.ErrorIs(t, err, distlock.ErrNoQuorum, "2 of 5 nodes are no majority")
	require.NotErrorIs(t, err, contend.ErrConflict, "nodes being down is not a held key")
	for _, c := range clients[3:] {
		require.Zero(t, c.Exists(ctx, "distlock:{job}").Val(), "the failed attempt left its token behind")
	}
	err = q.Do(ctx, "job", func(context.Context) error { t.Error("fn ran without a quorum"); return nil })
	require.ErrorIs(t, err, distlock.ErrNoQuorum)

	// A node coming back empty restores the majority (once its client has
	// redialled: go-redis retries a failed dial every second).
	require.NoError(t, servers[0].Start())
	require.Eventually(t, func() bool {
		return q.Do(ctx, "job", func(context.Context) error { return nil }) == nil
	}, 10*time.Second, 50*time.Millisecond)
}

// An attempt that wins a minority deletes its token from every node, so a
// partial grant does not block the key until it expires.
func TestQuorumCleansUpAFailedAttempt(t *testing.T) {
	t.Parallel()
	_, clients, asNodes := nodes(t, 5)
	q := newQuorum(t, asNodes)
	ctx := t.Context()
	key := "distlock:{job}"
	for _, c := range clients[:3] {
		require.NoError(t, c.Set(ctx, key, "someone-else", time.Minute).Err())
	}
	_, err := q.TryObtain(ctx, "job", time.Minute)
	require.ErrorIs(t, err, contend.ErrConflict)
	for _, c := range clients[3:] {
		require.Zero(t, c.Exists(ctx, key).Val(), "the minority's grants were not undone")
	}
	for _, c := range clients[:3] {
		require.Equal(t, "someone-else", c.Get(ctx, key).Val(), "the cleanup deleted another holder's lock")
	}

	// Waiting polls until the holder lets go.
	waiter := make(chan error, 1)
	go func() {
		l, err := q.Obtain(ctx, "job", time.Minute)
		if err == nil {
			err = l.Release(ctx)
		}
		waiter <- err
	}()
	for _, c := range clients[:3] {
		require.NoError(t, c.Del(ctx, key).Err())
	}
	require.NoError(t, receive(t, waiter, 10*time.Second))
}

// A holder whose lock the majority no longer has is told: fn's ctx is
// cancelled with ErrLockLost.
func TestQuorumHolderLearnsItLostTheMajority(t *testing.T) {
	t.Parallel()
	servers, _, asNodes := nodes(t, 3)
	q, err := distlock.NewQuorum(asNodes, distlock.QuorumConfig{TTL: 600 * time.Millisecond, NodeTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close(context.Background())) })
	var cause error
	err = q.Do(t.Context(), "job", func(ctx context.Context) error {
		// Two of three nodes forget the lock.
		for _, s := range servers[:2] {
			if err := s.Restart(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(10 * time.Second):
		}
		return nil
	})
	require.ErrorIs(t, cause, contend.ErrLockLost)
	require.ErrorIs(t, err, contend.ErrLockLost)
}

// A wait that ctx ends while the nodes' calls are still out is a lost race
// and ctx's error, as every waiting guard reports it, not "no quorum": the
// nodes failed because the caller stopped waiting. Here one node answers
// "taken" and two are cut off (a blackhole: nothing forwarded, nothing
// closed), so ctx's deadline ends the attempt itself, not a backoff.
func TestQuorumWaitEndedMidAttemptIsALostRace(t *testing.T) {
	t.Parallel()
	_, clients, _ := nodes(t, 3)
	var via []redis.Scripter
	for i, c := range clients {
		if i == 0 {
			via = append(via, c)
			continue
		}
		p := faultproxy.Start(t, c.Options().Addr)
		pc := redis.NewClient(&redis.Options{Addr: p.Addr()})
		t.Cleanup(func() { pc.Close() })
		require.NoError(t, pc.Ping(t.Context()).Err())
		p.Blackhole()
		via = append(via, pc)
	}
	holder := newQuorum(t, []redis.Scripter{clients[0]})
	_, err := holder.TryObtain(t.Context(), "k", time.Minute)
	require.NoError(t, err, "the holder takes the one node that answers")

	q := newQuorum(t, via)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = q.Obtain(ctx, "k", time.Second)
	require.ErrorIs(t, err, contend.ErrConflict, "%v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// twice is a go-redis hook that sends every call of its script twice, as
// go-redis does when the first reply is lost to a read timeout: the caller
// gets the second reply.
type twice struct{ *stall }

func (tw twice) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if tw.matches(cmd) {
			_ = next(ctx, cmd)
		}
		return next(ctx, cmd)
	}
}

// A Quorum node's lock and unlock scripts give the same answer when go-redis
// sends them again after a lost reply: the lock finds its own token, the
// unlock finds its own work.
func TestQuorumScriptsSentTwiceAnswerTheSame(t *testing.T) {
	t.Parallel()
	_, prefix := testserver.Redis(t)
	node := redis.NewClient(testserver.RedisOptions(t))
	t.Cleanup(func() { _ = node.Close() })
	all := func([]any) bool { return true }
	node.AddHook(twice{newStall(distlock.QuorumLockScript, all)})
	node.AddHook(twice{newStall(distlock.QuorumUnlockScript, all)})
	q, err := distlock.NewQuorum([]redis.Scripter{node}, distlock.QuorumConfig{Prefix: prefix, NodeTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close(context.Background())) })
	l, err := q.TryObtain(t.Context(), "job", time.Minute)
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
}

// A Quorum node whose one call is stuck still answers the others: a node
// sends several calls at once, so one stuck connection does not fail it for
// every call until the stuck one times out.
func TestQuorumNodeAnswersBesideAStuckCall(t *testing.T) {
	t.Parallel()
	_, prefix := testserver.Redis(t)
	node := redis.NewClient(testserver.RedisOptions(t))
	t.Cleanup(func() { _ = node.Close() })
	stuck := newStall(distlock.QuorumLockScript, func(argv []any) bool { return arg(argv, 1, "61000") })
	node.AddHook(stuck)
	q, err := distlock.NewQuorum([]redis.Scripter{node}, distlock.QuorumConfig{Prefix: prefix, NodeTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close(context.Background())) })
	ctx := t.Context()
	go func() { _, _ = q.TryObtain(ctx, "a", 61*time.Second) }()
	receive(t, stuck.reached, 5*time.Second)
	defer stuck.open()
	l, err := q.TryObtain(ctx, "b", time.Minute)
	require.NoError(t, err, "a stuck call failed the node for the next")
	require.NoError(t, l.Release(ctx))
}
