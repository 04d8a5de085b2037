package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
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
	ready := func() error {
		if _, err := fmt.Fprintln(out, "ready"); err != nil {
			return err
		}
		_, err := bufio.NewReader(in).ReadString('\n')
		return err
	}
	o, err := runLocal(context.Background(), a.Env, a.Cell, a.Cell.keys(), a.Duration, ready)
	if err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(o)
}

// spawn runs c's load in c.Processes worker processes, started together once
// every one is connected, and sums what they report.
func spawn(ctx context.Context, e env, c cell, d time.Duration) (outcome, error) {
	self, err := os.Executable()
	if err != nil {
		return outcome{}, err
	}
	assigned, err := json.Marshal(assignment{Env: e, Cell: c, Duration: d})
	if err != nil {
		return outcome{}, err
	}
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	procs := make([]proc, c.Processes)
	defer func() {
		// A worker that failed said why on stderr, and its missing report
		// already failed the cell.
		for _, p := range procs {
			if p.cmd != nil {
				p.stdin.Close()
				_ = p.cmd.Wait()
			}
		}
	}()
	for i := range procs {
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), workerEnv+"="+string(assigned))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return outcome{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return outcome{}, err
		}
		if err := cmd.Start(); err != nil {
			return outcome{}, err
		}
		procs[i] = proc{cmd, stdin, bufio.NewReader(stdout)}
	}
	for _, p := range procs {
		if line, err := p.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
			return outcome{}, fmt.Errorf("worker process did not get ready: %q: %w", line, errors.Join(err, errNotReady))
		}
	}
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			return outcome{}, err
		}
	}
	var total outcome
	for _, p := range procs {
		var o outcome
		if err := json.NewDecoder(p.out).Decode(&o); err != nil {
			return outcome{}, fmt.Errorf("worker process report: %w", err)
		}
		total.merge(o)
	}
	return total, nil
}

var errNotReady = errors.New("worker process not ready")
