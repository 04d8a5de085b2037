package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// OwnedRedis is a redis-server that belongs to one test: the test may stop it
// and start it again on the same port, as in "Redis restarted while a lock is
// held" or "two of five nodes are down". It runs without persistence, so a
// restart loses every key, as a real restart without AOF does.
//
// The shared server that [Redis] hands out must never be stopped: other tests
// and other engineers use it.
type OwnedRedis struct {
	d    daemon
	port int
	p    *process // nil while stopped
}

// OwnRedis starts a throwaway redis-server for t alone, on a free port of
// 127.0.0.1, from the locally installed binary (the one startRedis uses). It
// is stopped and its directory removed when t ends. It fails t when no server
// can be started.
func OwnRedis(t testing.TB) *OwnedRedis {
	t.Helper()
	return ownRedis(t)
}

// ownRedis is OwnRedis, with extra arguments for redis-server.
func ownRedis(t testing.TB, extra ...string) *OwnedRedis {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testserver: redis-server not found (Debian: apt-get install redis-server): %v", err)
	}
	dir, err := makeDir("contend-redis-owned-", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &OwnedRedis{d: redisDaemon(server, dir, extra...)}
	t.Cleanup(func() {
		if err := errors.Join(r.Stop(), removeDir(dir)); err != nil {
			t.Errorf("testserver: owned redis: %v", err)
		}
	})
	// The port is free when picked but may be taken before the server binds
	// it; one more port then, as launch does.
	for attempt := 1; ; attempt++ {
		if r.port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		if err = r.Start(); err == nil {
			return r
		}
		if attempt == 2 {
			t.Fatalf("testserver: owned redis: %v", err)
		}
	}
}

// redisDaemon is how startRedis runs redis-server, with its files in dir,
// and extra arguments after its own.
func redisDaemon(server, dir string, extra ...string) daemon {
	return daemon{
		name: "redis-server",
		path: server,
		args: func(port int) []string {
			// --dir keeps anything the server writes inside the directory
			// stop removes; --daemonize no in case a default config says yes.
			return append([]string{"--save", "", "--appendonly", "no",
				"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
				"--daemonize", "no", "--dir", dir}, extra...)
		},
		dir:        dir,
		stopSignal: syscall.SIGTERM,
		url: func(port int) string {
			return fmt.Sprintf("redis://127.0.0.1:%d/0", port)
		},
		ready: func(ctx context.Context, url string) error {
			return redisReady(ctx, url, dir)
		},
	}
}

// Addr is the server's host:port; it stays the same across restarts.
func (r *OwnedRedis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL is the server's redis:// URL.
func (r *OwnedRedis) URL() string { return r.d.url(r.port) }

// Client returns a new client of the server, closed when t ends. Its options
// are go-redis's defaults, so it reconnects by itself after a restart.
func (r *OwnedRedis) Client(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// Running reports whether the server is up (as far as this type knows).
func (r *OwnedRedis) Running() bool { return r.p != nil }

// Stop shuts the server down and waits for it; its keys are gone. Stopping a
// stopped server does nothing.
func (r *OwnedRedis) Stop() error {
	if r.p == nil {
		return nil
	}
	err := r.p.halt()
	r.p = nil
	return err
}

// Kill ends the server at once with SIGKILL, as a crash or a lost machine
// does: it answers nothing more and says goodbye to nobody. Killing a
// stopped server does nothing.
func (r *OwnedRedis) Kill() error {
	if r.p == nil {
		return nil
	}
	p := r.p
	r.p = nil
	if err := p.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("testserver: kill redis-server: %w", err)
	}
	_ = p.cmd.Wait() // "signal: killed"
	return nil
}

// Start starts the stopped server again, on the same port, empty, and waits
// until it answers. Starting a running server does nothing.
func (r *OwnedRedis) Start() error {
	if r.p != nil {
		return nil
	}
	p, err := r.d.start(r.port, filepath.Join(r.d.dir, r.d.name+".log"))
	if err != nil {
		return err
	}
	exited, err := p.waitReady(r.Addr(), r.URL(), r.d.ready)
	if err != nil {
		if !exited {
			err = errors.Join(err, p.halt())
		}
		return err
	}
	r.p = p
	return nil
}

// Restart stops the server and starts it again on the same port: every
// connection is dropped and every key is lost.
func (r *OwnedRedis) Restart() error {
	if err := r.Stop(); err != nil {
		return err
	}
	return r.Start()
}
