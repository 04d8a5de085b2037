package harness

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/contend/contend/internal/workers"
)

// A Child is the test binary run again as a process of its own, running one
// test, for a test to kill, stop or watch: a holder that dies with its lock
// held, or freezes past its lease. The child learns its part from the
// environment the parent gives it, and says how far it got by printing
// lines, which the parent reads with [Child.Next].
type Child struct {
	// Cmd is the running process: signal it with Cmd.Process.
	Cmd   *exec.Cmd
	lines chan string
}

// StartChild starts the test binary again, running only the top-level test
// named test (the part of t.Name() before any '/'), with env ("NAME=value")
// added to its environment. The child is killed, and waited for, when t
// ends.
func StartChild(t testing.TB, test string, env ...string) *Child {
	t.Helper()
	name, _, _ := strings.Cut(test, "/")
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(name)+"$", "-test.count=1", "-test.v=false", "-test.timeout=2m")
	cmd.Env = workers.Environ(env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("harness: child %s: %v", name, err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("harness: child %s: %v", name, err)
	}
	c := &Child{Cmd: cmd, lines: make(chan string, 64)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for range c.lines {
		}
	})
	return c
}

// Next waits, up to within, for the child's next line that starts with
// prefix, skipping the others (the test framework's own), and returns the
// rest of it. It fails t if the child ends or says nothing of the kind in
// time.
func (c *Child) Next(t testing.TB, prefix string, within time.Duration) string {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("harness: the child process ended before saying %q", prefix)
			}
			if rest, found := strings.CutPrefix(l, prefix); found {
				return rest
			}
		case <-timeout:
			t.Fatalf("harness: the child process did not say %q within %v", prefix, within)
		}
	}
}
