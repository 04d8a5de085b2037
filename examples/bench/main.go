// Command bench is contend's end-to-end benchmark suite: the same
// workloads under every strategy, in one run, with the numbers and a chart
// that say which strategy to pick.
//
// The workloads are "decrement stock if available" (a products
// table; every sale must show in the stock: nothing oversold, no lost update)
// and "claim a job once" (a jobs table; exactly one caller
// may claim each job). Each runs on one hot key and on keys spread at random,
// from 1, 8 and 64 goroutines, and optionally from several processes at once,
// under each strategy through its natural API. A third, "shift", is a
// decrement whose keys are spread for the first half of each cell and all
// one key for the second, as when a sale starts: it runs on the spread key
// counts, from more than one goroutine, under raw, pessimistic, the two
// optimistic strategies and adaptive only.
//
// Three more are where the guards differ in a service: a decrement whose fn
// waits 2 ms between its read and its write (a call to another service),
// each process on a pool of 10 connections, from the run's largest worker
// count (64 by default; at least 8), on spread keys: "think"; "mixed", with 30% of the calls on one hot key and
// the rest on the others (the report gives the hot key's ops/s and the cold
// keys' p99 apart); and "shift-think", shift with the wait. They run raw
// (the locked transaction written by hand), pessimistic, pessimistic-noqueue,
// optimistic-guard, adaptive and naive.
//
// The last, "retry-storm", is where a request is retried: each operation
// is a request of its own, sent three times (two copies at once, the third
// after them), whose effect is a row; exactly one per request, and every
// copy answered alike, is its invariant. It runs on PostgreSQL, on the
// spread key count only (its keys are its requests), from 8 workers and
// more, under strategies of
// its own: idempotency (idempotency.Store.Do around the effect's INSERT),
// unique-insert (the INSERT under a unique index, by hand: its floor) and
// check-then-insert (a SELECT, then the INSERT: its negative control, which
// makes duplicates).
//
// The hot key's decrement (8 workers each) and mixed (64 each) run again
// from -across processes at once (3 by default), the several instances of a
// service sharing one database: there the naive control loses updates, and
// every strategy must still hold.
//
//	raw               the bare conditional UPDATE through database/sql: the floor
//	atomic            atomic.Update / Claimer.Claim
//	pessimistic       pessimistic.Locker.Do around a read-check-write
//	pessimistic-noqueue  the same with LockerConfig.NoLocalQueue: every waiter
//	                  for a held row holds a connection (think workloads only)
//	optimistic        optimistic.Store.Update (version check, retry)
//	optimistic-guard  optimistic.Guard.Do around the read-check-write
//	adaptive          adaptive.Guard.Do around it: optimistic per key while
//	                  its races are rare, under the row lock while frequent
//	oracle            the reference adaptive is measured against, not a
//	                  strategy to use: it knows the workload's hot key and runs
//	                  it under the pessimistic Locker, every other key under
//	                  the optimistic Guard (mixed, shift and shift-think only)
//	distlock          distlock.Client.Do around the read-check-write
//	poll              SET NX PX retried every 1 ms, around it: the bare polling loop (a peer)
//	redislock         bsm/redislock around the same read-check-write (a peer)
//	redsync           go-redsync/redsync around it (a peer)
//	queue             an in-memory queue whose partition consumers batch the
//	                  pending operations into one statement (one process only)
//	naive             a sync.Mutex around the read-check-write: the negative
//	                  control, which holds within one process and breaks across
//	                  several
//
// On MariaDB, through package mysqldb, with the statements in MySQL's syntax
// (not in the default run: -mariadb adds them; -quick runs the first, the
// second and the last):
//
//	raw-mariadb               the bare conditional UPDATE: the floor of the others below
//	atomic-mariadb            atomic.Update / Claimer.Claim
//	pessimistic-mariadb       pessimistic.Locker.Do around the read-check-write
//	optimistic-guard-mariadb  optimistic.Guard.Do around it
//	adaptive-mariadb          adaptive.Guard.Do around it
//
// ×raw sets each strategy beside the floor on its own server and driver:
// raw-pgx for the -pgx strategies, raw-mariadb for the -mariadb ones, raw
// for the others (and for those two floors, which compares the servers and
// drivers themselves). shift runs the MariaDB floor and guards too.
//
// After every cell the invariant is checked against the table. A strategy
// that breaks it is marked BROKEN, and the program exits non-zero if any
// strategy does, except the naive control where it is expected to break
// (more than one process).
//
//	go run ./examples/bench                  # the default grid, about 3 minutes on 2 cores
//	go run ./examples/bench -quick           # the smoke run CI executes
//	go run ./examples/bench -processes 3 -strategies atomic,naive
//	go run ./examples/bench -rounds 3        # each cell's median of three passes over the grid
//	go run ./examples/bench -mariadb         # the default grid and the MariaDB strategies, about 3½ minutes
//
// It writes results.md and one chart per workload (SVG and PNG: throughput
// and p99 against workers, hot key beside spread keys) to -out. Servers are
// found the way the tests find them (internal/testserver): local ones, or
// throwaway ones started from local binaries and stopped at the end; MariaDB
// is the local one or CONTEND_MARIADB_URL's, never started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/contend/contend/internal/testserver"
)

// Options is one run of the suite.
type Options struct {
	// Duration is how long each cell runs. Default: 500ms, so that the
	// default grid (221 cells) takes about three minutes; a
	// longer one (-duration 2s) and more rounds give steadier ratios.
	Duration time.Duration
	// Workers are the goroutine counts, per process. Default: 1, 8, 64.
	Workers []int
	// Keys are the key counts: 1 is the hot key, more are spread at random.
	// Default: 1, 1000.
	Keys []int
	// Strategies to run. Default: defaultStrategies, every one but the
	// MariaDB ones.
	Strategies []string
	// Workloads to run. Default: all of allWorkloads.
	Workloads []string
	// Processes is how many processes run each cell at once. Default: 1.
	Processes int
	// Across, when more than one (and Processes is 1), adds cells run from
	// that many processes at once: the hot key's decrement, from 8
	// workers each, and mixed, from 64, so that the naive control's lost
	// updates show beside every strategy's invariant holding. Default: 0,
	// none (the command's -across is 3).
	Across int
	// Rounds is how often the whole grid runs; each cell reports its
	// median round by throughput. Default: 1.
	Rounds int
	// Out is the directory results.md and the charts go to; "" writes none.
	Out string
	// Command is the command line recorded in results.md.
	Command string
	// Stdout gets the table; Progress the progress display. Default: discard.
	Stdout, Progress io.Writer
	// Interactive redraws one progress line instead of printing one per cell.
	Interactive bool
}

func (o Options) withDefaults() Options {
	if o.Duration == 0 {
		o.Duration = 500 * time.Millisecond
	}
	if len(o.Workers) == 0 {
		o.Workers = []int{1, 8, 64}
	}
	if len(o.Keys) == 0 {
		o.Keys = []int{1, 1000}
	}
	if len(o.Strategies) == 0 {
		o.Strategies = defaultStrategies
	}
	if len(o.Workloads) == 0 {
		o.Workloads = allWorkloads
	}
	if o.Processes == 0 {
		o.Processes = 1
	}
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	if o.Duration < 0 {
		errs = append(errs, fmt.Errorf("duration %v is negative", o.Duration))
	}
	for _, w := range o.Workers {
		if w < 1 {
			errs = append(errs, fmt.Errorf("workers %d: want at least 1", w))
		}
	}
	for _, k := range o.Keys {
		if k < 1 {
			errs = append(errs, fmt.Errorf("keys %d: want at least 1", k))
		}
	}
	for _, s := range o.Strategies {
		if !slices.Contains(allStrategies, s) {
			errs = append(errs, fmt.Errorf("unknown strategy %q (have %s)", s, strings.Join(allStrategies, ",")))
		}
	}
	for _, w := range o.Workloads {
		if !slices.Contains(allWorkloads, w) {
			errs = append(errs, fmt.Errorf("unknown workload %q (have %s)", w, strings.Join(allWorkloads, ",")))
		}
	}
	if o.Processes < 0 {
		errs = append(errs, fmt.Errorf("processes %d is negative", o.Processes))
	}
	if o.Across < 0 {
		errs = append(errs, fmt.Errorf("across %d is negative", o.Across))
	}
	if o.Rounds < 0 {
		errs = append(errs, fmt.Errorf("rounds %d is negative", o.Rounds))
	}
	return errors.Join(errs...)
}

// quick is the smoke run's grid: every workload, under the default
// strategies and those of quickMariaDB unless the strategies are named, on
// the hot key and a few spread keys, from 8 workers (enough to contend; one
// worker would add a cell per strategy that races with nobody), short cells.
// Every invariant is still checked.
func quick(o Options) Options {
	if len(o.Strategies) == 0 {
		o.Strategies = append(slices.Clone(defaultStrategies), quickMariaDB...)
	}
	o.Duration = 100 * time.Millisecond
	o.Workers = []int{8}
	o.Keys = []int{1, 100}
	return o
}

func main() {
	if isWorker() {
		os.Exit(workerMain())
	}
	var (
		o                          Options
		workers, keys, strats, wls string
		quickRun, withMariaDB      bool
	)
	flag.DurationVar(&o.Duration, "duration", 500*time.Millisecond, "how long each cell runs")
	flag.StringVar(&workers, "workers", "1,8,64", "goroutines per process, comma-separated")
	flag.StringVar(&keys, "keys", "1,1000", "key counts, comma-separated: 1 is the hot key, more are spread")
	flag.StringVar(&strats, "strategies", "", "strategies to run, of "+strings.Join(allStrategies, ",")+
		" (default: all but the -mariadb ones)")
	flag.BoolVar(&withMariaDB, "mariadb", false, "also run the strategies on MariaDB: "+strings.Join(mariadbStrategies, ","))
	flag.StringVar(&wls, "workloads", strings.Join(allWorkloads, ","), "workloads to run")
	flag.IntVar(&o.Processes, "processes", 1, "processes running each cell at once")
	flag.IntVar(&o.Across, "across", 3, "processes of the multi-process cells (hot-key decrement, mixed); 0 for none")
	flag.IntVar(&o.Rounds, "rounds", 1, "runs of the whole grid; each cell reports its median round")
	flag.StringVar(&o.Out, "out", "examples/bench/out", `directory for results.md and the charts ("" for none)`)
	flag.BoolVar(&quickRun, "quick", false, "a short smoke run (CI): tiny cells, reduced grid (overrides -duration, -workers, -keys), every invariant checked")
	flag.Parse()

	var err error
	if o.Workers, err = parseInts(workers); err == nil {
		o.Keys, err = parseInts(keys)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	o.Strategies, o.Workloads = splitList(strats), splitList(wls)
	if quickRun {
		o = quick(o)
	}
	if withMariaDB {
		if len(o.Strategies) == 0 {
			o.Strategies = slices.Clone(defaultStrategies)
		}
		for _, s := range mariadbStrategies {
			if !slices.Contains(o.Strategies, s) {
				o.Strategies = append(o.Strategies, s)
			}
		}
	}
	o.Command = "go run ./examples/bench " + strings.Join(os.Args[1:], " ")
	o.Stdout, o.Progress = os.Stdout, os.Stderr
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		o.Interactive = true
	}

	rows, err := Run(context.Background(), o)
	if stopErr := testserver.StopAll(); err == nil {
		err = stopErr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if failed := failures(rows); len(failed) > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d cell(s) failed:\n", len(failed))
		for _, r := range failed {
			fmt.Fprintf(os.Stderr, "  %s: %s\n", r.name(), r.verdict())
		}
		os.Exit(1)
	}
}

func parseInts(list string) ([]int, error) {
	var out []int
	for _, f := range splitList(list) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", list, err)
		}
		out = append(out, n)
	}
	return out, nil
}

func splitList(list string) []string {
	var out []string
	for f := range strings.SplitSeq(list, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
