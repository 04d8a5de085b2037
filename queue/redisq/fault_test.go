package redisq_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// The fault tests put a real go-redis client behind a fault proxy (or use a
// Redis of the test's own that it restarts) and check what callers see and
// what still holds. Their names start with TestFault.

// behind returns a client, with opts, of client's server through a fault
// proxy.
func behind(t testing.TB, client *redis.Client, opts redis.Options) (*faultproxy.Proxy, *redis.Client) {
	t.Helper()
	proxy := faultproxy.Start(t, client.Options().Addr)
	opts.Addr = proxy.Addr()
	via := redis.NewClient(&opts)
	t.Cleanup(func() { via.Close() })
	return proxy, via
}

// A handling is one delivery as a fault test's handler records it.
type handling struct {
	who, payload string
	fence        int64
	at           time.Time
	cause        error // set when the handler was cut short
}

// next returns the next handling within d.
func next(t testing.TB, ch <-chan handling, d time.Duration) handling {
	t.Helper()
	select {
	case h := <-ch:
		return h
	case <-time.After(d):
		t.Fatalf("no job handled within %v", d)
		return handling{}
	}
}

// recorder is a handler that records each delivery on ch; when block is
// set, the first delivery of "block" waits until its ctx ends.
func recorder(who string, ch chan<- handling, block bool) queue.Handler {
	return func(ctx context.Context, job queue.Job) ([]byte, error) {
		fence, _ := redisq.Fence(ctx)
		ch <- handling{who: who, payload: string(job.Payload), fence: fence, at: time.Now()}
		if block && string(job.Payload) == "block" && job.Attempt == 1 {
			<-ctx.Done()
			ch <- handling{who: who, payload: "cut short", fence: fence, at: time.Now(), cause: context.Cause(ctx)}
			return nil, ctx.Err()
		}
		return job.Payload, nil
	}
}

// The partition owner's connections go silent (a partition, a frozen
// link) past its lease, with go-redis's default timeouts: the owner's
// handler sees its ctx end with ErrLockLost within the lease, on a timer,
// before another instance can take the partition; the other instance then
// redelivers the interrupted job under a larger fencing token, and the
// later ones in order; the silent owner handles nothing more.
func TestFaultBlackholePastLease(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	proxy, via := behind(t, client, redis.Options{})
	const ttl = 600 * time.Millisecond
	got := make(chan handling, 16)
	instance(t, via, prefix, redisq.Config{Partitions: 1, LeaseTTL: ttl, Handler: recorder("owner", got, true)})
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	for _, p := range []string{"block", "after"} {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(p)))
	}
	first := next(t, got, 10*time.Second)
	require.Equal(t, handling{who: "owner", payload: "block"}, handling{who: first.who, payload: first.payload})

	proxy.Blackhole()
	silent := time.Now()
	instance(t, client, prefix, redisq.Config{Partitions: 1, LeaseTTL: ttl, Handler: recorder("other", got, false)})
	stopped := next(t, got, 5*time.Second)
	require.Equal(t, "owner", stopped.who)
	require.ErrorIs(t, stopped.cause, contend.ErrLockLost)
	t.Logf("the owner's handler was stopped %v after its connections went silent (lease %v)", stopped.at.Sub(silent), ttl)
	require.Less(t, stopped.at.Sub(silent), ttl+200*time.Millisecond, "the owner learned of the loss after its lease")

	again := next(t, got, 5*time.Second)
	require.Equal(t, "other", again.who, "the silent owner handled a job after its lease")
	require.Equal(t, "block", again.payload, "the interrupted job comes first")
	require.True(t, again.at.After(stopped.at), "the next owner started before the silent one stopped")
	require.Greater(t, again.fence, first.fence)
	after := next(t, got, 5*time.Second)
	require.Equal(t, handling{who: "other", payload: "after"}, handling{who: after.who, payload: after.payload})
	proxy.Heal()
	proxy.Reset() // what the blackhole cut off: the owner's client reconnects
	select {
	case h := <-got:
		t.Fatalf("unexpected delivery after the hand-over: %+v", h)
	case <-time.After(2 * ttl):
	}
}

// Every connection of the owner is reset while its handler runs: go-redis
// reconnects, the lease is kept (its refresh is sent again, and is safe to
// run twice), and the job is answered once; the next one follows.
func TestFaultResetMidJob(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	proxy, via := behind(t, client, redis.Options{})
	var runs atomic.Int32
	entered, proceed := make(chan struct{}), make(chan struct{})
	instance(t, via, prefix, redisq.Config{Partitions: 1, LeaseTTL: time.Second, Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
		if string(job.Payload) == "reset" && runs.Add(1) == 1 {
			close(entered)
			<-proceed
		}
		return job.Payload, nil
	}})
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	answer := make(chan error, 1)
	go func() {
		v, err := producer.Submit(ctx, "k", []byte("reset"))
		if err == nil && string(v) != "reset" {
			err = fmt.Errorf("answer %q", v)
		}
		answer <- err
	}()
	<-entered
	proxy.Reset()
	close(proceed)
	require.NoError(t, <-answer)
	v, err := producer.Submit(ctx, "k", []byte("next"))
	require.NoError(t, err)
	require.Equal(t, "next", string(v))
	require.EqualValues(t, 1, runs.Load(), "the job ran again after a reset")
}

// A reply is lost after Redis ran the command, and go-redis sends the
// command again. On the producer's side the command is the XADD: the job is
// in the stream twice and runs twice (at least once), and the submitter
// takes the first of its two answers. On the owner's side it is the answer,
// the acknowledgement or a lease refresh, whichever comes next after the
// handler: each is safe to run twice, and the job runs once. Either way
// every submitter is answered and nothing stays pending.
func TestFaultReplyDropped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		onOwner bool
		runs    int32
	}{
		{"submit", false, 2},
		{"ack", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			client, prefix := testserver.Redis(t)
			// go-redis sends a command again when its reply is later than
			// ReadTimeout: on a loaded machine 300ms could take a slow reply
			// for a lost one, and add the job whose reply was lost a third
			// time. The lease outlasts a refresh sent twice.
			proxy, via := behind(t, client, redis.Options{ReadTimeout: time.Second})
			owner, submitter := redis.UniversalClient(client), redis.UniversalClient(via)
			if tc.onOwner {
				owner, submitter = via, client
			}
			var runs atomic.Int32
			instance(t, owner, prefix, redisq.Config{Partitions: 1, LeaseTTL: 3 * time.Second, Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
				if string(job.Payload) == "dropped" {
					runs.Add(1)
					if tc.onOwner {
						proxy.DropNextReply()
					}
				}
				return job.Payload, nil
			}})
			producer := instance(t, submitter, prefix, redisq.Config{Partitions: 1})
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			// Connections made and the answer listener started first: the
			// reply dropped is a command's, not a handshake's.
			_, err := producer.Submit(ctx, "k", []byte("warm up"))
			require.NoError(t, err)
			if !tc.onOwner {
				// The XADD's reply: the answer listener's blocking read,
				// answered on another connection, may reach the proxy first.
				proxy.DropReplyTo("XADD")
			}
			for _, payload := range []string{"dropped", "later", "later"} {
				v, err := producer.Submit(ctx, "k", []byte(payload))
				require.NoError(t, err, payload)
				require.Equal(t, payload, string(v))
			}
			waitDepth(t, producer, 0)
			require.EqualValues(t, tc.runs, runs.Load(), "runs of the job whose reply was lost")
		})
	}
}

// Redis restarts without persistence while a job runs: every key is gone,
// so the jobs not yet handled are lost and their submitters hear nothing
// (their ctx ends); the owner's handler sees ErrLockLost; the queue
// recovers by itself: a later Submit is answered, under a larger fencing
// token.
func TestFaultRedisRestart(t *testing.T) {
	t.Parallel()
	own := testserver.OwnRedis(t)
	client := own.Client(t)
	const prefix, ttl = "q:", 600 * time.Millisecond
	got := make(chan handling, 16)
	instance(t, client, prefix, redisq.Config{Partitions: 1, LeaseTTL: ttl, Handler: recorder("owner", got, true)})
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	lost := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err := producer.Submit(ctx, "k", []byte("block"))
		lost <- err
	}()
	first := next(t, got, 10*time.Second)
	require.Equal(t, "block", first.payload)
	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("queued")))

	require.NoError(t, own.Restart())
	stopped := next(t, got, 5*time.Second)
	require.ErrorIs(t, stopped.cause, contend.ErrLockLost)
	require.ErrorIs(t, <-lost, context.DeadlineExceeded, "the submitter of a job lost with Redis hears nothing")

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	v, err := producer.Submit(ctx, "k", []byte("after"))
	require.NoError(t, err, "the queue did not recover from the restart")
	require.Equal(t, "after", string(v))
	after := next(t, got, time.Second)
	require.Equal(t, "after", after.payload, "the jobs in Redis at the restart are gone")
	require.Greater(t, after.fence, first.fence)
}

// A master of a Cluster with replicas is killed while it holds a
// partition's lease, with a job running under it: the owner's handler sees
// ErrLockLost when the lease's validity passes, on its timer, whatever the
// calls to the dead master do; once a replica has taken over, the
// partition is taken again (the replica had the lease and the stream: the
// test waits for the copy, as WAIT would), the interrupted job is
// redelivered under a larger fencing token, the later ones follow in
// order, and Submit works again.
func TestFaultClusterMasterStopped(t *testing.T) {
	t.Parallel()
	cl := testserver.StartCluster(t, testserver.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	prefix := testserver.ClusterPrefix(t, cl.Client)
	const ttl = time.Second
	got := make(chan handling, 16)
	instance(t, cl.Client, prefix, redisq.Config{Partitions: 1, LeaseTTL: ttl, Handler: recorder("owner", got, true)})
	producer := instance(t, cl.Client, prefix, redisq.Config{Partitions: 1})
	for _, p := range []string{"block", "after"} {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(p)))
	}
	first := next(t, got, 10*time.Second)
	require.Equal(t, "block", first.payload)

	ctx := t.Context()
	master, err := cl.Client.MasterForKey(ctx, prefix+"lease:{partition:0}")
	require.NoError(t, err)
	stream, err := cl.Client.MasterForKey(ctx, prefix+"{0}")
	require.NoError(t, err)
	for _, m := range []*redis.Client{master, stream} {
		n, err := m.Wait(ctx, 1, 5*time.Second).Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the replica did not get the lease and the stream")
	}
	crashed := time.Now()
	require.NoError(t, cl.Node(master.Options().Addr).Kill())
	t.Logf("killed the lease's master; the stream's is %s", map[bool]string{true: "the same", false: "another"}[stream.Options().Addr == master.Options().Addr])

	stopped := next(t, got, 5*time.Second)
	require.ErrorIs(t, stopped.cause, contend.ErrLockLost)
	require.Less(t, stopped.at.Sub(crashed), ttl+200*time.Millisecond, "the owner learned of the loss after its lease")
	again := next(t, got, 20*time.Second)
	require.Equal(t, "block", again.payload, "the interrupted job comes first")
	require.Greater(t, again.fence, first.fence)
	// The job may come back once more, or more, before "after": the
	// cluster is still settling when the owner handles it again, and an
	// acknowledgement that fails then (a node not yet out of its
	// CLUSTERDOWN state, a slot map reloaded from a node that has not yet
	// heard of the failover and still names the dead master), or a lease
	// lost before it, leaves the job pending; the instance takes the
	// partition again and redelivers it, still first. That is delivery at
	// least once, as the package doc says, not a fault of the hand-over.
	h := next(t, got, 10*time.Second)
	for h.payload == "block" {
		require.GreaterOrEqual(t, h.fence, again.fence)
		t.Logf("the job came back once more, under fence %d", h.fence)
		h = next(t, got, 10*time.Second)
	}
	require.Equal(t, "after", h.payload)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := producer.Submit(sctx, "k", []byte("post"))
	require.NoError(t, err)
	require.Equal(t, "post", string(v))
	t.Logf("lease lost %v after the crash, the job redelivered %v after it", stopped.at.Sub(crashed).Round(time.Millisecond), again.at.Sub(crashed).Round(time.Millisecond))
}

// readsThrough is a go-redis hook that sends its client's stream reads
// (XREADGROUP, alone or in a pipeline) through other, and everything else
// on the client's own connections: go-redis picks a pooled connection for
// each command, and the test must delay the reads' connection alone, as a
// retransmission holds up one TCP connection while the others flow. Each
// read sent is signalled on sent, when it has room.
type readsThrough struct {
	other *redis.Client
	sent  chan<- struct{}
}

func (readsThrough) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h readsThrough) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "xreadgroup" {
			return next(ctx, cmd)
		}
		h.signal()
		return h.other.Process(ctx, cmd)
	}
}

func (h readsThrough) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "xreadgroup" }) {
			return next(ctx, cmds)
		}
		h.signal()
		_, err := h.other.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range cmds {
				_ = p.Process(ctx, c)
			}
			return nil
		})
		return err
	}
}

func (h readsThrough) signal() {
	select {
	case h.sent <- struct{}{}:
	default:
	}
}

// An old owner's read, sent while its lease was valid, reaches Redis late:
// after its lease ran out, after the next owner took the partition and
// claimed what was pending, while that owner is inside a handler. The read
// takes the jobs that waited meanwhile onto the old owner's pending list.
// The new owner reclaims them and handles them, in order, before the jobs
// that came after them: none is lost to its trim.
func TestFaultLateReadOfOldOwner(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	const ttl, late = 600 * time.Millisecond, 4 * time.Second
	lease, oldClient := behind(t, client, redis.Options{})
	reads, readClient := behind(t, client, redis.Options{ReadTimeout: 30 * time.Second})
	sent := make(chan struct{}, 1)
	oldClient.AddHook(readsThrough{other: readClient, sent: sent})

	oldGot, newGot := make(chan handling, 16), make(chan handling, 16)
	gate, hold := make(chan struct{}), make(chan struct{})
	blocking := func(who string, got chan<- handling, payload string, until <-chan struct{}) queue.Handler {
		return func(ctx context.Context, job queue.Job) ([]byte, error) {
			got <- handling{who: who, payload: string(job.Payload)}
			if string(job.Payload) == payload {
				select {
				case <-until:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return nil, nil
		}
	}
	old := instance(t, oldClient, prefix, redisq.Config{Partitions: 1, LeaseTTL: ttl, Handler: blocking("old", oldGot, "gate", gate)})
	t.Cleanup(func() { // before old closes, whatever the test's end
		lease.Heal()
		lease.Reset() // what the blackhole cut off: the old owner's client reconnects
		reads.Heal()
	})
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	require.Eventually(t, func() bool { return len(old.Owned()) == 1 }, 10*time.Second, time.Millisecond)
	successor := instance(t, client, prefix, redisq.Config{Partitions: 1, LeaseTTL: ttl, Handler: blocking("new", newGot, "hold", hold)})

	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("gate")))
	require.Equal(t, "gate", next(t, oldGot, 10*time.Second).payload)
	select { // reads sent before the gate
	case <-sent:
	default:
	}
	reads.SetLatency(late)
	close(gate)
	<-sent // the old owner's next read is on its way, and takes late to arrive
	lease.Blackhole()
	readSent := time.Now()

	require.Eventually(t, func() bool { return len(successor.Owned()) == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("hold")))
	require.Equal(t, "hold", next(t, newGot, 10*time.Second).payload)
	for _, p := range []string{"a", "b", "c"} {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(p)))
	}
	require.Less(t, time.Since(readSent), late, "the read arrived before the jobs it was to take: too slow a machine")
	// The late read arrives and takes a, b and c: the successor holds hold.
	stream := prefix + "{0}"
	require.Eventually(t, func() bool {
		s, err := client.XPending(t.Context(), stream, "workers").Result()
		return err == nil && s.Count == 4 && len(s.Consumers) == 2
	}, 2*late, time.Millisecond, "the old owner's late read took nothing")

	close(hold)
	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("d")))
	handled := []string{"hold"}
	for handled[len(handled)-1] != "d" {
		select {
		case h := <-newGot:
			handled = append(handled, h.payload)
		case <-time.After(10 * time.Second):
			t.Fatalf("the successor handled %v, and not d", handled)
		}
	}
	require.Equal(t, []string{"hold", "a", "b", "c", "d"}, handled, "jobs lost or out of order")
	waitDepth(t, producer, 0)
	require.Empty(t, oldGot, "the old owner handled a job after its lease")
}

// The reply to an owner's read is lost after Redis ran it, with jobs in it:
// go-redis sends the read again after its ReadTimeout, and the jobs the
// first read took are pending on the owner without its knowing. It sees
// them on its next read, and delivers them, in order, before anything
// after them.
func TestFaultReadReplyLost(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	const timeout = 500 * time.Millisecond
	proxy, via := behind(t, client, redis.Options{ReadTimeout: timeout})
	got := make(chan string, 16)
	gate := make(chan struct{})
	instance(t, via, prefix, redisq.Config{Partitions: 1, Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
		got <- string(job.Payload)
		if string(job.Payload) == "gate" {
			<-gate
		}
		return nil, nil
	}})
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("gate")))
	require.Equal(t, "gate", <-got)
	for _, p := range []string{"1", "2"} {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(p)))
	}
	proxy.DropReplyTo("XREADGROUP") // the owner's next read: it takes 1 and 2
	close(gate)
	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("3")))
	var handled []string
	for len(handled) < 3 {
		select {
		case p := <-got:
			handled = append(handled, p)
		case <-time.After(5 * time.Second):
			t.Fatalf("handled %v", handled)
		}
	}
	require.Equal(t, []string{"1", "2", "3"}, handled)
	waitDepth(t, producer, 0)
}
