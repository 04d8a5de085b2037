package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/contend/contend/internal/workers"
)

// childEnv carries a worker process's orders from the parent test.
const childEnv = "CONTEND_HARNESS_CHILD"

// readyLine is what a worker prints once its operation is built; it starts
// operating when the parent writes a line to its standard input, so every
// process starts at once rather than in the order they happened to boot.
const readyLine = "contend-harness: ready"

// reportedLine is what a worker prints once its result is written; from then
// on it only has to clean up and exit, which the parent gives exitBound.
const reportedLine = "contend-harness: reported"

// readyBound bounds a worker's start: building its operation connects to the
// servers and makes a guard, which takes a loaded machine seconds.
const readyBound = time.Minute

// exitBound bounds a worker's clean-up after it reported: closing its guard
// and pools.
const exitBound = 30 * time.Second

type orders struct {
	Test   string            `json:"test"`
	Config Config            `json:"config"`
	Params map[string]string `json:"params"`
	Result string            `json:"result"`
}

// Params are strings a test's setup hands to every worker process: where the
// servers are, which schema and table to use.
type Params map[string]string

// Run runs the operation that newOp builds from cfg.Goroutines goroutines in
// each of cfg.Processes worker processes and returns what they did, summed.
//
// setup runs once, in the calling test process only; what it returns reaches
// newOp in every worker. Worker processes re-run the calling test (and only
// it): there Run builds the operation, runs it, reports to the parent and ends
// the test, so test code after Run runs only in the parent. Code before Run
// runs in both, so put side effects such as creating tables in setup. A test
// calls Run at most once; use subtests for more.
//
// With cfg.Processes ≤ 1 everything runs in the calling process.
func Run(t *testing.T, cfg Config, setup func() Params, newOp func(t testing.TB, p Params) Op) Result {
	t.Helper()
	if raw := os.Getenv(childEnv); raw != "" {
		var o orders
		if err := json.Unmarshal([]byte(raw), &o); err != nil {
			t.Fatalf("harness: bad orders: %v", err)
		}
		if o.Test != t.Name() {
			t.SkipNow() // another test's worker; not a skipped test of ours
		}
		runChild(t, o, newOp)
		t.SkipNow() // the worker's part is done; only the parent checks invariants
	}
	params := setup()
	if cfg.Processes <= 1 {
		res := Local(t.Context(), cfg, newOp(t, params))
		if res.Stalled != "" {
			t.Fatalf("harness: %s", res.Stalled)
		}
		return res
	}
	return runParent(t, cfg, params)
}

func runChild(t *testing.T, o orders, newOp func(testing.TB, Params) Op) {
	op := newOp(t, o.Params)
	fmt.Fprintln(os.Stdout, readyLine)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatalf("harness: waiting for the start signal: %v", err)
	}
	res := Local(t.Context(), o.Config, op)
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(o.Result, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(os.Stdout, reportedLine)
	if res.Stalled != "" {
		// The stuck calls may hold what the clean-up would wait for; the
		// parent has the report, and fails the test with it.
		os.Exit(3)
	}
}

// runName builds a -test.run pattern that matches the test called name and
// no other.
func runName(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

type child struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	ready    chan error
	reported chan struct{}   // closed once the result is written
	output   strings.Builder // guarded by mu
	mu       sync.Mutex
	result   string
	done     chan struct{} // closed once stdout is drained
}

func (c *child) log() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.output.String()
}

func runParent(t *testing.T, cfg Config, params Params) Result {
	t.Helper()
	dir := t.TempDir()
	timeout := 5 * time.Minute
	if d, ok := t.Deadline(); ok {
		timeout = time.Until(d)
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()

	children := make([]*child, cfg.Processes)
	for i := range children {
		share := cfg
		if cfg.Total > 0 {
			share.Total = cfg.Total / cfg.Processes
			if i < cfg.Total%cfg.Processes {
				share.Total++
			}
		}
		c, err := startChild(ctx, t.Name(), orders{
			Test:   t.Name(),
			Config: share,
			Params: params,
			Result: filepath.Join(dir, fmt.Sprintf("result-%d.json", i)),
		})
		if err != nil {
			t.Fatalf("harness: start worker %d: %v", i, err)
		}
		children[i] = c
		defer func() {
			_ = c.cmd.Process.Kill()
			<-c.done
			_ = c.cmd.Wait()
		}()
	}
	readyBy := time.NewTimer(readyBound)
	defer readyBy.Stop()
	for i, c := range children {
		select {
		case err := <-c.ready:
			if err != nil {
				t.Fatalf("harness: worker %d did not get ready: %v\n%s", i, err, c.log())
			}
		case <-readyBy.C:
			t.Fatalf("harness: worker %d did not get ready within %v: building its operation hangs\n%s", i, readyBound, c.log())
		case <-ctx.Done():
			t.Fatalf("harness: worker %d did not get ready in time\n%s", i, c.log())
		}
	}
	for i, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			t.Fatalf("harness: start worker %d: %v", i, err)
		}
	}
	var total Result
	for i, c := range children {
		// A worker bounds its own run (Config.Stall); once it reported, its
		// clean-up is bounded here.
		select {
		case <-c.reported:
		case <-c.done:
		}
		select {
		case <-c.done:
		case <-time.After(exitBound):
			t.Fatalf("harness: worker %d reported but did not exit within %v: its clean-up (closing the guard, the pools) hangs\n%s", i, exitBound, c.log())
		}
		werr := c.cmd.Wait()
		data, err := os.ReadFile(c.result)
		if err != nil {
			t.Fatalf("harness: worker %d left no result (%v): %v\n%s", i, werr, err, c.log())
		}
		var r Result
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatalf("harness: worker %d: %v", i, err)
		}
		if r.Stalled != "" {
			t.Fatalf("harness: worker %d: %s\n%s", i, r.Stalled, c.log())
		}
		if werr != nil {
			t.Fatalf("harness: worker %d: %v\n%s", i, werr, c.log())
		}
		total.merge(r)
	}
	sortLatencies(&total)
	return total
}

func startChild(ctx context.Context, test string, o orders) (*child, error) {
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+runName(test), "-test.count=1", "-test.v=false")
	cmd.Env = workers.Environ(childEnv + "=" + string(raw))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	c := &child{cmd: cmd, stdin: stdin, ready: make(chan error, 1), reported: make(chan struct{}), result: o.Result, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		announced := false
		for sc.Scan() {
			line := sc.Text()
			if !announced && line == readyLine {
				announced = true
				c.ready <- nil
				continue
			}
			if line == reportedLine {
				close(c.reported)
				continue
			}
			c.mu.Lock()
			c.output.WriteString(line + "\n")
			c.mu.Unlock()
		}
		if !announced {
			c.ready <- fmt.Errorf("exited before it was ready")
		}
	}()
	return c, nil
}
