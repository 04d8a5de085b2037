// Package workers runs a program's load from several OS processes at once,
// the way the examples show what happens when "several servers" share a
// database: the program re-executes itself; each copy connects, says it is
// ready, starts when every copy is ready, and reports back as JSON. (Tests do
// the same through internal/harness, which re-executes the test binary.)
package workers

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

const readyLine = "ready"

// Spawn starts n copies of this program with env added to its environment
// (the copies find their orders there), waits until every copy is ready,
// starts them together, and returns what each reported.
func Spawn[R any](ctx context.Context, n int, env []string) ([]R, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	procs := make([]proc, n)
	defer func() {
		// A copy that failed said why on stderr; its missing report has
		// already failed the run.
		for _, p := range procs {
			if p.cmd != nil {
				p.stdin.Close()
				_ = p.cmd.Wait()
			}
		}
	}()
	for i := range procs {
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = Environ(env...)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs[i] = proc{cmd, stdin, bufio.NewReader(stdout)}
	}
	// Every copy connects first and says so; then all start together, so
	// the load is concurrent rather than in the order the copies booted.
	for i, p := range procs {
		if line, err := p.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != readyLine {
			return nil, fmt.Errorf("worker process %d did not get ready: %q: %v", i, line, err)
		}
	}
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			return nil, err
		}
	}
	reports := make([]R, n)
	for i, p := range procs {
		if err := json.NewDecoder(p.out).Decode(&reports[i]); err != nil {
			return nil, fmt.Errorf("worker process %d report: %w", i, err)
		}
	}
	return reports, nil
}

// Environ returns the environment of a copy of this program: this
// process's, with extra ("NAME=value") added, and the GORACE of
// [QuickRaceExit].
func Environ(extra ...string) []string {
	env := append(os.Environ(), extra...)
	if gorace, ok := QuickRaceExit(); ok {
		env = append(env, "GORACE="+gorace)
	}
	return env
}

// QuickRaceExit returns the GORACE under which a copy of this program exits
// at once: under the race detector a process sleeps for GORACE's
// atexit_sleep_ms (default 1s) as it exits, so that races in goroutines
// still running can be reported. A copy is waited for until it exits, and
// its work is over by then (a test binary's copy has also checked that no
// goroutine is left), so the sleep only costs every start of a set of copies
// a second. ok is false when this process's GORACE already says how long the
// sleep is: it is left alone.
func QuickRaceExit() (gorace string, ok bool) {
	gorace = os.Getenv("GORACE")
	if strings.Contains(gorace, "atexit_sleep_ms") {
		return "", false
	}
	return strings.TrimSpace(gorace + " atexit_sleep_ms=0"), true
}

// Ready is a copy's side of the start: it tells the parent this copy is
// connected and waits until the parent starts every copy.
func Ready(in io.Reader, out io.Writer) error {
	if _, err := fmt.Fprintln(out, readyLine); err != nil {
		return err
	}
	_, err := bufio.NewReader(in).ReadString('\n')
	return err
}

// Report writes a copy's report for [Spawn] to collect.
func Report(out io.Writer, report any) error { return json.NewEncoder(out).Encode(report) }
