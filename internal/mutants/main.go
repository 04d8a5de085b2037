// Command mutants checks that the tests keep the library's promises: it
// plants each bug of a curated list (list.go), one at a time, in a copy of
// the tree, runs the tests named to catch it, and reports whether they did.
//
//	go run ./internal/mutants                     # every mutant
//	go run ./internal/mutants -run 'distlock/'    # those whose name matches
//	go run ./internal/mutants -short              # the cheap few CI runs
//	go run ./internal/mutants -list               # print the list
//	go run ./internal/mutants -baseline -run X    # the named tests on the unchanged tree
//	go run ./internal/mutants -run X -tests TestY # mutant X against other tests
//
// Each mutant ends as one of:
//
//	caught       a named test failed (the first failing one is reported)
//	SURVIVED     the named tests passed with the bug in place
//	HUNG         the tests ran past -timeout: a wait without a bound
//	NOT APPLIED  the mutant's original text is not in its file exactly once:
//	             the code was rewritten, and the mutant must be too
//	NO BUILD     the mutated tree does not compile: the mutant is wrong
//	NO TESTS     -run matched no test
//
// It exits with status 1 unless every mutant was caught. The copy is of the
// working tree, uncommitted changes and new files included (git ls-files
// --cached --others --exclude-standard), so a test being written counts.
// Test binaries are built with -trimpath, so that every copy shares the
// build cache, and run in a process group of their own, killed whole when
// the run ends: the tests start child processes and servers.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.run, "run", "", "run only the mutants whose name matches this regexp")
	flag.BoolVar(&o.short, "short", false, "run only the mutants marked Short: the subset CI runs")
	flag.StringVar(&o.tests, "tests", "", "run these tests instead of each mutant's own (a -test.run pattern), to try a new test")
	flag.BoolVar(&o.list, "list", false, "print the mutants selected and exit")
	flag.BoolVar(&o.baseline, "baseline", false, "run each selected mutant's tests on the unchanged tree: they must pass")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "bound on each mutant's test run (its build is not counted)")
	flag.IntVar(&o.jobs, "j", 1, "mutants run at once, each in a copy of its own")
	flag.StringVar(&o.status, "status", "", "rewrite this file with the results so far after each mutant")
	flag.StringVar(&o.logs, "logs", "", "write each mutant's test output to DIR/<name>.txt")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "mutants: unexpected arguments:", flag.Args())
		os.Exit(2)
	}
	ok, err := run(o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

type options struct {
	run      string
	tests    string
	short    bool
	list     bool
	baseline bool
	timeout  time.Duration
	jobs     int
	status   string
	logs     string
}

// A mutant is one planted bug: Old, which must occur exactly once in File,
// becomes New, and a test of Run in Pkg must then fail.
type mutant struct {
	Name   string // unique, "<package>/<what>": -run selects by it
	File   string // slash-separated, from the repository's root
	Old    string // the original text, found exactly once in File
	New    string // what replaces it
	Pkg    string // the package whose tests catch it, "./atomic"
	Run    string // the tests' -test.run pattern
	Breaks string // the promise the bug breaks, in one line
	// Race builds the tests with -race: for a bug only the race detector
	// shows.
	Race bool
	// Short puts the mutant in the subset -short runs (CI): cheap tests,
	// several packages.
	Short bool
	// Timeout replaces -timeout for a mutant whose tests take longer.
	Timeout time.Duration
}

// Outcomes of a mutant's run.
const (
	caught     = "caught"
	survived   = "SURVIVED"
	hung       = "HUNG"
	notApplied = "NOT APPLIED"
	noBuild    = "NO BUILD"
	noTests    = "NO TESTS"
	// Of -baseline.
	passed = "passed"
	failed = "FAILED"
)

// A result is what one mutant's run came to.
type result struct {
	m       mutant
	outcome string
	test    string        // the first failing test, or the tests still running when it hung
	detail  string        // the failure's first line, or why it did not run
	build   time.Duration // of the test binary
	took    time.Duration // of the test run
}

// ok reports whether the result is what the run wants.
func (r result) ok(baseline bool) bool {
	if baseline {
		return r.outcome == passed
	}
	return r.outcome == caught
}

func run(o options, out io.Writer) (bool, error) {
	if err := checkList(mutants); err != nil {
		return false, err
	}
	sel, err := selectMutants(mutants, o.run, o.short)
	if err != nil {
		return false, err
	}
	if o.tests != "" {
		if _, err := regexp.Compile(o.tests); err != nil {
			return false, fmt.Errorf("-tests: %w", err)
		}
		for i := range sel {
			sel[i].Run = o.tests
		}
	}
	if len(sel) == 0 {
		return false, errors.New("no mutant matches -run")
	}
	if o.list {
		for _, m := range sel {
			fmt.Fprintf(out, "%-40s %s  (%s -run '%s')\n", m.Name, m.Breaks, m.Pkg, m.Run)
		}
		return true, nil
	}
	if o.jobs < 1 {
		return false, errors.New("-j must be at least 1")
	}
	root, err := gitRoot()
	if err != nil {
		return false, err
	}
	files, err := trackedFiles(root)
	if err != nil {
		return false, err
	}
	tmp, err := os.MkdirTemp("", "contend-mutants-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	if o.logs != "" {
		if err := os.MkdirAll(o.logs, 0o755); err != nil {
			return false, err
		}
	}

	began := time.Now()
	rep := &report{out: out, status: o.status, baseline: o.baseline, all: sel, done: map[string]result{}}
	rep.writeStatus()
	work := make(chan mutant)
	var wg sync.WaitGroup
	for w := range min(o.jobs, len(sel)) {
		dir := filepath.Join(tmp, fmt.Sprint("w", w))
		tree := filepath.Join(dir, "tree")
		if err := copyTree(root, tree, files); err != nil {
			return false, err
		}
		wg.Go(func() {
			for m := range work {
				rep.add(runMutant(o, m, dir, tree))
			}
		})
	}
	for _, m := range sel {
		work <- m
	}
	close(work)
	wg.Wait()
	return rep.finish(time.Since(began)), nil
}

// checkList refuses a list with a duplicate or empty name, or a mutant
// missing a field.
func checkList(ms []mutant) error {
	seen := map[string]bool{}
	for _, m := range ms {
		switch {
		case m.Name == "" || m.File == "" || m.Old == "" || m.Pkg == "" || m.Run == "" || m.Breaks == "":
			return fmt.Errorf("mutant %q: Name, File, Old, Pkg, Run and Breaks are required", m.Name)
		case m.Old == m.New:
			return fmt.Errorf("mutant %s: New is Old", m.Name)
		case seen[m.Name]:
			return fmt.Errorf("mutant %s: listed twice", m.Name)
		}
		if _, err := regexp.Compile(m.Run); err != nil {
			return fmt.Errorf("mutant %s: -run: %w", m.Name, err)
		}
		seen[m.Name] = true
	}
	return nil
}

func selectMutants(ms []mutant, pattern string, short bool) ([]mutant, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("-run: %w", err)
	}
	var sel []mutant
	for _, m := range ms {
		if re.MatchString(m.Name) && (!short || m.Short) {
			sel = append(sel, m)
		}
	}
	return sel, nil
}

func gitRoot() (string, error) {
	b, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("find the repository's root (run inside it): %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// trackedFiles lists the files of the working tree that belong to the
// project: tracked, or new and not ignored.
func trackedFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	seen := map[string]bool{}
	var files []string
	for _, f := range strings.Split(string(b), "\x00") {
		if f != "" && !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	return files, nil
}

// copyTree copies files (relative to root) into dst; a tracked file deleted
// in the working tree is left out, as it is from a build there.
func copyTree(root, dst string, files []string) error {
	for _, f := range files {
		src := filepath.Join(root, filepath.FromSlash(f))
		info, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		to := filepath.Join(dst, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			b, err := os.ReadFile(src)
			if err != nil {
				return err
			}
			if err := os.WriteFile(to, b, info.Mode().Perm()); err != nil {
				return err
			}
		}
	}
	return nil
}

// apply returns src with m planted, or an error when m's original text is
// not in it exactly once.
func apply(m mutant, src []byte) ([]byte, error) {
	switch n := bytes.Count(src, []byte(m.Old)); n {
	case 1:
		return bytes.Replace(src, []byte(m.Old), []byte(m.New), 1), nil
	case 0:
		return nil, fmt.Errorf("%s: the original text is not there: the code changed, update the mutant", m.File)
	default:
		return nil, fmt.Errorf("%s: the original text is there %d times: make it longer, to pick one", m.File, n)
	}
}

// runMutant plants m in tree, builds and runs its tests, and puts the file
// back. dir is the worker's, for the test binary and the tests' TMPDIR.
func runMutant(o options, m mutant, dir, tree string) result {
	r := result{m: m}
	file := filepath.Join(tree, filepath.FromSlash(m.File))
	orig, err := os.ReadFile(file)
	if err != nil {
		r.outcome, r.detail = notApplied, err.Error()
		return r
	}
	mutated, err := apply(m, orig)
	if err != nil {
		r.outcome, r.detail = notApplied, err.Error()
		return r
	}
	if !o.baseline {
		if err := os.WriteFile(file, mutated, 0o644); err != nil {
			r.outcome, r.detail = noBuild, err.Error()
			return r
		}
		defer os.WriteFile(file, orig, 0o644)
	}

	bin := filepath.Join(dir, "pkg.test")
	defer os.Remove(bin)
	args := []string{"test", "-c", "-trimpath", "-o", bin}
	if m.Race {
		args = append(args, "-race")
	}
	start := time.Now()
	build := exec.Command("go", append(args, m.Pkg)...)
	build.Dir = tree
	msg, err := build.CombinedOutput()
	r.build = time.Since(start)
	if err != nil {
		r.outcome, r.detail = noBuild, firstLines(string(msg), 3)
		return r
	}

	timeout := o.timeout
	if m.Timeout > 0 {
		timeout = m.Timeout
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		r.outcome, r.detail = noBuild, err.Error()
		return r
	}
	defer os.RemoveAll(tmp)
	output, took, killed, err := runTests(bin, filepath.Join(tree, filepath.FromSlash(m.Pkg)), tmp, m.Run, timeout)
	r.took = took
	if o.logs != "" {
		_ = os.WriteFile(filepath.Join(o.logs, strings.ReplaceAll(m.Name, "/", "_")+".txt"), output, 0o644)
	}
	r.outcome, r.test, r.detail = judge(string(output), killed, err, o.baseline)
	return r
}

// runTests runs the test binary bin in dir with -test.run pattern, in a
// process group of its own. Past timeout the binary panics with the
// goroutines' stacks (-test.timeout); if it is not gone 20 s later, the
// group is killed. After the run, whatever is left of the group (the tests'
// child processes) is killed too.
func runTests(bin, dir, tmp, pattern string, timeout time.Duration) (output []byte, took time.Duration, killed bool, err error) {
	out, err := os.CreateTemp(tmp, "output-")
	if err != nil {
		return nil, 0, false, err
	}
	defer out.Close()
	cmd := exec.Command(bin, "-test.run="+pattern, "-test.count=1", "-test.timeout="+timeout.String())
	cmd.Dir = dir
	// A file, not a pipe: a child process that outlives the binary would
	// hold a pipe open, and Wait with it.
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, 0, false, err
	}
	pgid := cmd.Process.Pid
	var mu sync.Mutex
	watchdog := time.AfterFunc(timeout+20*time.Second, func() {
		mu.Lock()
		killed = true
		mu.Unlock()
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
	err = cmd.Wait()
	took = time.Since(start)
	watchdog.Stop()
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // the children left behind
	mu.Lock()
	defer mu.Unlock()
	output, rerr := os.ReadFile(out.Name())
	if rerr != nil {
		return nil, took, killed, rerr
	}
	return output, took, killed, err
}

var (
	failLine    = regexp.MustCompile(`^\s*--- FAIL: (\S+) \(`)
	runningLine = regexp.MustCompile(`^\s+(\S+) \([0-9.hms]+\)$`)
	locLine     = regexp.MustCompile(`^\s*(\S+\.go:\d+): ?(.*)$`)
)

// judge reads a test run's output: err is the binary's exit, killed tells
// that the watchdog ended it.
func judge(output string, killed bool, err error, baseline bool) (outcome, test, detail string) {
	test, detail = firstFailure(output)
	if killed || strings.Contains(output, "panic: test timed out after") {
		running := runningTests(output)
		d := "still running: " + strings.Join(running, ", ")
		if test != "" {
			d += "; failed first: " + test + ": " + detail
		}
		if len(running) > 0 {
			return hung, running[0], d
		}
		return hung, test, d
	}
	if strings.Contains(output, "testing: warning: no tests to run") {
		return noTests, "", "-run matches no test of the package"
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return noBuild, "", err.Error()
	}
	if err == nil {
		if baseline {
			return passed, "", ""
		}
		return survived, "", "every named test passed with the bug in place"
	}
	if test == "" {
		// Not a test's failure: TestMain's checks (goroutines left
		// behind, servers that did not stop), a panic outside a test.
		test, detail = "(no test failed)", lastLines(output, 2)
	}
	if baseline {
		return failed, test, detail
	}
	return caught, test, detail
}

// firstFailure returns the first failing test of output, descending into its
// failing subtests, and the first line it logged.
func firstFailure(output string) (test, detail string) {
	lines := strings.Split(output, "\n")
	at := -1
	for i, l := range lines {
		m := failLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		switch {
		case test == "":
			test, at = m[1], i
		case strings.HasPrefix(m[1], test+"/"):
			test, at = m[1], i
		}
	}
	if test == "" {
		return "", ""
	}
	return test, failureDetail(lines[at+1:])
}

// failureDetail is the first message of a failure's log: the file and line,
// and testify's "Error:" (with the two lines after it: expected and actual)
// and "Messages:" when the line has none.
func failureDetail(log []string) string {
	var loc string
	var msg []string
	more := 0 // continuation lines of testify's Error still wanted
	for _, l := range log {
		if failLine.MatchString(l) || strings.HasPrefix(strings.TrimSpace(l), "=== ") {
			break
		}
		if loc == "" {
			if m := locLine.FindStringSubmatch(l); m != nil {
				loc = m[1]
				if text := strings.TrimSpace(m[2]); text != "" {
					msg = append(msg, text)
					break
				}
			}
			continue
		}
		// testify: "\tKey:   \tvalue", a continuation "\t      \tvalue".
		var key, value string
		if parts := strings.SplitN(l, "\t", 3); len(parts) == 3 {
			key, value = strings.TrimSpace(parts[1]), strings.TrimSpace(parts[2])
		}
		switch {
		case key == "Error:":
			msg, more = append(msg, value), 2
		case key == "Messages:":
			msg = append(msg, value)
		case key == "" && more > 0 && value != "":
			msg, more = append(msg, value), more-1
		default:
			more = 0
		}
		if key == "Messages:" {
			break
		}
	}
	d := loc + ": " + strings.Join(strings.Fields(strings.Join(msg, " ")), " ")
	if len(d) > 240 {
		d = d[:240] + "…"
	}
	return d
}

// runningTests lists the tests a timed-out binary reported still running,
// the innermost of each nest.
func runningTests(output string) []string {
	_, after, ok := strings.Cut(output, "running tests:\n")
	if !ok {
		return nil
	}
	var names []string
	sc := bufio.NewScanner(strings.NewReader(after))
	for sc.Scan() {
		m := runningLine.FindStringSubmatch(sc.Text())
		if m == nil {
			break
		}
		names = append(names, m[1])
	}
	var leaves []string
	for i, n := range names {
		inner := false
		for j, o := range names {
			if j != i && strings.HasPrefix(o, n+"/") {
				inner = true
				break
			}
		}
		if !inner {
			leaves = append(leaves, n)
		}
	}
	return leaves
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[:min(n, len(lines))], " | ")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// report prints each result as it comes, keeps the status file, and prints
// the table at the end.
type report struct {
	out      io.Writer
	status   string
	baseline bool
	all      []mutant

	mu   sync.Mutex
	done map[string]result
}

func (p *report) add(r result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done[r.m.Name] = r
	fmt.Fprintln(p.out, line(r))
	p.writeStatus()
}

func line(r result) string {
	s := fmt.Sprintf("%-11s %5.1fs  %-40s", r.outcome, r.took.Seconds(), r.m.Name)
	if r.test != "" {
		s += "  " + r.test
	}
	if r.detail != "" {
		s += "  — " + r.detail
	}
	return s
}

// writeStatus rewrites the status file with what is done and what is not.
// Called with p.mu held, or before any worker starts.
func (p *report) writeStatus() {
	if p.status == "" {
		return
	}
	var b strings.Builder
	kind := "mutants"
	if p.baseline {
		kind = "baseline (unchanged tree)"
	}
	fmt.Fprintf(&b, "# %s, %d of %d done, %s\n", kind, len(p.done), len(p.all), time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "# outcome  test-seconds  mutant  first-failing-test  — detail  (build seconds)\n")
	for _, m := range p.all {
		r, ok := p.done[m.Name]
		if !ok {
			fmt.Fprintf(&b, "%-11s %6s  %s\n", "pending", "", m.Name)
			continue
		}
		fmt.Fprintf(&b, "%s  (build %.0fs)\n", line(r), r.build.Seconds())
	}
	_ = os.WriteFile(p.status, []byte(b.String()), 0o644)
}

// finish prints the summary and reports whether every result is what the
// run wants.
func (p *report) finish(took time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	counts := map[string]int{}
	ok := true
	var bad []string
	for _, m := range p.all {
		r := p.done[m.Name]
		counts[r.outcome]++
		if !r.ok(p.baseline) {
			ok = false
			bad = append(bad, line(r))
		}
	}
	var parts []string
	for _, k := range []string{caught, passed, survived, hung, failed, notApplied, noBuild, noTests} {
		if counts[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
		}
	}
	fmt.Fprintf(p.out, "\n%d mutants in %.0fs: %s\n", len(p.all), took.Seconds(), strings.Join(parts, ", "))
	if len(bad) > 0 {
		want := "caught"
		if p.baseline {
			want = "passing"
		}
		fmt.Fprintf(p.out, "not %s:\n", want)
		for _, l := range bad {
			fmt.Fprintln(p.out, "  "+l)
		}
	}
	return ok
}
