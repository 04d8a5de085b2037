package testserver

import (
	"context"
	"fmt"
	"os/exec"
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
type OwnedRedis struct{ *owned }

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
	d, err := newRedisDaemon(extra...)
	if err != nil {
		t.Fatal(err)
	}
	return &OwnedRedis{own(t, d)}
}

// newRedisDaemon is how a throwaway redis-server runs, with extra
// arguments, in a fresh directory of its own.
func newRedisDaemon(extra ...string) (daemon, error) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		return daemon{}, fmt.Errorf("testserver: redis-server not found (Debian: apt-get install redis-server): %w", err)
	}
	dir, err := makeDir("contend-redis-owned-", nil)
	if err != nil {
		return daemon{}, err
	}
	return redisDaemon(server, dir, extra...), nil
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
