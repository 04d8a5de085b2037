package testserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"
)

const (
	// readyTimeout bounds the wait for a throwaway server to accept
	// connections; initdb is not included.
	readyTimeout = 30 * time.Second
	// stopTimeout is how long a server gets to shut down cleanly before its
	// whole process group is killed.
	stopTimeout = 5 * time.Second
	// pollInterval is short because a server typically becomes ready within
	// a few hundred milliseconds and every test binary waits for it.
	pollInterval = 20 * time.Millisecond
	// logTailBytes limits how much of a server's log an error carries.
	logTailBytes = 8 << 10
)

// postgresLibDir is where Debian installs the server binaries, one directory
// per major version, off PATH.
const postgresLibDir = "/usr/lib/postgresql"

// startPostgres starts a throwaway PostgreSQL server from the locally installed
// binaries in a fresh temporary directory on a free 127.0.0.1 port, waits until
// it accepts connections, and returns its URL
// ("postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable") and a stop
// function that shuts it down (fast shutdown, then kill after a few seconds)
// and removes the directory. stop is idempotent.
func startPostgres() (url string, stop func() error, err error) {
	d, err := initPostgres("contend-postgres-")
	if err != nil {
		return "", nil, err
	}
	return launch(d)
}

// initPostgres creates a data directory with initdb in a fresh temporary
// directory named after prefix and returns how to run a server on it.
func initPostgres(prefix string) (daemon, error) {
	initdb, postgres, err := postgresBinaries()
	if err != nil {
		return daemon{}, err
	}
	cred, err := serverCredential()
	if err != nil {
		return daemon{}, err
	}
	dir, err := makeDir(prefix, cred)
	if err != nil {
		return daemon{}, err
	}
	data := filepath.Join(dir, "data")
	// --locale=C because the locale in the environment may not be installed,
	// which makes initdb fail; C works with UTF8 and sorts the same everywhere.
	cmd := exec.Command(initdb, "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	// The unprivileged user may not be able to enter the caller's directory.
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return daemon{}, errors.Join(
			fmt.Errorf("testserver: initdb: %w\n%s", err, strings.TrimSpace(string(out))),
			removeDir(dir))
	}
	return postgresDaemon(postgres, dir, data, cred), nil
}

// postgresDaemon is how startPostgres runs postgres on the data directory
// data, inside dir.
func postgresDaemon(postgres, dir, data string, cred *syscall.Credential) daemon {
	return daemon{
		name: "postgres",
		path: postgres,
		args: func(port int) []string {
			return []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir,
				"-c", "listen_addresses=127.0.0.1",
				"-c", "fsync=off",
				"-c", "synchronous_commit=off",
				"-c", "full_page_writes=off",
				// Tests open about 200 connections at once.
				"-c", "max_connections=300",
			}
		},
		dir:  dir,
		cred: cred,
		// SIGINT is PostgreSQL's fast shutdown: it does not wait for clients
		// to disconnect, unlike SIGTERM, and unlike SIGKILL it removes the
		// System V shared memory segment and lets the backends exit.
		stopSignal: syscall.SIGINT,
		url: func(port int) string {
			return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
		},
		ready: func(ctx context.Context, url string) error {
			return postgresReady(ctx, url, data)
		},
	}
}

// startRedis: the same for redis-server ("redis://127.0.0.1:PORT/0"), started
// with --save "" --appendonly no --bind 127.0.0.1 --port PORT, in the foreground (not daemonized)
// as a child process.
func startRedis() (url string, stop func() error, err error) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, fmt.Errorf("testserver: redis-server not found: %w", err)
	}
	dir, err := makeDir("contend-redis-", nil)
	if err != nil {
		return "", nil, err
	}
	return launch(redisDaemon(server, dir))
}

// daemon describes how to run one kind of throwaway server.
type daemon struct {
	name       string // for messages and the log file's name
	path       string
	args       func(port int) []string
	dir        string              // removed by stop
	cred       *syscall.Credential // nil: run as this process's user
	stopSignal syscall.Signal      // asks the server to shut down cleanly
	url        func(port int) string
	// ready returns nil once the server at url accepts requests and is the
	// one this process started.
	ready func(ctx context.Context, url string) error
}

// launch starts d on a free port, waits until it is ready, and returns its URL
// and the function that stops it and removes d.dir. On failure d.dir is
// removed too.
func launch(d daemon) (string, func() error, error) {
	logPath := filepath.Join(d.dir, d.name+".log")
	// The port is free when picked but may be taken before the server binds
	// it; a server that exits instead of becoming ready gets one more port.
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return "", nil, errors.Join(err, removeDir(d.dir))
		}
		p, err := d.start(port, logPath)
		if err != nil {
			return "", nil, errors.Join(err, removeDir(d.dir))
		}
		url := d.url(port)
		exited, err := p.waitReady(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), url, d.ready)
		if err == nil {
			var once sync.Once
			var stopErr error
			return url, func() error {
				once.Do(func() { stopErr = errors.Join(p.halt(), removeDir(d.dir)) })
				return stopErr
			}, nil
		}
		if !exited {
			// The log is read first: the error carries it.
			err = fmt.Errorf("%w\n%s log:\n%s", err, d.name, p.logTail())
			return "", nil, errors.Join(err, p.halt(), removeDir(d.dir))
		}
		if attempt == 2 {
			return "", nil, errors.Join(err, removeDir(d.dir))
		}
	}
}

// start runs the server on port in the background, its output appended to
// logPath.
func (d daemon) start(port int, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testserver: %w", err)
	}
	// The child has its own descriptor once started.
	defer logFile.Close()
	cmd := exec.Command(d.path, d.args(port)...)
	cmd.Dir = d.dir
	// Files, not writers, so that no goroutine copies the output.
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: d.cred,
		// A test binary that dies without calling stop takes its servers
		// with it. Go sets the signal after switching to Credential, which
		// would otherwise clear it. The kernel sends it when the thread that
		// started the server exits, which the Go runtime only does for a
		// goroutine that exits while locked to its thread.
		Pdeathsig: d.stopSignal,
		// Out of the terminal's process group, so that Ctrl-C reaches the
		// server once, through Pdeathsig, rather than alongside it; and so
		// that halt can kill the server together with its children.
		Setpgid: true,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testserver: start %s: %w", d.name, err)
	}
	return &process{cmd: cmd, name: d.name, logPath: logPath, stopSignal: d.stopSignal}, nil
}

// process is a started server.
type process struct {
	cmd        *exec.Cmd
	name       string
	logPath    string
	stopSignal syscall.Signal
}

// waitReady polls until ready accepts the server at url, listening on addr,
// the server exits (exited is true, and the server has been waited for), or
// readyTimeout passes (exited is false, and the server still runs).
func (p *process) waitReady(addr, url string, ready func(context.Context, string) error) (exited bool, err error) {
	deadline := time.Now().Add(readyTimeout)
	for {
		if p.exited() {
			err := p.cmd.Wait()
			return true, fmt.Errorf("testserver: %s exited before accepting connections (%v); its log:\n%s",
				p.name, err, p.logTail())
		}
		probeErr := probe(addr, url, ready)
		if probeErr == nil {
			return false, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("testserver: %s did not accept connections on %s within %s: %w",
				p.name, addr, readyTimeout, probeErr)
		}
		time.Sleep(pollInterval)
	}
}

// probe checks the port first because it is cheap and quiet; the request
// proves the server answers rather than merely listens.
func probe(addr, url string, ready func(context.Context, string) error) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return ready(ctx, url)
}

// exited reports whether the server has exited, without reaping it, so that
// cmd.Wait still collects its status and no goroutine has to block in Wait
// while the server runs.
func (p *process) exited() bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	// With WNOHANG, Linux leaves si_signo zero while the child runs.
	return err == nil && info.Signo == int32(syscall.SIGCHLD)
}

// halt asks the server to shut down, kills its process group if it has not
// within stopTimeout, and waits for it.
func (p *process) halt() error {
	done := make(chan error, 1)
	// An error means the server has already exited; Wait reports how.
	_ = p.cmd.Process.Signal(p.stopSignal)
	// Wait has no timeout; stop receives from done on every path, so this
	// goroutine does not outlive it.
	go func() { done <- p.cmd.Wait() }()
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("testserver: %s exited with %w; its log:\n%s", p.name, err, p.logTail())
		}
		return nil
	case <-timer.C:
		// The group, because PostgreSQL backends outlive a killed postmaster
		// until they next notice it is gone.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("testserver: %s did not shut down within %s and was killed; its log:\n%s",
			p.name, stopTimeout, p.logTail())
	}
}

// logTail returns the end of the server's log, for error messages.
func (p *process) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	if len(b) > logTailBytes {
		b = append([]byte("..."), b[len(b)-logTailBytes:]...)
	}
	return strings.TrimSpace(string(b))
}

// postgresReady runs a query on the server at url and checks that it serves
// data, the directory of the server this process started: another server
// that took the port between freePort and the bind would answer too.
func postgresReady(ctx context.Context, url, data string) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	var one int
	var served string
	if err := db.QueryRowContext(ctx, "SELECT 1, current_setting('data_directory')").Scan(&one, &served); err != nil {
		return err
	}
	return sameDir(served, data)
}

// redisReady is postgresReady for Redis, whose --dir identifies the server.
func redisReady(ctx context.Context, url, dir string) error {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	// The caller polls; retries inside the client would only delay it, as
	// would the 3 s ReadTimeout against a port someone else holds.
	opts.MaxRetries = -1
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return err
	}
	cfg, err := client.ConfigGet(ctx, "dir").Result()
	if err != nil {
		return err
	}
	return sameDir(cfg["dir"], dir)
}

// sameDir compares by identity, not by name, because servers resolve symbolic
// links in the paths they report.
func sameDir(served, want string) error {
	a, errA := os.Stat(served)
	b, errB := os.Stat(want)
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		return fmt.Errorf("testserver: the server on the port serves %q, not %q: another server took the port", served, want)
	}
	return nil
}

// postgresBinaries finds initdb and postgres on PATH, else in the newest
// version directory under postgresLibDir.
func postgresBinaries() (initdb, postgres string, err error) {
	initdb, errInitdb := exec.LookPath("initdb")
	postgres, errPostgres := exec.LookPath("postgres")
	if errInitdb == nil && errPostgres == nil {
		return initdb, postgres, nil
	}
	if bin := newestPostgresBin(); bin != "" {
		// Both from the same version: a postgres of another major version
		// refuses initdb's data directory.
		return filepath.Join(bin, "initdb"), filepath.Join(bin, "postgres"), nil
	}
	var missing []string
	if errInitdb != nil {
		missing = append(missing, "initdb")
	}
	if errPostgres != nil {
		missing = append(missing, "postgres")
	}
	return "", "", fmt.Errorf("testserver: %s not found on PATH or in %s/*/bin",
		strings.Join(missing, " and "), postgresLibDir)
}

// newestPostgresBin returns the bin directory of the highest version under
// postgresLibDir that has both initdb and postgres, or "".
func newestPostgresBin() string {
	dirs, _ := filepath.Glob(filepath.Join(postgresLibDir, "*", "bin"))
	dirs = slices.DeleteFunc(dirs, func(bin string) bool {
		return !isExecutable(filepath.Join(bin, "initdb")) || !isExecutable(filepath.Join(bin, "postgres"))
	})
	if len(dirs) == 0 {
		return ""
	}
	// Numerically, so that 10 is newer than 9.6.
	version := func(bin string) []int {
		var v []int
		for _, f := range strings.Split(filepath.Base(filepath.Dir(bin)), ".") {
			n, _ := strconv.Atoi(f)
			v = append(v, n)
		}
		return v
	}
	return slices.MaxFunc(dirs, func(a, b string) int { return slices.Compare(version(a), version(b)) })
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// serverCredential returns the user to run PostgreSQL as, which refuses to run
// as root, or nil to run it as this process's user.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("testserver: PostgreSQL does not run as root and neither user postgres nor nobody exists: %w", err)
		}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("testserver: uid of %s: %w", u.Username, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("testserver: gid of %s: %w", u.Username, err)
	}
	// No supplementary groups: Go then drops root's.
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// makeDir creates a fresh temporary directory, owned by cred's user when
// given, because the server creates its data directory and socket in it.
func makeDir(prefix string, cred *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", fmt.Errorf("testserver: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", errors.Join(fmt.Errorf("testserver: %w", err), removeDir(dir))
		}
	}
	return dir, nil
}

func removeDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("testserver: %w", err)
	}
	return nil
}

// freePort returns a port nothing listens on at the moment. It is a variable
// so that a test can hand out a taken one.
var freePort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testserver: pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
