package redisq_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// The variables that make this test binary a consumer process.
const (
	childPrefixEnv = "REDISQ_TEST_CONSUMER_PREFIX"
	childURLEnv    = "REDISQ_TEST_CONSUMER_URL"
	// killTTL is the consumers' lease: a second, so that a refresh late on
	// a loaded machine does not lose it (and repeat a job) before the kill.
	killTTL = time.Second
)

// TestConsumerProcess is the consumer that TestKillConsumerMidJob starts as a
// separate OS process and kills; run alone it does nothing.
func TestConsumerProcess(t *testing.T) {
	prefix := os.Getenv(childPrefixEnv)
	if prefix == "" {
		t.Skip("the consumer process of TestKillConsumerMidJob")
	}
	opts, err := redis.ParseURL(os.Getenv(childURLEnv))
	require.NoError(t, err)
	client := redis.NewClient(opts)
	defer client.Close()
	q, err := redisq.New(client, redisq.Config{Prefix: prefix, Partitions: 1, LeaseTTL: killTTL,
		Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
			if string(job.Payload) == "block" {
				// Tell the test we are mid-job, and stay here until killed.
				client.LPush(ctx, prefix+"started", "1")
				<-ctx.Done()
				// Reached when the process was stopped past its lease and
				// resumed: why the handler was stopped.
				cause := context.Cause(ctx).Error()
				if errors.Is(context.Cause(ctx), contend.ErrLockLost) {
					cause = "lost"
				}
				client.RPush(context.WithoutCancel(ctx), prefix+"stopped", cause)
				return nil, ctx.Err()
			}
			return nil, client.RPush(ctx, prefix+"handled", "child:"+string(job.Payload)).Err()
		}})
	require.NoError(t, err)
	_ = q.Run(context.Background()) // until killed
}

// kill -9 of a consumer mid-job: its partition moves to a live instance
// within about one lease, the job it was running is redelivered first, the
// later jobs follow in order, and nothing is lost.
func TestKillConsumerMidJob(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	cmd := midJobConsumer(t, client, prefix)
	require.NoError(t, cmd.Process.Kill()) // SIGKILL: no release, no ack
	killed := time.Now()
	moved := takeOver(t, client, prefix, killed)
	t.Logf("the blocking job was redelivered %v after the kill (lease %v)", moved, killTTL)
	require.Less(t, moved, 3*killTTL+time.Second, "the partition took far longer than a lease to move")
}

// midJobConsumer starts the consumer process, enqueues jobs 0, 1, block, 3
// and 4 and returns once the process has handled 0 and 1 and is inside
// block.
func midJobConsumer(t *testing.T, client *redis.Client, prefix string) *exec.Cmd {
	t.Helper()
	url, err := testserver.RedisURL()
	require.NoError(t, err)
	cmd := harness.StartChild(t, "TestConsumerProcess", childPrefixEnv+"="+prefix, childURLEnv+"="+url).Cmd

	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	for _, p := range []string{"0", "1", "block", "3", "4"} {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(p)))
	}
	_, err = client.BLPop(t.Context(), 20*time.Second, prefix+"started").Result()
	require.NoError(t, err, "the consumer process never reached the blocking job")
	return cmd
}

// takeOver starts a live consumer and checks that it redelivers the job the
// consumer process was in, then the later ones, in order; it returns how
// long after since the redelivery came.
func takeOver(t *testing.T, client *redis.Client, prefix string, since time.Time) time.Duration {
	t.Helper()
	instance(t, client, prefix, redisq.Config{Partitions: 1, LeaseTTL: killTTL, Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
		return nil, client.RPush(ctx, prefix+"handled", "live:"+string(job.Payload)).Err()
	}})
	var (
		handled []string
		moved   time.Duration
	)
	// Each job comes within what the test allows the partition to move in
	// (TestKillConsumerMidJob), the later ones sooner: a job that does not
	// come by then will not.
	within := 3*killTTL + 2*time.Second
	for len(handled) < 5 {
		res, err := client.BLPop(t.Context(), within, prefix+"handled").Result()
		require.NoError(t, err, "no job handled within %v of the last: the job the stopped consumer was in, or a later one, "+
			"was lost (acknowledged before it was handled?), or the partition never moved; handled so far: %v", within, handled)
		handled = append(handled, res[1])
		if len(handled) == 3 {
			moved = time.Since(since)
		}
	}
	require.Equal(t, []string{"child:0", "child:1", "live:block", "live:3", "live:4"}, handled)
	return moved
}

// SIGSTOP of a consumer mid-job, past its lease: its partition moves as if
// it had died; when it resumes, its handler's ctx has ended with
// ErrLockLost (its timer ran out while it was stopped) and it handles
// nothing more.
func TestFaultStopPastLease(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	cmd := midJobConsumer(t, client, prefix)
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	takeOver(t, client, prefix, time.Now())
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	res, err := client.BLPop(t.Context(), 10*time.Second, prefix+"stopped").Result()
	require.NoError(t, err, "the resumed consumer's handler was never stopped")
	require.Equal(t, "lost", res[1], "why the resumed consumer's handler was stopped")
	left, err := client.BLPop(t.Context(), 2*killTTL, prefix+"handled").Result()
	require.ErrorIs(t, err, redis.Nil, "the resumed consumer handled %v", left)
}

// A worker whose lease is lost mid-job sees its handler's ctx cancelled with
// contend.ErrLockLost and starts no further job under the lost lease; the
// partition is taken again (here by the same instance, under a new fencing
// token) and the interrupted job is redelivered before the next.
func TestLostLeaseStopsBeforeNextJob(t *testing.T) {
	t.Parallel()
	client, prefix := testserver.Redis(t)
	type delivery struct {
		payload string
		fence   int64
		cause   error
	}
	got := make(chan delivery, 8)
	entered := make(chan struct{}, 1)
	first := true
	instance(t, client, prefix, redisq.Config{Partitions: 1, Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
		fence, _ := redisq.Fence(ctx)
		if string(job.Payload) == "block" && first {
			first = false // only this partition's worker touches it
			entered <- struct{}{}
			<-ctx.Done()
			got <- delivery{"block", fence, context.Cause(ctx)}
			return nil, ctx.Err()
		}
		got <- delivery{string(job.Payload), fence, nil}
		return nil, nil
	}})
	producer := instance(t, client, prefix, redisq.Config{Partitions: 1})
	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("block")))
	require.NoError(t, producer.Enqueue(t.Context(), "k", []byte("next")))
	<-entered
	// Take the lease away, as an expiry during a stall would.
	require.NoError(t, client.Del(t.Context(), prefix+"lease:{partition:0}").Err())

	d := <-got
	require.Equal(t, "block", d.payload)
	require.ErrorIs(t, d.cause, contend.ErrLockLost)
	again := <-got
	require.Equal(t, "block", again.payload, "the interrupted job comes back before the next one")
	require.Greater(t, again.fence, d.fence, "the new lease has a larger fencing token")
	require.Equal(t, "next", (<-got).payload)
}
