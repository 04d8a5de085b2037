package testserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// OwnedMariaDB is a MariaDB server that belongs to one test, started with
// settings of the test's that a running server cannot change (read-only
// variables such as innodb_rollback_on_timeout), or that the shared server
// must keep. Its URL names an empty database "test" that the root user,
// without a password, may use.
//
// The shared server that [MariaDB] hands out must never be restarted or
// reconfigured: other tests and other engineers use it.
type OwnedMariaDB struct{ *owned }

// mariaDBInitTimeout bounds mariadb-install-db: about a second here.
const mariaDBInitTimeout = 30 * time.Second

// OwnMariaDB initialises and starts a throwaway mariadbd for t alone, on a
// free port of 127.0.0.1, with options (such as
// "--innodb-rollback-on-timeout=ON") after its own; it is stopped and its
// directory removed when t ends. It fails t, saying what is missing, when
// mariadbd or mariadb-install-db is not installed or the server does not
// start within a bound.
func OwnMariaDB(t testing.TB, options ...string) *OwnedMariaDB {
	t.Helper()
	d, err := initMariaDB("contend-mariadb-owned-", options)
	if err != nil {
		t.Fatal(err)
	}
	o := &OwnedMariaDB{own(t, d)}
	db, err := openMariaDB(mariaDBServerURL(o.port, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE test"); err != nil {
		t.Fatalf("testserver: owned mariadbd: create database test: %v", err)
	}
	return o
}

// mariaDBServerURL is the URL of an owned server's database on port.
func mariaDBServerURL(port int, database string) string {
	return fmt.Sprintf("mysql://root@127.0.0.1:%d/%s", port, database)
}

// mariaDBBinaries finds mariadbd (off PATH on Debian, in /usr/sbin) and
// mariadb-install-db.
func mariaDBBinaries() (server, install string, err error) {
	find := func(name string) (string, error) {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"} {
			if p := filepath.Join(dir, name); isExecutable(p) {
				return p, nil
			}
		}
		return "", fmt.Errorf("testserver: %s not found on PATH or in /usr/sbin (Debian: apt-get install mariadb-server)", name)
	}
	if server, err = find("mariadbd"); err != nil {
		return "", "", err
	}
	if install, err = find("mariadb-install-db"); err != nil {
		return "", "", err
	}
	return server, install, nil
}

// initMariaDB creates a data directory with mariadb-install-db in a fresh
// temporary directory named after prefix and returns how to run mariadbd on
// it with options. The server runs as this process's user: as root, it must
// be told so (--user=root), or it refuses to start.
func initMariaDB(prefix string, options []string) (daemon, error) {
	server, install, err := mariaDBBinaries()
	if err != nil {
		return daemon{}, err
	}
	u, err := user.Current()
	if err != nil {
		return daemon{}, fmt.Errorf("testserver: the user to run mariadbd as: %w", err)
	}
	dir, err := makeDir(prefix, nil)
	if err != nil {
		return daemon{}, err
	}
	data := filepath.Join(dir, "data")
	// Small files: the server holds a test's few rows, and starts and stops
	// faster with a small redo log and buffer pool.
	common := []string{"--no-defaults", "--user=" + u.Username, "--datadir=" + data,
		"--innodb-log-file-size=4M", "--innodb-buffer-pool-size=16M"}
	ctx, cancel := context.WithTimeout(context.Background(), mariaDBInitTimeout)
	defer cancel()
	// --no-defaults must come first.
	cmd := exec.CommandContext(ctx, install, append(common, "--auth-root-authentication-method=normal", "--skip-test-db")...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return daemon{}, errors.Join(
			fmt.Errorf("testserver: mariadb-install-db: %w\n%s", err, strings.TrimSpace(string(out))),
			removeDir(dir))
	}
	return daemon{
		name: "mariadbd",
		path: server,
		args: func(port int) []string {
			return append(append(append([]string{}, common...),
				"--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "mariadbd.pid"),
				"--port="+strconv.Itoa(port), "--bind-address=127.0.0.1",
				"--skip-log-bin", "--skip-name-resolve"), options...)
		},
		dir: dir,
		// SIGTERM is mariadbd's clean shutdown.
		stopSignal: syscall.SIGTERM,
		url:        func(port int) string { return mariaDBServerURL(port, "") },
		ready: func(ctx context.Context, url string) error {
			return mariaDBReady(ctx, url, data)
		},
	}, nil
}

// mariaDBReady is postgresReady for mariadbd, whose @@datadir identifies
// the server.
func mariaDBReady(ctx context.Context, url, data string) error {
	db, err := openMariaDB(url)
	if err != nil {
		return err
	}
	defer db.Close()
	var served string
	if err := db.QueryRowContext(ctx, "SELECT @@datadir").Scan(&served); err != nil {
		return err
	}
	if _, err := os.Stat(data); err != nil {
		return fmt.Errorf("testserver: %w", err)
	}
	return sameDir(served, data)
}

// URL returns the URL of the server's database "test", for [Open] and
// [Handle] under [MariaDBDriver].
func (m *OwnedMariaDB) URL() string { return mariaDBServerURL(m.port, "test") }
