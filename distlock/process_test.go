package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

// The variables that make this test binary a holder process.
const (
	holderPrefixEnv = "DISTLOCK_TEST_HOLDER_PREFIX"
	holderURLEnv    = "DISTLOCK_TEST_HOLDER_URL"
	holderTTL       = 600 * time.Millisecond
)

// fencedWrite is a resource in Redis that checks fencing tokens: it takes
// a write (appending writer to the log) only with a token at least as
// large as every one it has taken.
var fencedWrite = redis.NewScript(`
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < last then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1`)

func write(ctx context.Context, rdb *redis.Client, prefix string, fence int64, writer string) (bool, error) {
	n, err := fencedWrite.Run(ctx, rdb, []string{prefix + "last", prefix + "log"}, fence, writer).Int()
	return n == 1, err
}

// TestHolderProcess is the holder that the process tests below start as a
// separate OS process, then kill or stop; run alone it does nothing. It
// takes the lock and writes to the fenced resource every few milliseconds
// until its ctx ends, then reports why.
func TestHolderProcess(t *testing.T) {
	prefix := os.Getenv(holderPrefixEnv)
	if prefix == "" {
		t.Skip("the holder process of the kill and stop tests")
	}
	opts, err := redis.ParseURL(os.Getenv(holderURLEnv))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	c, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix, TTL: holderTTL})
	require.NoError(t, err)
	ctx := context.Background()
	err = c.Do(ctx, "job", func(ctx context.Context) error {
		l, _ := distlock.FromContext(ctx)
		fmt.Printf("held %d\n", l.Fence())
		for i := 0; ; i++ {
			if ctx.Err() != nil {
				fmt.Printf("told %v\n", context.Cause(ctx))
				return nil
			}
			// The write of a holder that does not look at its ctx in time:
			// only the fencing token can stop it.
			if _, err := write(context.WithoutCancel(ctx), rdb, prefix, l.Fence(), "holder:"+strconv.Itoa(i)); err != nil {
				return err
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	fmt.Printf("done %v\n", err)
}

// holder starts the holder process and waits until it holds the lock; it
// returns the process and the lock's fencing token.
func holder(t *testing.T, prefix string) (*harness.Child, int64) {
	url, err := testserver.RedisURL()
	require.NoError(t, err)
	h := harness.StartChild(t, "TestHolderProcess", holderPrefixEnv+"="+prefix, holderURLEnv+"="+url)
	fence, err := strconv.ParseInt(h.Next(t, "held ", 10*time.Second), 10, 64)
	require.NoError(t, err)
	return h, fence
}

// kill -9 of the holder: nothing releases its lock, which blocks the key
// until its lease runs out, and no longer; the next holder's fencing token
// is larger.
func TestKilledHolderBlocksTheKeyForItsLeaseOnly(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{Recheck: 20 * time.Millisecond})
	h, fence := holder(t, prefix)
	require.NoError(t, h.Cmd.Process.Kill())
	killed := time.Now()

	// A plain poll of the lock's key, beside the Obtain, on the same
	// machine: when it sees the key gone is when the lease ended for
	// anyone, however loaded the machine (and Redis) is.
	gone := make(chan time.Duration, 1)
	go func() {
		for rdb.Exists(context.WithoutCancel(t.Context()), lockKey(prefix, "job")).Val() == 1 && time.Since(killed) < 5*time.Second {
			time.Sleep(5 * time.Millisecond)
		}
		gone <- time.Since(killed)
	}()
	l, err := c.Obtain(t.Context(), "job", time.Second)
	require.NoError(t, err)
	waited := time.Since(killed)
	require.Greater(t, l.Fence(), fence)
	require.NoError(t, l.Release(t.Context()))
	freed := <-gone
	t.Logf("obtained %v after the kill, a plain poll saw the key gone after %v (lease %v)", waited.Round(time.Millisecond), freed.Round(time.Millisecond), holderTTL)
	require.Less(t, freed, holderTTL+500*time.Millisecond, "the dead holder's lock outlived its lease in Redis")
	require.Less(t, waited, freed+500*time.Millisecond, "the Obtain waited on past the moment the dead holder's lease ended")
}

// SIGSTOP of the holder past its lease, as a long GC pause or a frozen VM
// does: another process takes the key and writes; when the holder resumes,
// its fn's ctx is cancelled with ErrLockLost by the timer, whatever it was
// doing, and the writes it makes before it looks are refused by the fenced
// resource: after the new holder's first write, none of the old holder's
// is taken.
func TestStoppedHolderIsFencedOff(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{Recheck: 20 * time.Millisecond})
	h, fence := holder(t, prefix)
	cmd := h.Cmd
	time.Sleep(50 * time.Millisecond) // a few writes under the lease
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGCONT) })

	err := c.Do(t.Context(), "job", func(ctx context.Context) error {
		l, _ := distlock.FromContext(ctx)
		if l.Fence() <= fence {
			return errors.New("the new holder's fencing token is not larger")
		}
		applied, err := write(ctx, rdb, prefix, l.Fence(), "other")
		if err == nil && !applied {
			err = errors.New("the new holder's write was refused")
		}
		return err
	})
	require.NoError(t, err)
	taken := time.Since(stopped)
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	resumed := time.Now()

	told := h.Next(t, "told ", 10*time.Second)
	require.Contains(t, told, contend.ErrLockLost.Error())
	require.Contains(t, h.Next(t, "done ", 10*time.Second), contend.ErrLockLost.Error())
	log, err := rdb.LRange(t.Context(), prefix+"log", 0, -1).Result()
	require.NoError(t, err)
	i := slices.Index(log, "other")
	require.GreaterOrEqual(t, i, 0, "the new holder's write is not in the log")
	require.Len(t, log, i+1, "the old holder's writes after the new holder's were taken: %v", log[i:])
	t.Logf("another process took the key %v after the stop; the old holder, resumed, was told within %v; its %d writes before were taken, none after",
		taken.Round(time.Millisecond), time.Since(resumed).Round(time.Millisecond), i)
}
