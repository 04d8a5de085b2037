// Command lockbench runs the popular Go Redis locks beside distlock on the
// same workloads and prints what a user of each would see: throughput, the
// p99 wait for the lock, and how evenly the waiters of a hot key were served
// (the most acquisitions of one worker over the fewest).
//
//	go run ./examples/lockbench [-duration 2s] [-workers 1,8,64]
//
// Workloads: "uncontended", every worker locking a key of its own, and
// "hotkey", every worker locking the same key, each acquisition released at
// once. The peers wait the way they are usually configured to: by polling,
// every millisecond here (bsm/redislock with LinearBackoff(1ms),
// go-redsync/redsync with a 1ms retry delay, and "raw-poll", the bare SET NX
// PX loop; "raw-fenced", the same loop issuing distlock's fencing token in
// its obtain script, the floor of what distlock promises uncontended).
// distlock waits in a queue and is handed the lock by the release;
// distlock-ctxtimeout is distlock on a go-redis client built with
// ContextTimeoutEnabled, whose calls distlock sends on the caller's
// goroutine instead of its own (see the package doc).
// All run in this one process against one Redis (see internal/testserver),
// one after the other; other load on the machine shows in the figures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
)

func main() {
	duration := flag.Duration("duration", 2*time.Second, "how long each run lasts")
	workers := flag.String("workers", "1,8,64", "comma-separated worker counts (hotkey skips 1)")
	flag.Parse()
	counts, err := parseWorkers(*workers)
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		err = run(ctx, os.Stdout, *duration, counts)
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		os.Exit(1)
	}
}

func parseWorkers(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-workers: %q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// ttl is every lock's lease: far longer than any hold here.
const ttl = 10 * time.Second

// A locker obtains key (waiting for it) and releases it.
type locker interface {
	lock(ctx context.Context, key string) (unlock func(ctx context.Context) error, err error)
	close(ctx context.Context) error
}

type impl struct {
	name string
	// new makes the lock on rdb; opts are the options rdb was made from,
	// for one that needs a client of its own. (A copy of rdb.Options()
	// would share what rdb's making set up in them.)
	new func(rdb *redis.Client, opts *redis.Options, prefix string) (locker, error)
}

var impls = []impl{
	{"raw-poll", func(rdb *redis.Client, _ *redis.Options, prefix string) (locker, error) {
		return rawPoll{rdb, prefix}, nil
	}},
	{"raw-fenced", func(rdb *redis.Client, _ *redis.Options, prefix string) (locker, error) {
		return rawFenced{rawPoll{rdb, prefix}}, nil
	}},
	{"bsm/redislock", func(rdb *redis.Client, _ *redis.Options, prefix string) (locker, error) {
		return bsm{redislock.New(rdb), prefix}, nil
	}},
	{"redsync", func(rdb *redis.Client, _ *redis.Options, prefix string) (locker, error) {
		return redsyncLocker{redsync.New(goredis.NewPool(rdb)), prefix}, nil
	}},
	{"distlock", func(rdb *redis.Client, _ *redis.Options, prefix string) (locker, error) {
		c, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix})
		return distlockLocker{c: c}, err
	}},
	// distlock on a go-redis client that ends calls by their ctx's
	// deadline itself: its calls stay on the caller's goroutine.
	{"distlock-ctxtimeout", func(_ *redis.Client, opts *redis.Options, prefix string) (locker, error) {
		o := *opts
		o.ContextTimeoutEnabled = true
		own := redis.NewClient(&o)
		c, err := distlock.NewClient(own, distlock.Config{Prefix: prefix})
		if err != nil {
			own.Close()
		}
		return distlockLocker{c: c, own: own}, err
	}},
}

type result struct {
	impl, workload string
	workers        int
	cycles         int
	elapsed        time.Duration
	waits          []time.Duration
	perWorker      []int
	errs           int
	firstErr       error
}

func run(ctx context.Context, out io.Writer, duration time.Duration, workers []int) (err error) {
	defer func() { err = errors.Join(err, testserver.StopAll()) }()
	u, err := testserver.RedisURL()
	if err != nil {
		return err
	}
	opts, err := redis.ParseURL(u)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Redis at %s; %v per run; lease %v\n\n", opts.Addr, duration, ttl)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "workload\tworkers\tlock\tcycles/s\tp99 wait\tmax/min\terrors\t")
	for _, workload := range []string{"uncontended", "hotkey"} {
		for _, n := range workers {
			if workload == "hotkey" && n == 1 {
				continue
			}
			for _, im := range impls {
				r, err := measure(ctx, opts, im, workload, n, duration)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%.0f\t%v\t%s\t%d\t\n", workload, n, im.name,
					float64(r.cycles)/r.elapsed.Seconds(), p99(r.waits).Round(time.Microsecond), spread(r), r.errs)
				if r.firstErr != nil {
					fmt.Fprintf(w, "\t\t\t\t\t\t(first error: %v)\t\n", r.firstErr)
				}
			}
		}
	}
	return w.Flush()
}

// measure runs one implementation on one workload for duration, on a Redis
// client and key prefix of its own.
func measure(ctx context.Context, opts *redis.Options, im impl, workload string, workers int, duration time.Duration) (r result, err error) {
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	prefix := testserver.RandomName("contend:lockbench:") + ":"
	defer func() { err = errors.Join(err, testserver.DeletePrefix(context.WithoutCancel(ctx), rdb, prefix)) }()
	l, err := im.new(rdb, opts, prefix)
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, l.close(context.WithoutCancel(ctx))) }()

	r = result{impl: im.name, workload: workload, workers: workers, perWorker: make([]int, workers)}
	runCtx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	var (
		mu    sync.Mutex // protects r.waits, r.errs, r.firstErr
		wg    sync.WaitGroup
		start = time.Now()
	)
	for i := range workers {
		key := "hot"
		if workload == "uncontended" {
			key = "u" + strconv.Itoa(i)
		}
		wg.Go(func() {
			var waits []time.Duration
			for runCtx.Err() == nil {
				began := time.Now()
				unlock, err := l.lock(runCtx, key)
				waited := time.Since(began)
				if err == nil {
					// Released with the parent ctx: the run may end meanwhile.
					err = unlock(ctx)
				}
				if err != nil {
					if runCtx.Err() != nil {
						break // the run ended during the wait
					}
					mu.Lock()
					r.errs++
					if r.firstErr == nil {
						r.firstErr = err
					}
					mu.Unlock()
					continue
				}
				waits = append(waits, waited)
				r.perWorker[i]++
			}
			mu.Lock()
			r.waits = append(r.waits, waits...)
			mu.Unlock()
		})
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	for _, n := range r.perWorker {
		r.cycles += n
	}
	return r, nil
}

func p99(waits []time.Duration) time.Duration {
	if len(waits) == 0 {
		return 0
	}
	s := slices.Clone(waits)
	slices.Sort(s)
	return s[int(math.Ceil(0.99*float64(len(s))))-1]
}

// spread is the most acquisitions of one worker over the fewest ("inf" when
// a worker got none).
func spread(r result) string {
	if r.workload != "hotkey" {
		return "-"
	}
	lo, hi := slices.Min(r.perWorker), slices.Max(r.perWorker)
	if lo == 0 {
		return fmt.Sprintf("inf (%d/0)", hi)
	}
	return fmt.Sprintf("%.2f (%d/%d)", float64(hi)/float64(lo), hi, lo)
}

// rawPoll is the loop every polling lock runs: SET NX PX, and on failure
// sleep a millisecond and try again.
type rawPoll struct {
	rdb    *redis.Client
	prefix string
}

var compareAndDelete = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func (p rawPoll) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	key = p.prefix + key
	tok := testserver.RandomName("")
	for {
		ok, err := p.rdb.SetNX(ctx, key, tok, ttl).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			return func(ctx context.Context) error { return compareAndDelete.Run(ctx, p.rdb, []string{key}, tok).Err() }, nil
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (rawPoll) close(context.Context) error { return nil }

// rawFenced is raw-poll keeping what distlock's uncontended obtain promises
// beyond it, written by hand: the obtain also issues a fencing token, one
// past the key's counter and never below the server's clock in
// microseconds (so a Redis restarted from an older snapshot repeats none),
// and looks whether waiters are queued. It is the floor of distlock's
// uncontended cells: what any lock with those promises sends, one script per
// obtain and one per release, and no more.
type rawFenced struct{ rawPoll }

var fencedObtain = redis.NewScript(`
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('LLEN', KEYS[3])
local t = redis.call('TIME')
local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', 86400000, 'GET')
if last and tonumber(last) >= f then
  f = tonumber(last) + 1
  redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', 86400000)
end
return f`)

func (p rawFenced) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	keys := []string{p.prefix + "{" + key + "}", p.prefix + "{" + key + "}:fence", p.prefix + "{" + key + "}:queue"}
	tok := testserver.RandomName("")
	for {
		f, err := fencedObtain.Run(ctx, p.rdb, keys, tok, ttl.Milliseconds()).Int64()
		if err != nil {
			return nil, err
		}
		if f > 0 {
			return func(ctx context.Context) error { return compareAndDelete.Run(ctx, p.rdb, keys[:1], tok).Err() }, nil
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

type bsm struct {
	c      *redislock.Client
	prefix string
}

func (b bsm) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := b.c.Obtain(ctx, b.prefix+key, ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)})
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (bsm) close(context.Context) error { return nil }

type redsyncLocker struct {
	rs     *redsync.Redsync
	prefix string
}

func (r redsyncLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	m := r.rs.NewMutex(r.prefix+key, redsync.WithExpiry(ttl), redsync.WithTries(math.MaxInt32),
		redsync.WithRetryDelay(time.Millisecond))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := m.UnlockContext(ctx)
		return err
	}, nil
}

func (redsyncLocker) close(context.Context) error { return nil }

type distlockLocker struct {
	c   *distlock.Client
	own *redis.Client // the Redis client made for c, if any: closed with it
}

func (d distlockLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := d.c.Obtain(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (d distlockLocker) close(ctx context.Context) error {
	err := d.c.Close(ctx)
	if d.own != nil {
		err = errors.Join(err, d.own.Close())
	}
	return err
}
