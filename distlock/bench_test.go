package distlock_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/token"
)

// Benchmarks pair the library with `raw`, the bare commands through
// go-redis, in the same run: BenchmarkObtainRelease/raw/uncontended/workers=8
// beside BenchmarkObtainRelease/distlock/uncontended/workers=8, so
// examples/benchratio shows the overhead as a ratio. One op is one
// acquisition and its release.
//
//   - uncontended: every worker locks a key of its own; raw is SET NX PX
//     and the compare-and-delete script by EVALSHA. Beside them, script
//     obtains as a fenced lock whose counters expire must, by EVALSHA of
//     SET NX PX, INCR of the fencing counter and PEXPIRE of it, with nothing
//     else: the part of distlock's ratio that the fencing script costs on
//     that machine, and no library can win back.
//     Beside script, bounded is the same with the release's deadline kept
//     as any lock must keep it on a go-redis client that ignores ctx
//     deadlines (the default): the call runs on a goroutine of its own
//     while the caller waits for it or for the deadline, whichever comes
//     first. It is the floor of distlock on such a client; ctxtimeout is
//     distlock on a client built with ContextTimeoutEnabled, whose calls
//     stay on the caller's goroutine.
//     And do is Client.Do around nothing: the managed hold's watchdog on top
//     of distlock's obtain and release.
//   - hotkey: every worker locks the same key; raw is the loop of the
//     popular libraries, SET NX PX retried every millisecond. Beside it,
//     script is the floor of a hand-over in order: one EVALSHA per
//     acquisition, taken in turn under a process-local mutex (see
//     handOverLocker). Each reports its p99 wait for the lock (p99-ns) and
//     how unevenly the workers were served: the most acquisitions of a
//     worker over the fewest (max/min).
//
// Every benchmark also reports the CPU time each op cost this process
// (cpu-ns/op) and Redis (redis-cpu-ns/op, from INFO cpu), so that a ratio
// that moves can be traced to the side that spent it: on a machine whose
// cores the benchmark, its Redis client and Redis share, throughput is
// bound by the sum, not by the round trip.

const benchTTL = 10 * time.Second

// rawRelease is the compare-and-delete every Redis lock releases with.
var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// A locker obtains and releases key once; it returns how long it waited.
type locker func(ctx context.Context, key string) (time.Duration, error)

func rawLocker(_ *testing.B, rdb *redis.Client, prefix string) locker {
	return func(ctx context.Context, key string) (time.Duration, error) {
		key = prefix + key
		tok := token.New()
		began := time.Now()
		for {
			ok, err := rdb.SetNX(ctx, key, tok, benchTTL).Result()
			if err != nil {
				return 0, err
			}
			if ok {
				break
			}
			time.Sleep(time.Millisecond)
		}
		waited := time.Since(began)
		return waited, rawRelease.Run(ctx, rdb, []string{key}, tok).Err()
	}
}

// fencedTake is SET NX PX and, if it was set, the next fencing token, whose
// counter lives a day after its last use.
var fencedTake = redis.NewScript(`if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local f = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], 86400000)
return f`)

func scriptLocker(_ *testing.B, rdb *redis.Client, prefix string) locker {
	return fencedLocker(rdb, prefix, func(ctx context.Context, key, tok string) error {
		return rawRelease.Run(ctx, rdb, []string{key}, tok).Err()
	})
}

// boundedLocker is scriptLocker with its release bounded by a timer: the
// release runs on a goroutine, and the caller returns when it is done or
// when the deadline passes.
func boundedLocker(_ *testing.B, rdb *redis.Client, prefix string) locker {
	return fencedLocker(rdb, prefix, func(ctx context.Context, key, tok string) error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- rawRelease.Run(rctx, rdb, []string{key}, tok).Err() }()
		select {
		case err := <-done:
			return err
		case <-rctx.Done():
			return rctx.Err()
		}
	})
}

// fencedLocker obtains by fencedTake and lets go with release.
func fencedLocker(rdb *redis.Client, prefix string, release func(ctx context.Context, key, tok string) error) locker {
	return func(ctx context.Context, key string) (time.Duration, error) {
		key = prefix + "{" + key + "}"
		tok := token.New()
		began := time.Now()
		fence, err := fencedTake.Run(ctx, rdb, []string{key, key + ":fence"}, tok, benchTTL.Milliseconds()).Int64()
		if err != nil {
			return 0, err
		}
		if fence == 0 {
			return 0, fmt.Errorf("%s is held", key)
		}
		waited := time.Since(began)
		return waited, release(ctx, key, tok)
	}
}

// ctxTimeoutLocker is distlockLocker on a client that honours ctx
// deadlines.
func ctxTimeoutLocker(b *testing.B, rdb *redis.Client, prefix string) locker {
	opts := testserver.RedisOptions(b)
	opts.Addr = rdb.Options().Addr
	opts.ContextTimeoutEnabled = true
	honouring := redis.NewClient(opts)
	b.Cleanup(func() { honouring.Close() })
	return distlockLocker(b, honouring, prefix)
}

// fencedPass hands the lock from the holder's token (or from nobody) to the
// next one's, and returns the next fencing token: pass.lua without the
// queue's mark.
var fencedPass = redis.NewScript(`local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
local f = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], 86400000)
return f`)

// handOverLocker is the floor of an in-order, fenced hand-over: the
// workers line up on a process-local mutex, and each takes the key from the
// one before it with one EVALSHA that moves the token and the fencing
// counter. One serial round trip per acquisition, with no library: every
// lock that confirms each new holder in Redis pays it.
func handOverLocker(_ *testing.B, rdb *redis.Client, prefix string) locker {
	var (
		mu     sync.Mutex
		holder string // the token in Redis; guarded by mu
	)
	return func(ctx context.Context, key string) (time.Duration, error) {
		key = prefix + "{" + key + "}"
		tok := token.New()
		began := time.Now()
		mu.Lock()
		defer mu.Unlock()
		fence, err := fencedPass.Run(ctx, rdb, []string{key, key + ":fence"}, holder, tok, benchTTL.Milliseconds()).Int64()
		if err != nil {
			return 0, err
		}
		if fence == 0 {
			return 0, fmt.Errorf("%s is held by another", key)
		}
		holder = tok
		return time.Since(began), nil
	}
}

func distlockLocker(b *testing.B, rdb *redis.Client, prefix string) locker {
	c := newClient(b, rdb, distlock.Config{Prefix: prefix})
	return func(ctx context.Context, key string) (time.Duration, error) {
		began := time.Now()
		l, err := c.Obtain(ctx, key, benchTTL)
		if err != nil {
			return 0, err
		}
		waited := time.Since(began)
		return waited, l.Release(ctx)
	}
}

// doLocker holds the lock as Client.Do does, with the watchdog armed while
// fn (here nothing) runs: what a managed hold costs beyond Obtain and
// Release.
func doLocker(b *testing.B, rdb *redis.Client, prefix string) locker {
	c := newClient(b, rdb, distlock.Config{Prefix: prefix, TTL: benchTTL})
	return func(ctx context.Context, key string) (time.Duration, error) {
		began := time.Now()
		var waited time.Duration
		err := c.Do(ctx, key, func(context.Context) error {
			waited = time.Since(began)
			return nil
		})
		return waited, err
	}
}

func BenchmarkObtainRelease(b *testing.B) {
	type newLocker func(b *testing.B, rdb *redis.Client, prefix string) locker
	impls := []struct {
		name                string
		uncontended, hotkey newLocker // nil: not run on that workload
	}{
		{"raw", rawLocker, rawLocker},
		{"script", scriptLocker, handOverLocker},
		{"bounded", boundedLocker, nil},
		{"distlock", distlockLocker, distlockLocker},
		{"ctxtimeout", ctxTimeoutLocker, nil},
		{"do", doLocker, nil},
	}
	workloads := []struct {
		name    string
		workers []int
		key     func(worker int) string
		report  bool
	}{
		{"uncontended", []int{1, 8, 64}, func(w int) string { return "u" + strconv.Itoa(w) }, false},
		{"hotkey", []int{8, 64}, func(int) string { return "hot" }, true},
	}
	// Each cell runs raw and then distlock, back to back, so that the two
	// sides of a ratio are measured minutes closer together than they would
	// be if every raw cell ran first: on a shared machine that gap alone
	// moves a ratio more than the library does.
	for _, w := range workloads {
		for _, workers := range w.workers {
			for _, impl := range impls {
				newLock := impl.uncontended
				if w.name == "hotkey" {
					newLock = impl.hotkey
				}
				if newLock == nil {
					continue
				}
				b.Run(impl.name+"/"+w.name+"/workers="+strconv.Itoa(workers), func(b *testing.B) {
					rdb, prefix := testserver.Redis(b)
					lock := newLock(b, rdb, prefix)
					cpu := startCPU(b, rdb)
					runWorkers(b, workers, w.report, func(ctx context.Context, worker int) (time.Duration, error) {
						return lock(ctx, w.key(worker))
					})
					cpu.report(b)
				})
			}
		}
	}
}

// runWorkers runs b.N ops from workers goroutines, each taking the next op
// as it finishes its last, so that a worker served faster does more.
func runWorkers(b *testing.B, workers int, report bool, op func(ctx context.Context, worker int) (time.Duration, error)) {
	ctx := context.Background()
	var (
		next   atomic.Int64
		counts = make([]int, workers)
		waits  = make([][]time.Duration, workers)
		wg     sync.WaitGroup
	)
	b.ResetTimer()
	for w := range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				waited, err := op(ctx, w)
				if err != nil {
					b.Error(err)
					return
				}
				counts[w]++
				waits[w] = append(waits[w], waited)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if !report {
		return
	}
	all := slices.Concat(waits...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[int(math.Ceil(0.99*float64(len(all))))-1]), "p99-ns")
	}
	// A worker that got none counts as one, so the ratio stays finite.
	b.ReportMetric(float64(slices.Max(counts))/float64(max(slices.Min(counts), 1)), "max/min")
}

// A cpuMeter measures the CPU time that this process and Redis spend
// between startCPU and report.
type cpuMeter struct {
	rdb           *redis.Client
	client, redis time.Duration
	clientOK      bool
	redisErr      error
}

func startCPU(b *testing.B, rdb *redis.Client) cpuMeter {
	m := cpuMeter{rdb: rdb}
	m.client, m.clientOK = processCPU()
	m.redis, m.redisErr = redisCPU(b.Context(), rdb)
	return m
}

// report reports the CPU time spent since startCPU, per op.
func (m cpuMeter) report(b *testing.B) {
	if now, ok := processCPU(); ok && m.clientOK {
		b.ReportMetric(float64(now-m.client)/float64(b.N), "cpu-ns/op")
	}
	if m.redisErr != nil {
		b.Logf("no redis-cpu-ns/op: %v", m.redisErr)
		return
	}
	now, err := redisCPU(b.Context(), m.rdb)
	if err != nil {
		b.Logf("no redis-cpu-ns/op: %v", err)
		return
	}
	b.ReportMetric(float64(now-m.redis)/float64(b.N), "redis-cpu-ns/op")
}

// redisCPU returns the CPU time, user and system, that the Redis server
// has used so far: used_cpu_user and used_cpu_sys of INFO cpu, seconds
// with microseconds.
func redisCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total time.Duration
	found := 0
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		seconds, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s: %w", name, err)
		}
		total += time.Duration(seconds * float64(time.Second))
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu has no used_cpu_user and used_cpu_sys")
	}
	return total, nil
}

// The benchmarks' CPU meters read something: a parse that found nothing
// would report no redis-cpu-ns/op rather than a wrong one, and this fails.
func TestBenchmarkCPUMeters(t *testing.T) {
	t.Parallel()
	rdb, prefix := testserver.Redis(t)
	before, err := redisCPU(t.Context(), rdb)
	require.NoError(t, err)
	for i := range 200 {
		require.NoError(t, rdb.Set(t.Context(), prefix+"cpu", i, time.Minute).Err())
	}
	after, err := redisCPU(t.Context(), rdb)
	require.NoError(t, err)
	require.Positive(t, before)
	require.GreaterOrEqual(t, after, before, "Redis CPU went back")
	if cpu, ok := processCPU(); ok {
		require.Positive(t, cpu, "this process used no CPU")
	}
}
