package testserver

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestStartPostgres(t *testing.T) {
	begin := time.Now()
	u, stop, err := startPostgres()
	require.NoError(t, err)
	t.Logf("startPostgres took %v: %s", time.Since(begin), u)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = stop()
		}
	})
	require.True(t, strings.HasPrefix(u, "postgres://postgres@127.0.0.1:"), u)
	require.True(t, strings.HasSuffix(u, "/postgres?sslmode=disable"), u)

	for _, driver := range Drivers {
		db, err := sql.Open(driver, u)
		require.NoError(t, err, driver)
		var one int
		require.NoError(t, db.QueryRow("SELECT 1").Scan(&one), driver)
		require.Equal(t, 1, one, driver)
		require.NoError(t, db.Close())
	}
	dir := postgresDir(t, u)

	begin = time.Now()
	require.NoError(t, stop())
	stopped = true
	t.Logf("stop took %v", time.Since(begin))
	require.NoError(t, stop(), "second stop")
	requireGone(t, u, dir)
}

func TestStartPostgresManyConnections(t *testing.T) {
	u, stop := startedPostgres(t)
	_ = stop
	db, err := sql.Open("pgx", u)
	require.NoError(t, err)
	defer db.Close()
	var max string
	require.NoError(t, db.QueryRow("SHOW max_connections").Scan(&max))
	require.Equal(t, "300", max)

	ctx := context.Background()
	const n = 200
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// Each held connection forces the pool to open another one.
	for range n {
		c, err := db.Conn(ctx)
		require.NoError(t, err, "connection %d", len(conns)+1)
		conns = append(conns, c)
	}
	require.NoError(t, conns[n-1].PingContext(ctx))
}

func TestSchemaOnThrowawayPostgres(t *testing.T) {
	server, _ := startedPostgres(t)
	ctx := context.Background()
	schema, schemaURL, err := CreateSchema(ctx, server)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(schema, "contend_"), schema)

	for i, driver := range Drivers {
		db, err := sql.Open(driver, schemaURL)
		require.NoError(t, err, driver)
		var current string
		require.NoError(t, db.QueryRow("SELECT current_schema()").Scan(&current), driver)
		require.Equal(t, schema, current, driver)
		if i == 0 {
			_, err = db.Exec("CREATE TABLE t (x int)")
			require.NoError(t, err, driver)
		}
		_, err = db.Exec("INSERT INTO t VALUES ($1)", i)
		require.NoError(t, err, driver)
		require.NoError(t, db.Close())
	}

	db, err := sql.Open("pgx", server)
	require.NoError(t, err)
	defer db.Close()
	var n int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM "+schema+".t").Scan(&n))
	require.Equal(t, len(Drivers), n)

	require.NoError(t, DropSchema(ctx, server, schema))
	require.NoError(t, db.QueryRow("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n))
	require.Zero(t, n)
	require.NoError(t, DropSchema(ctx, server, schema), "dropping a dropped schema")
}

func TestStartRedis(t *testing.T) {
	begin := time.Now()
	u, stop, err := startRedis()
	require.NoError(t, err)
	t.Logf("startRedis took %v: %s", time.Since(begin), u)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = stop()
		}
	})
	require.True(t, strings.HasPrefix(u, "redis://127.0.0.1:"), u)
	require.True(t, strings.HasSuffix(u, "/0"), u)

	client := redisClient(t, u)
	ctx := context.Background()
	require.NoError(t, client.Ping(ctx).Err())
	require.NoError(t, client.Set(ctx, "contend:test:k", "v", 0).Err())
	got, err := client.Get(ctx, "contend:test:k").Result()
	require.NoError(t, err)
	require.Equal(t, "v", got)
	dir := redisDir(t, client)
	require.NoError(t, client.Close())

	begin = time.Now()
	require.NoError(t, stop())
	stopped = true
	t.Logf("stop took %v", time.Since(begin))
	require.NoError(t, stop(), "second stop")
	requireGone(t, u, dir)
}

// TestStartRetriesTakenPort hands each server a port another listener holds:
// the server exits, and the start goes on with a free port.
func TestStartRetriesTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	// The listener hangs up on whoever connects, so that a probe of the
	// taken port fails at once rather than after its timeout, and the
	// server's exit is seen at the next poll.
	hangingUp := make(chan struct{})
	go func() {
		defer close(hangingUp)
		for {
			c, err := taken.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	defer func() {
		taken.Close()
		<-hangingUp
	}()
	pick := freePort
	t.Cleanup(func() { freePort = pick })

	for _, start := range []func() (string, func() error, error){startPostgres, startRedis} {
		calls := 0
		freePort = func() (int, error) {
			calls++
			if calls == 1 {
				return taken.Addr().(*net.TCPAddr).Port, nil
			}
			return pick()
		}
		begin := time.Now()
		u, stop, err := start()
		require.NoError(t, err)
		t.Logf("start with a taken port took %v: %s", time.Since(begin), u)
		require.Equal(t, 2, calls)
		require.NotContains(t, u, ":"+strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)+"/")
		require.NoError(t, stop())
	}
}

func TestStartRedisMissingBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, _, err := startRedis()
	require.ErrorContains(t, err, "redis-server")
	t.Log(err)
}

// childEnv marks the test binary that TestServersDieWithTheirParent starts.
const childEnv = "CONTEND_TESTSERVER_CHILD"

// TestServersDieWithTheirParent checks Pdeathsig: a test binary killed before
// it can call stop must not leave its servers running.
func TestServersDieWithTheirParent(t *testing.T) {
	child := exec.Command(os.Args[0], "-test.run=^TestHelperServers$", "-test.count=1")
	child.Env = append(os.Environ(), childEnv+"=1")
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})

	var pgURL, redisURL string
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if f := strings.Fields(lines.Text()); len(f) == 3 && f[0] == "SERVERS" {
			pgURL, redisURL = f[1], f[2]
			break
		}
	}
	require.NotEmpty(t, pgURL, "child printed no URLs")

	pgDir := postgresDir(t, pgURL)
	client := redisClient(t, redisURL)
	redisDir := redisDir(t, client)
	require.NoError(t, client.Close())
	pids := []int{postmasterPID(t, pgDir), redisPID(t, redisURL)}
	t.Cleanup(func() {
		// Whatever Pdeathsig left behind.
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		os.RemoveAll(pgDir)
		os.RemoveAll(redisDir)
	})

	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	killed = true

	requireClosed(t, pgURL)
	requireClosed(t, redisURL)
	// PostgreSQL removes its pid file last, after a clean shutdown.
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(pgDir, "data", "postmaster.pid"))
		return os.IsNotExist(err)
	}, 10*time.Second, 20*time.Millisecond, "postmaster.pid remains")
}

// TestHelperServers is the child of TestServersDieWithTheirParent: it starts
// both servers, prints their URLs and waits to be killed.
func TestHelperServers(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		return
	}
	pg, _, err := startPostgres()
	require.NoError(t, err)
	rd, _, err := startRedis()
	require.NoError(t, err)
	fmt.Printf("SERVERS %s %s\n", pg, rd)
	// Bounded, in case the parent dies first; the servers go with this process.
	time.Sleep(time.Minute)
}

// startedPostgres starts a throwaway server for t and stops it when t ends.
func startedPostgres(t *testing.T) (string, func() error) {
	t.Helper()
	u, stop, err := startPostgres()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, stop()) })
	return u, stop
}

func redisClient(t *testing.T, u string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(u)
	require.NoError(t, err)
	return redis.NewClient(opts)
}

// postgresDir returns the temporary directory the server at u runs in.
func postgresDir(t *testing.T, u string) string {
	t.Helper()
	db, err := sql.Open("pgx", u)
	require.NoError(t, err)
	defer db.Close()
	var data string
	require.NoError(t, db.QueryRow("SHOW data_directory").Scan(&data))
	dir := filepath.Dir(data)
	require.DirExists(t, dir)
	return dir
}

func redisDir(t *testing.T, client *redis.Client) string {
	t.Helper()
	cfg, err := client.ConfigGet(context.Background(), "dir").Result()
	require.NoError(t, err)
	require.DirExists(t, cfg["dir"])
	return cfg["dir"]
}

// postmasterPID reads the first line of the pid file in dir's data directory.
func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	require.NoError(t, err)
	return pid
}

func redisPID(t *testing.T, u string) int {
	t.Helper()
	client := redisClient(t, u)
	defer client.Close()
	info, err := client.Info(context.Background(), "server").Result()
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			require.NoError(t, err)
			return pid
		}
	}
	t.Fatal("no process_id in INFO server")
	return 0
}

// requireGone checks that the server at u no longer answers and its
// directory is gone.
func requireGone(t *testing.T, u, dir string) {
	t.Helper()
	requireClosed(t, u)
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "%s remains: %v", dir, err)
}

// requireClosed waits until nothing answers on u's port: a server killed by
// Pdeathsig shuts down on its own time.
func requireClosed(t *testing.T, u string) {
	t.Helper()
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", parsed.Host, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	}, 10*time.Second, 20*time.Millisecond, "%s still answers", parsed.Host)
}
