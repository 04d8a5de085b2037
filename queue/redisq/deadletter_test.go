package redisq_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// One instance dead-letters jobs; another, which consumes nothing, pages
// through them, requeues some (the first instance handles them, in the
// order requeued, behind the jobs that were waiting) and deletes others.
// Requeue and delete find a dead letter once, however often they are
// asked; bad input changes nothing.
func testDeadLetters(t *testing.T, client redis.UniversalClient, prefix string) {
	var fixed atomic.Bool
	handled := make(chan string, 16)
	consumer := instance(t, client, prefix, redisq.Config{Partitions: 2, Retry: fast,
		Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
			if job.Key == "bad" && !fixed.Load() {
				return nil, errors.New("unknown version " + string(job.Payload))
			}
			handled <- string(job.Payload)
			return nil, nil
		}})
	operator := instance(t, client, prefix, redisq.Config{Partitions: 2})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	began := time.Now()
	for i := range 5 {
		_, err := consumer.Submit(ctx, "bad", []byte(strconv.Itoa(i)))
		require.ErrorIs(t, err, redisq.ErrRemote)
	}
	p := operator.Partition("bad")

	var all []queue.DeadLetter
	for after := ""; ; {
		page, err := operator.DeadLetters(ctx, p, after, 2)
		require.NoError(t, err)
		all = append(all, page...)
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].ID
	}
	require.Len(t, all, 5, "pages of two")
	for i, l := range all {
		require.Equal(t, queue.Job{Key: "bad", Payload: []byte(strconv.Itoa(i)), Attempt: fast.Attempts()}, l.Job)
		require.ErrorIs(t, l.Err, redisq.ErrRemote)
		require.ErrorContains(t, l.Err, "unknown version "+strconv.Itoa(i))
		require.WithinRange(t, l.At, began.Add(-time.Second), time.Now().Add(time.Second), "Redis's clock is this machine's")
		if i > 0 {
			require.False(t, l.At.Before(all[i-1].At))
		}
	}
	none, err := operator.DeadLetters(ctx, 1-p, "", 0)
	require.NoError(t, err)
	require.Empty(t, none, "the other partition has none")

	// Bad input: an error matching ErrInvalid, and nothing changes.
	for name, call := range map[string]func() error{
		"partition":    func() error { _, err := operator.DeadLetters(ctx, 2, "", 0); return err },
		"negative":     func() error { _, err := operator.DeadLetters(ctx, -1, "", 0); return err },
		"count":        func() error { _, err := operator.DeadLetters(ctx, p, "", 1001); return err },
		"after":        func() error { _, err := operator.DeadLetters(ctx, p, "x", 0); return err },
		"requeue id":   func() error { _, err := operator.RequeueDeadLetters(ctx, p, all[0].ID, "1-x"); return err },
		"delete id":    func() error { _, err := operator.DeleteDeadLetters(ctx, p, all[0].ID, "+1-0"); return err },
		"delete where": func() error { _, err := operator.DeleteDeadLetters(ctx, 2, all[0].ID); return err },
		"too many":     func() error { _, err := operator.RequeueDeadLetters(ctx, p, make([]string, 1001)...); return err },
	} {
		require.ErrorIs(t, call(), contend.ErrInvalid, name)
	}
	still, err := operator.DeadLetters(ctx, p, "", 0)
	require.NoError(t, err)
	require.Equal(t, all, still, "bad input changed the dead letters")

	// Requeued after the fix, 3 before 1, behind a job that was waiting.
	fixed.Store(true)
	require.NoError(t, operator.Enqueue(ctx, "bad", []byte("waiting")))
	n, err := operator.RequeueDeadLetters(ctx, p, all[3].ID, all[1].ID)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for _, want := range []string{"waiting", "3", "1"} {
		select {
		case got := <-handled:
			require.Equal(t, want, got)
		case <-ctx.Done():
			t.Fatalf("%s was not handled", want)
		}
	}
	n, err = operator.RequeueDeadLetters(ctx, p, all[3].ID, all[1].ID)
	require.NoError(t, err)
	require.Zero(t, n, "a dead letter is requeued once")

	n, err = operator.DeleteDeadLetters(ctx, p, all[0].ID, all[1].ID, all[4].ID)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the one requeued is gone already")
	n, err = operator.DeleteDeadLetters(ctx, p, all[0].ID)
	require.NoError(t, err)
	require.Zero(t, n)
	left, err := operator.DeadLetters(ctx, p, "", 0)
	require.NoError(t, err)
	require.Equal(t, []queue.DeadLetter{all[2]}, left)
	waitDepth(t, operator, 0)
	select {
	case got := <-handled:
		t.Fatalf("%s handled again", got)
	default:
	}
}
