package guardtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/history"
	"github.com/contend/contend/internal/testserver"
)

// LongEnv, set to 1, makes the linearizability runs longer: more goroutines,
// operations and keys, and the faults for longer.
const LongEnv = "CONTEND_LONG"

func long() bool { return os.Getenv(LongEnv) == "1" }

// faultConfig is the load of the run under faults: short by default, so that
// every guard's suite stays within a few seconds, long under [LongEnv]. Keys
// are many for few calls so that a fail-fast guard, whose lost races leave
// nothing to check, still has calls that get in.
func faultConfig(processes int) harness.Config {
	if long() {
		return harness.Config{Processes: processes, Goroutines: 16, Ops: 40, Keys: keys(16)}
	}
	return harness.Config{Processes: processes, Goroutines: 8, Ops: 8, Keys: keys(8)}
}

// opTimeout bounds each call of a run under faults, so that no fault can
// hang the run: a call cut short is a failed call like any other.
const opTimeout = 10 * time.Second

// checkTimeout bounds the checker on one key's history. The histories here
// take it milliseconds; a check that runs out is a failure, not a pass.
const checkTimeout = 30 * time.Second

// A worker is one process's part of a contention run: its environment,
// its guard, and the record of every call it made.
type worker struct {
	env   Env
	guard contend.Guard
	rec   *history.Recorder
	chaos *chaos // nil unless this process is the one under faults
	// limit bounds each call; 0 leaves it to the caller's ctx.
	limit time.Duration
}

// newWorker builds this process's worker from the run's parameters. Under
// faults the first process to start talks to both servers through fault
// proxies, and the others talk to them directly.
func newWorker(t testing.TB, s Suite, p harness.Params) *worker {
	index := claimIndex(t, p["dir"])
	w := &worker{rec: history.NewRecorder(index)}
	var proxies []*faultproxy.Proxy
	if p["faults"] == "true" {
		w.limit = opTimeout
		if index == 0 {
			w.env, proxies = openUnderFaults(t, s.Driver, p["url"], p["prefix"])
		}
	}
	if w.env.DB == nil {
		w.env = open(t, s.Driver, p["url"], p["prefix"])
	}
	w.guard = newGuard(t, s, w.env)
	if proxies != nil {
		// The faults begin with the first call, not before: a constructor
		// that prepares statements (the claimer's) fails on a cut
		// connection, as it should, and the run is about the calls, not
		// the construction nor the wait for the other processes.
		w.chaos = newChaos(proxies...)
		t.Cleanup(func() { w.chaos.stop() })
	}
	return w
}

// op is the operation the harness runs: one recorded read-modify-write of
// key's counter under the guard.
func (w *worker) op(ctx context.Context, key string) error {
	if w.limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.limit)
		defer cancel()
	}
	if w.chaos != nil {
		w.chaos.start()
	}
	call := w.rec.Begin(key)
	err := w.guard.Do(ctx, key, func(ctx context.Context) error { return increment(ctx, w.env, key, call) })
	call.End(err)
	return err
}

// report is what a worker hands back to the test process.
type report struct {
	// Workers counts the processes whose reports were merged into this one.
	Workers int         `json:"workers"`
	Log     history.Log `json:"log"`
	Faults  FaultCount  `json:"faults"`
}

func (w *worker) report() report {
	r := report{Workers: 1, Log: w.rec.Log()}
	if w.chaos != nil {
		r.Faults = w.chaos.stop()
	}
	return r
}

// save writes the worker's report to dir, for the test process to collect.
func (w *worker) save(t testing.TB, dir string) {
	data, err := json.Marshal(w.report())
	require.NoError(t, err)
	name := fmt.Sprintf("report-%d.json", w.rec.Process())
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
}

// collect merges the reports the workers saved in dir with local's, the
// worker of the test process itself if it ran one.
func collect(t *testing.T, dir string, local *worker) report {
	t.Helper()
	var all report
	add := func(r report) {
		all.Workers += r.Workers
		all.Log.Merge(r.Log)
		all.Faults.add(r.Faults)
	}
	if local != nil {
		add(local.report())
	}
	files, err := filepath.Glob(filepath.Join(dir, "report-*.json"))
	require.NoError(t, err)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var r report
		require.NoError(t, json.Unmarshal(data, &r), f)
		add(r)
	}
	return all
}

// claimIndex gives this process the first free index of the run: 0, 1, … in
// the order the processes got there. Creating a file with O_EXCL is atomic
// across processes.
func claimIndex(t testing.TB, dir string) int {
	for i := 0; ; i++ {
		f, err := os.OpenFile(filepath.Join(dir, "process-"+strconv.Itoa(i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		require.NoError(t, err)
		require.NoError(t, f.Close())
		return i
	}
}

// openUnderFaults is open with the connections to PostgreSQL and to Redis
// each through a fault proxy, and returns the proxies for the faults
// (startChaos). They stop, and the proxies heal, when t ends or the worker
// reports.
func openUnderFaults(t testing.TB, driver, pgURL, prefix string) (Env, []*faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(pgURL)
	require.NoError(t, err)
	pg := faultproxy.Start(t, u.Host)
	u.Host = pg.Addr()

	redisURL, err := testserver.RedisURL()
	require.NoError(t, err)
	opts, err := redis.ParseURL(redisURL)
	require.NoError(t, err)
	rp := faultproxy.Start(t, opts.Addr)
	opts.Addr = rp.Addr()
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })

	return withHandle(t, driver, u.String(), Env{Redis: client, Prefix: prefix}), []*faultproxy.Proxy{pg, rp}
}

// FaultCount says what the faults of a run did, so a test can show they
// were real.
type FaultCount struct {
	// Resets counts the resets, Reset the connections they cut.
	Resets int `json:"resets"`
	Reset  int `json:"reset"`
	// Drops counts the times a reply was set to be dropped after its
	// command ran: the next reply on any connection, if one came before the
	// reset that follows.
	Drops int `json:"drops"`
}

func (c *FaultCount) add(o FaultCount) {
	c.Resets += o.Resets
	c.Reset += o.Reset
	c.Drops += o.Drops
}

// chaos runs the faults of one process, in rounds from its first call until
// stopped: a slow link for a while (from the second round on), then a reply
// lost after its command ran, then every open connection reset (which also
// ends the connection the lost reply muted, so its client does not wait for
// ever), then a short calm.
type chaos struct {
	proxies []*faultproxy.Proxy
	quit    chan struct{}
	done    chan struct{}
	started sync.Once  // the loop started, or stop made sure it never will
	once    sync.Once  // quit closed
	count   FaultCount // written by the loop, read after done
}

func newChaos(proxies ...*faultproxy.Proxy) *chaos {
	return &chaos{proxies: proxies, quit: make(chan struct{}), done: make(chan struct{})}
}

// start begins the rounds; calls after the first, or after stop, do
// nothing.
func (c *chaos) start() { c.started.Do(func() { go c.loop() }) }

func (c *chaos) loop() {
	defer close(c.done)
	defer func() {
		for _, p := range c.proxies {
			p.Heal()
		}
	}()
	wait := func(d time.Duration) bool {
		select {
		case <-c.quit:
			return false
		case <-time.After(d):
			return true
		}
	}
	for round := 0; ; round++ {
		// The first round skips the slow link: a run of quick calls (a
		// fail-fast guard's) can be over within its 60ms, and a run the
		// faults never reached shows nothing.
		if round > 0 {
			for _, p := range c.proxies {
				p.SetLatency(time.Duration(1+rand.IntN(3)) * time.Millisecond)
			}
			if !wait(60 * time.Millisecond) {
				return
			}
		}
		victim := c.proxies[round%len(c.proxies)]
		victim.DropNextReply()
		c.count.Drops++
		if !wait(20 * time.Millisecond) {
			return
		}
		for _, p := range c.proxies {
			c.count.Reset += p.Conns()
			p.Reset()
			p.Heal()
		}
		c.count.Resets++
		// Every fourth round leaves the links alone for a while, so that
		// calls slowed by a loaded machine can still finish between
		// resets: a run in which every call fails shows nothing.
		pause := 40 * time.Millisecond
		if round%4 == 3 {
			pause = 300 * time.Millisecond
		}
		if !wait(pause) {
			return
		}
	}
}

// stop ends the faults, waits for the loop and returns what it did. It may
// be called more than once.
func (c *chaos) stop() FaultCount {
	c.once.Do(func() { close(c.quit) })
	c.started.Do(func() { close(c.done) }) // no call came: no loop to wait for
	<-c.done
	return c.count
}
