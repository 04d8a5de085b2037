package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	load "github.com/contend/contend/internal/workload"
)

// The test binary doubles as the worker processes, as the program does.
func TestMain(m *testing.M) {
	if isWorker() {
		os.Exit(workerMain())
	}
	testserver.Main(m)
}

// The smoke run CI executes, in-process: every strategy holds its invariant
// on every workload it runs, the naive control included (one process), and
// the report and charts are written.
func TestQuickGrid(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	o := quick(Options{Out: out})
	rows, err := Run(t.Context(), o)
	require.NoError(t, err)
	// Every strategy of the run (the default ones, and a few on MariaDB)
	// but pessimistic-noqueue, oracle and the retry storm's on the hot key and
	// spread keys from 8 workers, for decrement and claim; shift's
	// strategies on the spread keys only, and the think workloads' and the
	// retry storm's too.
	base, shift, think, storm := 0, 0, 0, 0
	for _, s := range o.Strategies {
		switch {
		case slices.Contains(stormStrategies, s):
			storm++
		case s != "pessimistic-noqueue" && s != "oracle":
			base++
		}
		if slices.Contains(shiftStrategies, s) {
			shift++
		}
		if slices.Contains(thinkStrategies, s) {
			think++
		}
	}
	require.Len(t, rows, 2*2*base+shift+3*think+storm)
	require.Equal(t, len(stormStrategies), storm)
	onMaria := map[string]int{} // library cells on MariaDB, by workload
	for _, r := range rows {
		// A MariaDB strategy is measured against the floor on its server.
		if onMariaDB(r.Strategy) && r.Strategy != "raw-mariadb" {
			onMaria[r.Workload]++
			f, ok := sibling(rows, r, "raw-mariadb")
			require.True(t, ok, "%s: no raw-mariadb beside it", r.name())
			if f.Throughput > 0 {
				require.Equal(t, fmt.Sprintf("%.2f", r.Throughput/f.Throughput), vsRaw(rows, r), r.name())
			}
		}
		require.Empty(t, r.Skipped, r.name())
		if r.Strategy == "check-then-insert" {
			// The control: two copies of a request at once both find no
			// effect, in all but a rare cell.
			require.Contains(t, r.verdict(), "expected", r.name())
		} else {
			require.Empty(t, r.Violation, r.name())
		}
		require.Zero(t, r.Errors, "%s: %s", r.name(), r.FirstError)
		require.Positive(t, r.Successes, r.name())
		// ops/s × the window counts the operations that ended inside it:
		// never more than all of them. (It may be 0 on a loaded machine,
		// when not one operation ended inside a short window.)
		require.LessOrEqual(t, r.Throughput*o.Duration.Seconds(), float64(r.Successes+r.Conflicts)+1e-9, r.name())
		require.False(t, r.failed(), r.name())
	}
	for _, wl := range allWorkloads {
		if wl != stormWorkload { // PostgreSQL only
			require.Positive(t, onMaria[wl], "%s: no strategy ran on MariaDB", wl)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "- shift, spread(100)→hot, 8 worker(s) × 1 process(es), total ops/s: raw ")
	require.Contains(t, string(md), "- shift, spread(100)→hot, 8 worker(s) × 1 process(es), total ops/s: raw-mariadb ")
	require.Contains(t, string(md), ", MariaDB ")
	for _, f := range []string{"results.md", "decrement.svg", "claim.svg", "shift.svg", "shift.png", "retry-storm.svg"} {
		fi, err := os.Stat(filepath.Join(out, f))
		require.NoError(t, err)
		require.Positive(t, fi.Size(), f)
	}
}

// A chart draws each strategy over every worker count the grid ran, with a
// tick for each count in every panel and the strategy once in the legend
// (the quick grid runs one count only).
func TestChartOverWorkerCounts(t *testing.T) {
	t.Parallel()
	var rows []row
	for _, keys := range []int{1, 100} {
		for _, w := range []int{1, 8, 64} {
			for i, s := range []string{"raw", "atomic"} {
				rows = append(rows, row{cell: cell{Workload: "decrement", Strategy: s, Keys: keys, Workers: w, Processes: 1},
					Throughput: float64(1000 * (i + 1) * w), P99: time.Duration(w) * time.Millisecond})
			}
		}
	}
	path := filepath.Join(t.TempDir(), "decrement.svg")
	require.NoError(t, writeChart(path, "decrement", rows))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	svg := string(data)
	// Two key choices by two metrics: four panels, each with its own ticks.
	for _, tick := range []string{">8<", ">64<"} {
		require.Equal(t, 4, strings.Count(svg, tick), "ticks %s", tick)
	}
	for _, s := range []string{">raw<", ">atomic<"} {
		require.Equal(t, 1, strings.Count(svg, s), "legend %s", s)
	}
}

// Across processes the naive mutex keeps only its own process's goroutines
// apart: the suite must see the lost updates, mark them as the control's
// expected break, and still pass the strategies that hold.
func TestNaiveBreaksAcrossProcesses(t *testing.T) {
	t.Parallel()
	rows, err := Run(t.Context(), Options{
		Duration:   400 * time.Millisecond,
		Workers:    []int{8},
		Keys:       []int{1},
		Strategies: []string{"atomic", "naive"},
		Processes:  3,
	})
	require.NoError(t, err)
	// Both strategies on decrement and claim; shift has no cell on one key.
	require.Len(t, rows, 2*2)
	for _, r := range rows {
		switch {
		case r.Strategy == "naive" && r.Workload == "decrement":
			// Lost updates on one hot row are all but certain in 400ms;
			// a double claim needs the first race of a key to overlap,
			// so the claim workload's control may hold, and is not
			// required to break.
			require.NotEmpty(t, r.Violation, "%s held across processes: the check cannot see a break", r.name())
			require.Contains(t, r.verdict(), "expected")
		case r.Strategy == "naive":
		default:
			require.Empty(t, r.Violation, r.name())
		}
		require.False(t, r.failed(), "%s: %s", r.name(), r.verdict())
	}
}

// The cells a run adds from several processes, the hot key's decrement and
// mixed: the naive control loses updates in both, and the strategy holds.
func TestAcrossCells(t *testing.T) {
	t.Parallel()
	rows, err := Run(t.Context(), Options{
		Duration:   800 * time.Millisecond,
		Workers:    []int{8},
		Keys:       []int{1},
		Workloads:  []string{"decrement", "mixed"},
		Strategies: []string{"pessimistic", "naive"},
		Across:     3,
	})
	require.NoError(t, err)
	// decrement on the hot key from one process, then both workloads
	// from three; mixed runs on spread keys only, so not in this grid's
	// one-process cells.
	var across []string
	for _, r := range rows {
		if r.Processes == 3 {
			across = append(across, r.Workload+"/"+r.Strategy)
			if r.Strategy == "naive" {
				require.NotEmpty(t, r.Violation, "%s held across processes: the check cannot see a break", r.name())
				require.Contains(t, r.verdict(), "expected")
			}
		}
		if r.Strategy != "naive" || r.Processes == 1 {
			require.Empty(t, r.Violation, r.name())
		}
		require.False(t, r.failed(), "%s: %s", r.name(), r.verdict())
	}
	require.Len(t, rows, 2+4)
	require.ElementsMatch(t, []string{"decrement/pessimistic", "decrement/naive", "mixed/pessimistic", "mixed/naive"}, across)
	mixed := slices.IndexFunc(rows, func(r row) bool { return r.Workload == "mixed" && r.Strategy == "pessimistic" })
	require.Positive(t, rows[mixed].HotThroughput)
	require.Positive(t, rows[mixed].ColdP99)
}

// The invariant is checked against the table on the cell's server: on
// MariaDB, a sale or a claim the table does not show is seen.
func TestCheckOnMariaDB(t *testing.T) {
	t.Parallel()
	db, err := openMariaDB(testserver.MariaDB(t))
	require.NoError(t, err)
	defer db.Close()
	ctx := t.Context()
	admins := servers{mariadb: db}
	for _, wl := range []string{"decrement", "claim"} {
		c := cell{Workload: wl, Strategy: "raw-mariadb", Keys: 1, Workers: 1, Processes: 1}
		require.NoError(t, createTable(ctx, admins.of(c.Strategy), mariadbSQL, wl, c.keys()))
		op := rawOp(db, mariadbSQL, wl)
		require.NoError(t, op(ctx, load.Hot))
		out := outcome{}
		// What a lost update reports: two wins, one write.
		out.PerKey = map[string]harness.Count{load.Hot: {Successes: 2}}
		r := row{cell: c}
		require.NoError(t, check(ctx, admins.of(c.Strategy), &r, out))
		require.Equal(t, map[string]string{"decrement": "oversold 1", "claim": "claimed twice 1"}[wl], r.Violation)
		out.PerKey[load.Hot] = harness.Count{Successes: 1}
		r = row{cell: c}
		require.NoError(t, check(ctx, admins.of(c.Strategy), &r, out))
		require.Empty(t, r.Violation, wl)
	}
}

// A broken invariant fails the run, except for the naive control across
// processes; errors always fail it.
func TestVerdicts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r      row
		failed bool
	}{
		{row{cell: cell{Strategy: "atomic", Processes: 1}}, false},
		{row{cell: cell{Strategy: "atomic", Processes: 3}, Violation: "oversold 2"}, true},
		{row{cell: cell{Strategy: "naive", Processes: 3}, Violation: "oversold 2"}, false},
		{row{cell: cell{Strategy: "naive", Processes: 1}, Violation: "oversold 2"}, true},
		{row{cell: cell{Strategy: "check-then-insert", Processes: 1}, Violation: "3 duplicate effects"}, false},
		{row{cell: cell{Strategy: "idempotency", Processes: 1}, Violation: "3 duplicate effects"}, true},
		{row{cell: cell{Strategy: "naive", Processes: 3}, Errors: 1}, true},
		{row{cell: cell{Strategy: "queue", Processes: 3}, Skipped: "one process"}, false},
	} {
		require.Equal(t, tc.failed, tc.r.failed(), "%+v", tc.r)
	}
}

func TestBadOptions(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{Workers: []int{0}},
		{Keys: []int{-1}},
		{Strategies: []string{"mutex"}},
		{Workloads: []string{"sell"}},
		{Processes: -1},
		{Rounds: -1},
		{Duration: -time.Second},
		{Workloads: []string{"shift"}, Keys: []int{1}}, // no cell: nothing to shift
	} {
		_, err := Run(t.Context(), o)
		require.Error(t, err, "%+v", o)
	}
	_, err := parseInts("1,x")
	require.Error(t, err)
}

// A cell's median round carries every round's broken invariants and errors.
func TestMedian(t *testing.T) {
	t.Parallel()
	m := median([]row{
		{Throughput: 30},
		{Throughput: 10, Violation: "oversold 1", Errors: 1, FirstError: "boom"},
		{Throughput: 20},
	})
	require.Equal(t, 20.0, m.Throughput)
	require.Equal(t, "oversold 1", m.Violation)
	require.Equal(t, 1, m.Errors)
	require.Equal(t, "boom", m.FirstError)
}

// The summary sets distlock beside the polling loop of its own cell only.
func TestLockSummary(t *testing.T) {
	t.Parallel()
	hot := func(strategy string, workers, processes int, ops float64, p99 time.Duration) row {
		return row{cell: cell{Workload: "decrement", Strategy: strategy, Keys: 1, Workers: workers, Processes: processes}, Throughput: ops, P99: p99}
	}
	rows := []row{
		hot("distlock", 16, 4, 3000, 40*time.Millisecond),
		hot("poll", 16, 4, 1500, 240*time.Millisecond),
		hot("distlock", 64, 4, 3000, 130*time.Millisecond), // no poll in this cell
		hot("poll", 64, 1, 500, time.Second),               // another cell: one process
		{cell: cell{Workload: "decrement", Strategy: "distlock", Keys: 1000, Workers: 16, Processes: 4}, Throughput: 9000},
		{cell: cell{Workload: "decrement", Strategy: "poll", Keys: 1000, Workers: 16, Processes: 4}, Throughput: 9000},
	}
	require.Equal(t, "- decrement, hot key, 16 worker(s) × 4 process(es): distlock at 2.00× the 1 ms polling loop, p99 40.00 against 240.00 ms.\n", lockSummary(rows))
	require.Contains(t, summary(rows), "distlock at 2.00×")
	require.Empty(t, lockSummary(rows[2:]))
}

// ops/s is the operations that ended inside the timed window over the
// window's length. The operations in flight at the deadline still finish and
// count as successes (the invariant needs every one), but neither they nor
// the time they run on into the drain are part of the rate; dividing every
// operation by the whole elapsed time, drain included, gets it wrong both ways.
func TestThroughputExcludesTheDrain(t *testing.T) {
	t.Parallel()
	const window, goroutines, quick = 200 * time.Millisecond, 4, 10
	began := time.Now()
	var calls atomic.Int64
	op := func(context.Context, string) error {
		if calls.Add(1) <= quick {
			return nil
		}
		// Each goroutine's next operation is in flight at the deadline
		// and ends well after it.
		time.Sleep(time.Until(began.Add(window + 100*time.Millisecond)))
		return nil
	}
	var r row
	r.fill(measure(t.Context(), harness.Config{Goroutines: goroutines, Duration: window}, op, nil, ""))
	require.Equal(t, quick+goroutines, r.Successes, "the drained operations count as successes")
	require.Equal(t, float64(quick)/window.Seconds(), r.Throughput, "only those that ended in the window count in ops/s")
}

// lost % never rounds a few wins or a few losses away.
func TestLostShare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ok, lost int
		want     string
	}{
		{0, 0, "-"},
		{10, 0, "0.0%"},
		{1, 3, "75.0%"},
		{1, 3413, ">99.9%"},
		{0, 3414, "100.0%"},
		{3413, 1, "<0.1%"},
	} {
		require.Equal(t, tc.want, lostShare(row{Successes: tc.ok, Conflicts: tc.lost}), "%d ok, %d lost", tc.ok, tc.lost)
	}
}

// The shift workload's picker keeps the harness's spread key for the first
// half of the window and sends everything to the hot key after it.
func TestShiftPicker(t *testing.T) {
	t.Parallel()
	c := cell{Workload: "shift", Keys: 100, Workers: 8}
	pick := c.picker()
	require.NotNil(t, pick)
	require.Nil(t, cell{Workload: "decrement", Keys: 100}.picker())
	const window = 800 * time.Millisecond
	for _, tc := range []struct {
		key     string
		elapsed time.Duration
		want    string
	}{
		{"k42", 0, "k42"},
		{"k7", window/2 - time.Nanosecond, "k7"},
		{"k42", window / 2, "k0"},
		{"k7", window, "k0"},
		{"k7", 2 * window, "k0"}, // the drain
	} {
		require.Equal(t, tc.want, pick(tc.key, tc.elapsed, window), "%s at %v", tc.key, tc.elapsed)
	}
	require.Equal(t, "k0", c.keys()[0])
}

// Under measure, the shift really shifts: no operation that started in the
// first half went to the hot key, and after the half only the few already
// picked before it (one per goroutine at most) went anywhere else. The
// per-key counts the invariant is checked against follow the key each
// operation went to, not the one the harness chose.
func TestMeasureShifts(t *testing.T) {
	t.Parallel()
	const window, goroutines, hot = 200 * time.Millisecond, 4, "hot"
	type call struct {
		key string
		at  time.Time
	}
	var (
		mu    sync.Mutex
		calls []call
	)
	op := func(_ context.Context, key string) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, call{key, time.Now()})
		return nil
	}
	cfg := harness.Config{Goroutines: goroutines, Duration: window, Keys: load.Keys("k", 10), Spread: true}
	// measure's window opens between before and the first operation: a
	// loaded machine may pause the test anywhere in between, so each bound
	// on the half is taken from the side that keeps it sure.
	before := time.Now()
	out := measure(t.Context(), cfg, op, shiftPicker(hot), "")
	first := calls[0].at

	perKey := map[string]int{}
	spreadLate := 0
	for _, c := range calls {
		perKey[c.key]++
		switch {
		case c.at.Before(before.Add(window / 2)):
			require.NotEqual(t, hot, c.key, "an operation at %v, before the half, went to the hot key", c.at.Sub(before))
		case !c.at.Before(first.Add(window/2)) && c.key != hot:
			spreadLate++
		}
	}
	require.LessOrEqual(t, spreadLate, goroutines, "operations after the half that went to a spread key")
	require.Positive(t, perKey[hot], "no operation went to the hot key")
	require.Greater(t, len(perKey), 2, "the first half did not spread")
	require.Equal(t, len(calls), out.Successes)
	require.Len(t, out.PerKey, len(perKey))
	for k, n := range perKey {
		require.Equal(t, n, out.PerKey[k].Successes, k)
	}
}

// The adaptive guard's lines set it beside pessimistic on the hot key,
// beside the optimistic guard on spread keys, and beside every strategy of
// its shift cell, saying whether it beat both fixed guards.
func TestAdaptiveSummary(t *testing.T) {
	t.Parallel()
	at := func(wl, strategy string, keys int, ops float64, p99 time.Duration) row {
		return row{cell: cell{Workload: wl, Strategy: strategy, Keys: keys, Workers: 64, Processes: 1}, Throughput: ops, P99: p99}
	}
	rows := []row{
		at("decrement", "pessimistic", 1, 1000, 100*time.Millisecond),
		at("decrement", "adaptive", 1, 950, 105*time.Millisecond),
		at("decrement", "optimistic-guard", 1000, 4000, 20*time.Millisecond),
		at("decrement", "adaptive", 1000, 4200, 19*time.Millisecond),
		at("claim", "adaptive", 1, 5000, time.Millisecond), // not a target: no line
		at("claim", "pessimistic", 1, 5000, time.Millisecond),
		at("shift", "raw", 1000, 9000, time.Millisecond),
		at("shift", "pessimistic", 1000, 2000, time.Millisecond),
		at("shift", "optimistic-guard", 1000, 2500, time.Millisecond),
		at("shift", "adaptive", 1000, 3000, time.Millisecond),
	}
	require.Equal(t, "- decrement, hot key, 64 worker(s) × 1 process(es): adaptive at 0.95× pessimistic, p99 105.00 against 100.00 ms.\n"+
		"- decrement, spread(1000), 64 worker(s) × 1 process(es): adaptive at 1.05× optimistic-guard, p99 19.00 against 20.00 ms.\n"+
		"- shift, spread(1000)→hot, 64 worker(s) × 1 process(es), total ops/s: raw 9000, pessimistic 2000, optimistic-guard 2500, adaptive 3000; "+
		"adaptive at 1.20× the better fixed guard (optimistic-guard): it beats both fixed guards.\n",
		adaptiveSummary(rows))
	rows[len(rows)-1].Throughput = 2400
	require.Contains(t, adaptiveSummary(rows), "adaptive at 0.96× the better fixed guard (optimistic-guard): it does not beat both fixed guards.")
	require.Contains(t, summary(rows), "adaptive at 0.95× pessimistic")
}

// The retry storm: the store and the unique insert keep one effect per
// request and answer every copy alike, from one process and from several;
// the check-then-insert control shows duplicates and split answers, and
// they do not fail the run.
func TestRetryStorm(t *testing.T) {
	t.Parallel()
	for _, procs := range []int{1, 2} {
		rows, err := Run(t.Context(), Options{
			Duration:  300 * time.Millisecond,
			Workers:   []int{8},
			Keys:      []int{1, 100},
			Workloads: []string{stormWorkload},
			Processes: procs,
		})
		require.NoError(t, err)
		require.Len(t, rows, len(stormStrategies), "one cell per strategy: the key counts do not apply")
		for _, r := range rows {
			require.Zero(t, r.Errors, "%s: %s", r.name(), r.FirstError)
			require.Positive(t, r.Successes, r.name())
			require.False(t, r.failed(), "%s: %s", r.name(), r.verdict())
			if r.Strategy == "check-then-insert" {
				require.Contains(t, r.Violation, "duplicate effects", r.name())
				require.Contains(t, r.Violation, "answered two ways", r.name())
				continue
			}
			require.Empty(t, r.Violation, r.name())
			if r.Strategy == "idempotency" {
				// Its ×raw is over unique-insert's (ops/s may be 0 on a
				// loaded machine, when no request ended inside the window).
				_, ok := sibling(rows, r, floor(r.Strategy))
				require.True(t, ok, "%s: no unique-insert beside it", r.name())
				require.Equal(t, "unique-insert", floor(r.Strategy))
			}
		}
	}
}
