package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/contend/contend/internal/workers"
)

// workerEnv carries a worker process's assignment: a re-executed copy of this
// program (or of its test binary) that finds it runs one cell's load and
// reports, instead of the suite.
const workerEnv = "CONTEND_BENCH_WORKER"

// assignment is what a worker process runs.
type assignment struct {
	Env      env           `json:"env"`
	Cell     cell          `json:"cell"`
	Duration time.Duration `json:"duration"`
}

func isWorker() bool { return os.Getenv(workerEnv) != "" }

// workerMain runs this process as a worker and returns its exit code.
func workerMain() int {
	if err := work(os.Getenv(workerEnv), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		return 1
	}
	return 0
}

// work connects, says "ready", waits for "go" on in, runs the load and writes
// its outcome to out as JSON. Separate processes are the point: a
// process-local lock keeps its own goroutines apart and nothing else.
func work(assigned string, in io.Reader, out io.Writer) error {
	var a assignment
	if err := json.Unmarshal([]byte(assigned), &a); err != nil {
		return fmt.Errorf("assignment: %w", err)
	}
	ready := func() error { return workers.Ready(in, out) }
	o, err := runLocal(context.Background(), a.Env, a.Cell, a.Cell.keys(), a.Duration, ready)
	if err != nil {
		return err
	}
	return workers.Report(out, o)
}

// spawn runs c's load in c.Processes worker processes, started together once
// every one is connected, and sums what they report.
func spawn(ctx context.Context, e env, c cell, d time.Duration) (outcome, error) {
	assigned, err := json.Marshal(assignment{Env: e, Cell: c, Duration: d})
	if err != nil {
		return outcome{}, err
	}
	reports, err := workers.Spawn[outcome](ctx, c.Processes, []string{workerEnv + "=" + string(assigned)})
	if err != nil {
		return outcome{}, err
	}
	var total outcome
	for _, o := range reports {
		total.merge(o)
	}
	return total, nil
}
