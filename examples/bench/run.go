package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	stdatomic "sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/mysqldb"
)

// env is where a run's cells run: a fresh schema, a Redis key prefix and,
// when a MariaDB strategy runs, a MariaDB database of their own.
type env struct {
	PostgresURL string `json:"postgres_url"` // the schema's URL
	MariaDBURL  string `json:"mariadb_url"`  // the database's mysql:// URL
	RedisURL    string `json:"redis_url"`
	RedisPrefix string `json:"redis_prefix"`
}

// A cell is one point of the grid.
type cell struct {
	Workload  string `json:"workload"`
	Strategy  string `json:"strategy"`
	Keys      int    `json:"keys"`
	Workers   int    `json:"workers"`
	Processes int    `json:"processes"`
}

func (c cell) keyChoice() string {
	switch {
	case c.Workload == stormWorkload:
		return "fresh"
	case c.Keys == 1:
		return "hot"
	case c.Workload == "shift":
		return fmt.Sprintf("spread(%d)→hot", c.Keys)
	}
	return fmt.Sprintf("spread(%d)", c.Keys)
}

// inGrid reports whether c is worth a run. The shift workload turns spread
// keys into one hot key: with one key there is nothing to turn, and with one
// worker nobody to contend with. It is there to set the adaptive guard
// beside the guards it chooses between, so it runs shiftStrategies only.
//
// The think workloads are there to show what a waiter holds: they run their
// strategies on spread keys (mixed makes one of them hot), from at least 8
// workers (and only at the run's largest count, see Run), and only they run
// pessimistic-noqueue.
func (c cell) inGrid() bool {
	switch {
	case c.Workload == stormWorkload:
		// Its keys are its requests, fresh each time: one cell per worker
		// count, on the spread keys; from 8 workers, where requests and
		// their copies contend (one worker would add cells, and time to
		// the run, for one request at a time).
		return c.Keys > 1 && c.Workers >= 8 && slices.Contains(stormStrategies, c.Strategy)
	case slices.Contains(stormStrategies, c.Strategy):
		return false
	case thinks(c.Workload):
		return c.Keys > 1 && c.Workers >= 8 && slices.Contains(thinkStrategies, c.Strategy)
	case c.Strategy == "pessimistic-noqueue":
		return false
	case c.Workload == "shift":
		return c.Keys > 1 && c.Workers > 1 && slices.Contains(shiftStrategies, c.Strategy)
	case c.Strategy == "oracle":
		// It knows the hot key of the workloads that make one: mixed and
		// the shifts.
		return false
	}
	return true
}

// acrossCells are the cells a run adds from processes processes at once,
// the several instances of a service: the hot key's decrement from 8 workers
// each, and mixed from 64 each, under those of strategies that run there.
// There the naive control's process-local mutex is shown to lose updates.
func acrossCells(strategies []string, processes int) []cell {
	var cells []cell
	for _, c := range []cell{{Workload: "decrement", Keys: 1, Workers: 8}, {Workload: "mixed", Keys: 1000, Workers: 64}} {
		for _, s := range strategies {
			c.Strategy, c.Processes = s, processes
			if c.inGrid() && s != "queue" {
				cells = append(cells, c)
			}
		}
	}
	return cells
}

// picker is c's choice of each operation's key in place of the harness's,
// nil to keep the harness's.
func (c cell) picker() picker {
	switch c.Workload {
	case "shift", "shift-think":
		return shiftPicker(c.keys()[0])
	case "mixed":
		return mixedPicker(c.keys())
	}
	return nil
}

// hot is the key whose operations a cell counts apart (mixed's hot key),
// or "".
func (c cell) hot() string {
	if c.Workload == "mixed" {
		return c.keys()[0]
	}
	return ""
}

// mixedHot is the share, in percent, of mixed's operations on its hot key.
const mixedHot = 30

// mixedPicker is the mixed workload's choice: keys[0], hot, for mixedHot
// percent of the operations, and one of the others, cold, picked at random,
// for the rest.
func mixedPicker(keys []string) picker {
	cold := keys[1:]
	return func(string, time.Duration, time.Duration) string {
		if rand.IntN(100) < mixedHot {
			return keys[0]
		}
		return cold[rand.IntN(len(cold))]
	}
}

// A picker chooses the key of an operation that starts at elapsed into a
// window of the given length, from the key the harness chose for it.
type picker func(key string, elapsed, window time.Duration) string

// shiftPicker is the shift workload's choice: the harness's key, picked at
// random from the cell's keys, in the first half of the window, and hot in the
// second, as when a sale starts on one product of many.
func shiftPicker(hot string) picker {
	return func(key string, elapsed, window time.Duration) string {
		if elapsed < window/2 {
			return key
		}
		return hot
	}
}

func (c cell) name() string {
	return fmt.Sprintf("%s/%s/%s/workers=%d/processes=%d", c.Workload, c.keyChoice(), c.Strategy, c.Workers, c.Processes)
}

// keys are the cell's keys: the one hot key, or Keys spread ones.
func (c cell) keys() []string {
	if c.Keys == 1 {
		return []string{workload.Hot}
	}
	return workload.Keys("k", c.Keys)
}

// poolSize bounds each process's pool: the database is shared (other
// programs, other engineers' tests), and past a few connections per core more
// only adds waiting inside the server.
func (c cell) poolSize() int {
	if thinks(c.Workload) {
		return thinkPool
	}
	return max(2, min(c.Workers, 16/max(c.Processes, 1)))
}

// outcome is what the processes of a cell did, summed.
type outcome struct {
	harness.Result
	Retries int64 `json:"retries"`
	// Split counts the retry storm's requests answered two ways.
	Split int64 `json:"split"`
	// InWindow counts the operations, successes and lost races, that ended
	// inside the timed window: Result also counts those still in flight at
	// the deadline, which ran on into the drain, and its Elapsed includes
	// the drain. Throughput is InWindow over Window, never over Elapsed.
	InWindow int64 `json:"in_window"`
	// Window is the timed window: the cell's duration.
	Window time.Duration `json:"window"`
	// HotInWindow counts the operations of InWindow on the cell's hot key
	// (mixed only), and ColdLatencies are the latencies of the others,
	// sorted.
	HotInWindow   int64           `json:"hot_in_window"`
	ColdLatencies []time.Duration `json:"cold_latencies"`
	// Modes counts the adaptive guard's calls by the mode they began in.
	Modes modes `json:"modes"`
}

// modes is modeCounts as numbers, summed over processes.
type modes struct {
	Hot, HotLocked, Cold, ColdLocked, Flips int64
	// LockedAfter is how long after a process's first call the hot key's
	// first call began locked: the slowest process's.
	LockedAfter time.Duration
}

// Run runs o's grid and returns one row per cell, writing the table to
// o.Stdout and, when o.Out is set, results.md and the charts.
func Run(ctx context.Context, o Options) ([]row, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	var cells []cell
	for _, wl := range o.Workloads {
		for _, k := range o.Keys {
			for _, w := range o.Workers {
				if thinks(wl) && w != slices.Max(o.Workers) {
					// A waiter's hold on a connection shows when workers
					// outnumber the pool: the largest count says it.
					continue
				}
				for _, s := range o.Strategies {
					if c := (cell{Workload: wl, Strategy: s, Keys: k, Workers: w, Processes: o.Processes}); c.inGrid() {
						cells = append(cells, c)
					}
				}
			}
		}
	}
	if o.Across > 1 && o.Processes <= 1 {
		for _, c := range acrossCells(o.Strategies, o.Across) {
			if slices.Contains(o.Workloads, c.Workload) {
				cells = append(cells, c)
			}
		}
	}
	if len(cells) == 0 {
		return nil, fmt.Errorf("no cell to run: the shift workload needs more than one key and worker, and one of %s", strings.Join(shiftStrategies, ","))
	}
	pgServer, err := testserver.PostgresURL()
	if err != nil {
		return nil, err
	}
	redisURL, err := testserver.RedisURL()
	if err != nil {
		return nil, err
	}
	schema, schemaURL, err := testserver.CreateSchema(ctx, pgServer)
	if err != nil {
		return nil, err
	}
	defer testserver.DropSchema(context.WithoutCancel(ctx), pgServer, schema)
	admin, err := sqlx.Open("pgx", schemaURL)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	admin.SetMaxOpenConns(2)
	e := env{PostgresURL: schemaURL, RedisURL: redisURL, RedisPrefix: testserver.RandomName("contend:bench:") + ":"}
	admins := servers{postgres: admin}
	if slices.ContainsFunc(o.Strategies, onMariaDB) {
		server, err := testserver.MariaDBURL()
		if err != nil {
			return nil, err
		}
		name, dbURL, err := testserver.CreateDatabase(ctx, server)
		if err != nil {
			return nil, err
		}
		defer testserver.DropDatabase(context.WithoutCancel(ctx), server, name)
		if admins.mariadb, err = openMariaDB(dbURL); err != nil {
			return nil, err
		}
		defer admins.mariadb.Close()
		admins.mariadb.SetMaxOpenConns(2)
		e.MariaDBURL = dbURL
	}
	defer func() {
		if opts, err := redis.ParseURL(redisURL); err == nil {
			rdb := redis.NewClient(opts)
			testserver.DeletePrefix(context.WithoutCancel(ctx), rdb, e.RedisPrefix)
			rdb.Close()
		}
	}()

	p := newProgress(o.Progress, o.Interactive, len(cells)*o.Rounds, o.Duration)
	// Rounds walk the whole grid again rather than repeat a cell in place,
	// so that slow drift (autovacuum, other load) spreads over every
	// strategy instead of favouring the one measured first.
	runs := make([][]row, len(cells))
	started := time.Now()
	for round := range o.Rounds {
		for i, c := range cells {
			p.start(round*len(cells)+i, c)
			r, err := runCell(ctx, admins, e, c, o.Duration)
			if err != nil {
				p.done()
				return nil, fmt.Errorf("%s: %w", c.name(), err)
			}
			runs[i] = append(runs[i], r)
			p.finish(r)
		}
	}
	rows := make([]row, len(cells))
	for i := range cells {
		rows[i] = median(runs[i])
	}
	p.done()
	writeTable(o.Stdout, rows)
	if s := lockSummary(rows); s != "" {
		fmt.Fprintf(o.Stdout, "\n%s", s)
	}
	if s := modeSummary(rows); s != "" {
		fmt.Fprintf(o.Stdout, "\n%s", s)
	}
	fmt.Fprintf(o.Stdout, "\n%d cells in %s\n", len(rows), time.Since(started).Round(time.Second))
	if o.Out != "" {
		files, err := writeReport(ctx, admins, o, rows, time.Since(started))
		if err != nil {
			return rows, err
		}
		fmt.Fprintf(o.Stdout, "wrote %s\n", strings.Join(files, ", "))
	}
	return rows, nil
}

// servers are a run's administrative pools: PostgreSQL's, and MariaDB's
// when a MariaDB strategy runs (else nil).
type servers struct{ postgres, mariadb *sqlx.DB }

// of is the pool of strategy's server.
func (s servers) of(strategy string) *sqlx.DB {
	if onMariaDB(strategy) {
		return s.mariadb
	}
	return s.postgres
}

// openMariaDB opens a pool on a mysql:// URL, with clientFoundRows set
// (mysqldb.Open), for sqlx with ? placeholders.
func openMariaDB(url string) (*sqlx.DB, error) {
	cfg, err := testserver.MariaDBConfig(url)
	if err != nil {
		return nil, err
	}
	db, err := mysqldb.Open(cfg)
	if err != nil {
		return nil, err
	}
	return sqlx.NewDb(db, "mysql"), nil
}

// runCell makes c's table afresh, runs c's load in this process or in c's
// worker processes, and checks the invariant against what the table shows.
func runCell(ctx context.Context, admins servers, e env, c cell, d time.Duration) (row, error) {
	admin := admins.of(c.Strategy)
	r := row{cell: c}
	var err error
	if c.Strategy == "queue" && c.Processes > 1 {
		// The in-memory queue orders a key's operations within its process
		// only; across processes it would be measuring something else.
		r.Skipped = "in-memory queue: one process only"
		return r, nil
	}
	keys := c.keys()
	if c.Workload == stormWorkload {
		err = createStormTables(ctx, admin, c.Strategy)
	} else {
		err = createTable(ctx, admin, dialectOf(c.Strategy), c.Workload, keys)
	}
	if err != nil {
		return r, err
	}
	e.RedisPrefix += c.name() + ":"
	var out outcome
	if c.Processes <= 1 {
		out, err = runLocal(ctx, e, c, keys, d, nil)
	} else {
		out, err = spawn(ctx, e, c, d)
	}
	if err != nil {
		return r, err
	}
	r.fill(out)
	if err := check(ctx, admin, &r, out); err != nil {
		return r, err
	}
	return r, nil
}

// runLocal runs c's load from this process's goroutines. ready, when set, is
// called once everything is connected; the load starts when it returns.
func runLocal(ctx context.Context, e env, c cell, keys []string, d time.Duration, ready func() error) (outcome, error) {
	var (
		db  *sqlx.DB
		err error
	)
	if onMariaDB(c.Strategy) {
		db, err = openMariaDB(e.MariaDBURL)
	} else {
		db, err = sqlx.Open("pgx", e.PostgresURL)
	}
	if err != nil {
		return outcome{}, err
	}
	defer db.Close()
	db.SetMaxOpenConns(c.poolSize())
	db.SetMaxIdleConns(c.poolSize())
	opts, err := redis.ParseURL(e.RedisURL)
	if err != nil {
		return outcome{}, err
	}
	opts.PoolSize = c.poolSize() + 2
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	if err := warm(ctx, db, c.poolSize()); err != nil {
		return outcome{}, err
	}
	b := backends{db: db, h: db, sql: dialectOf(c.Strategy), rdb: rdb, redisPrefix: e.RedisPrefix}
	if c.picker() != nil {
		b.hot = keys[0] // mixed's hot key, and shift's after the shift
	}
	if onMariaDB(c.Strategy) {
		b.h = mysqldb.Wrap(db)
	}
	if pgxNative(c.Strategy) {
		if b.pool, err = openPool(ctx, e.PostgresURL, c.poolSize()); err != nil {
			return outcome{}, err
		}
		defer b.pool.Close()
	}
	var cnt counters
	op, closeOp, err := newOp(ctx, b, c.Workload, c.Strategy, &cnt)
	if err != nil {
		return outcome{}, err
	}
	defer closeOp()
	if ready != nil {
		if err := ready(); err != nil {
			return outcome{}, err
		}
	}
	out := measure(ctx, harness.Config{Goroutines: c.Workers, Duration: d, Keys: keys, Spread: len(keys) > 1}, op, c.picker(), c.hot())
	if out.Stalled != "" {
		return outcome{}, fmt.Errorf("%s/%s: %s", c.Workload, c.Strategy, out.Stalled)
	}
	out.Retries = cnt.retries.Load()
	out.Split = cnt.split.Load()
	m := &cnt.modes
	out.Modes = modes{Hot: m.hot.Load(), HotLocked: m.hotLocked.Load(), Cold: m.cold.Load(), ColdLocked: m.coldLocked.Load(), Flips: m.flips.Load(),
		LockedAfter: time.Duration(m.locked.Load())}
	return out, nil
}

// openPool opens a pgxpool of size connections on url, all of them made
// before the load starts, as warm does for database/sql.
func openPool(ctx context.Context, url string, size int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(size), int32(size)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	for pool.Stat().TotalConns() < int32(size) {
		if err := ctx.Err(); err != nil {
			pool.Close()
			return nil, err
		}
		time.Sleep(time.Millisecond)
	}
	return pool, nil
}

// measure runs op under cfg for cfg.Duration and counts, besides the
// harness's totals, the operations that ended inside that window. pick, when
// set, chooses each operation's key in place of the harness. hot, when
// set, is the key whose operations are counted apart from the others'.
//
// The deadline stops new operations, never one in flight: an operation cut
// short could have committed without being counted, and the invariant
// compares every counted success with the table. So the operations in flight
// at the deadline run on (the drain) and count as successes; they are left
// out of InWindow, which is what the throughput divides by the window.
func measure(ctx context.Context, cfg harness.Config, op harness.Op, pick picker, hot string) outcome {
	var (
		inWindow, hotInWindow stdatomic.Int64
		picked                perKey
		coldMu                sync.Mutex // protects cold
		cold                  []time.Duration
	)
	began := time.Now()
	end := began.Add(cfg.Duration)
	whole := func(ctx context.Context, key string) error {
		if pick != nil {
			key = pick(key, time.Since(began), cfg.Duration)
		}
		start := time.Now()
		err := op(context.WithoutCancel(ctx), key)
		if pick != nil {
			picked.add(key, err)
		}
		if (err == nil || errors.Is(err, contend.ErrConflict)) && time.Now().Before(end) {
			inWindow.Add(1)
			if hot != "" && key == hot {
				hotInWindow.Add(1)
			}
		}
		if hot != "" && key != hot {
			took := time.Since(start)
			coldMu.Lock()
			cold = append(cold, took)
			coldMu.Unlock()
		}
		return err
	}
	res := harness.Local(ctx, cfg, whole)
	if pick != nil {
		// The harness counts each operation under the key it chose; the
		// invariant needs the key the operation went to.
		res.PerKey = picked.m
	}
	slices.Sort(cold)
	return outcome{Result: res, InWindow: inWindow.Load(), Window: cfg.Duration, HotInWindow: hotInWindow.Load(), ColdLatencies: cold}
}

// perKey counts operations by key, as the harness does.
type perKey struct {
	mu sync.Mutex // protects m
	m  map[string]harness.Count
}

func (p *perKey) add(key string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]harness.Count{}
	}
	c := p.m[key]
	switch {
	case err == nil:
		c.Successes++
	case errors.Is(err, contend.ErrConflict):
		c.Conflicts++
	default:
		c.Errors++
	}
	p.m[key] = c
}

// merge adds o's counts to out.
func (out *outcome) merge(o outcome) {
	out.Successes += o.Successes
	out.Conflicts += o.Conflicts
	out.Errors += o.Errors
	if out.PerKey == nil {
		out.PerKey = map[string]harness.Count{}
	}
	for k, c := range o.PerKey {
		sum := out.PerKey[k]
		sum.Successes += c.Successes
		sum.Conflicts += c.Conflicts
		sum.Errors += c.Errors
		out.PerKey[k] = sum
	}
	out.Latencies = append(out.Latencies, o.Latencies...)
	out.FirstErrors = append(out.FirstErrors, o.FirstErrors...)
	out.Elapsed = max(out.Elapsed, o.Elapsed)
	out.Retries += o.Retries
	out.Split += o.Split
	out.Modes.Hot += o.Modes.Hot
	out.Modes.HotLocked += o.Modes.HotLocked
	out.Modes.Cold += o.Modes.Cold
	out.Modes.ColdLocked += o.Modes.ColdLocked
	out.Modes.Flips += o.Modes.Flips
	out.Modes.LockedAfter = max(out.Modes.LockedAfter, o.Modes.LockedAfter)
	// The processes start together and time the same window.
	out.InWindow += o.InWindow
	out.Window = max(out.Window, o.Window)
	out.HotInWindow += o.HotInWindow
	out.ColdLatencies = append(out.ColdLatencies, o.ColdLatencies...)
	slices.Sort(out.Latencies)
	slices.Sort(out.ColdLatencies)
}

// check compares what the operations reported with what the table shows and
// records any difference in r.
func check(ctx context.Context, admin *sqlx.DB, r *row, out outcome) error {
	var broken []string
	switch operation(r.Workload) {
	case stormWorkload:
		var err error
		if broken, err = checkStorm(ctx, admin, out); err != nil {
			return err
		}
	case "decrement":
		var rows []struct {
			ID    string `db:"id"`
			Stock int64  `db:"stock"`
		}
		if err := admin.SelectContext(ctx, &rows, `SELECT id, stock FROM products`); err != nil {
			return fmt.Errorf("check: %w", err)
		}
		var oversold, unaccounted, negative int64
		for _, p := range rows {
			sold := int64(out.PerKey[p.ID].Successes)
			taken := initialStock - p.Stock
			oversold += max(0, sold-taken)
			unaccounted += max(0, taken-sold)
			if p.Stock < 0 {
				negative++
			}
		}
		if oversold > 0 {
			broken = append(broken, fmt.Sprintf("oversold %d", oversold))
		}
		if unaccounted > 0 {
			broken = append(broken, fmt.Sprintf("%d decrements no caller saw", unaccounted))
		}
		if negative > 0 {
			broken = append(broken, fmt.Sprintf("%d keys below zero", negative))
		}
	case "claim":
		var rows []struct {
			ID      string `db:"id"`
			Claimed bool   `db:"claimed"`
		}
		if err := admin.SelectContext(ctx, &rows, `SELECT id, owner IS NOT NULL AS claimed FROM jobs`); err != nil {
			return fmt.Errorf("check: %w", err)
		}
		var double, phantom, unaccounted int
		for _, j := range rows {
			won := out.PerKey[j.ID].Successes
			double += max(0, won-1)
			if won > 0 && !j.Claimed {
				phantom++
			}
			if won == 0 && j.Claimed {
				unaccounted++
			}
		}
		if double > 0 {
			broken = append(broken, fmt.Sprintf("claimed twice %d", double))
		}
		if phantom > 0 {
			broken = append(broken, fmt.Sprintf("%d claims the table does not show", phantom))
		}
		if unaccounted > 0 {
			broken = append(broken, fmt.Sprintf("%d claims no caller saw", unaccounted))
		}
	}
	r.Violation = strings.Join(broken, ", ")
	return nil
}

// warm opens the pool's connections before the cell starts, so that the
// first operations do not pay for the connection handshakes.
func warm(ctx context.Context, db *sqlx.DB, n int) error {
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		if err := c.PingContext(ctx); err != nil {
			return err
		}
	}
	return nil
}

// median is the run of a cell with the median throughput, carrying every
// run's errors and broken invariants: one bad round fails the cell.
func median(runs []row) row {
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b row) int { return cmp.Compare(a.Throughput, b.Throughput) })
	m := sorted[len(sorted)/2]
	m.Errors = 0
	var broken []string
	for _, r := range runs {
		m.Errors += r.Errors
		if m.FirstError == "" {
			m.FirstError = r.FirstError
		}
		if r.Violation != "" && !slices.Contains(broken, r.Violation) {
			broken = append(broken, r.Violation)
		}
	}
	m.Violation = strings.Join(broken, "; ")
	return m
}
