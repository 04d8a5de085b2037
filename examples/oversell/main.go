// Command oversell shows overselling, live: several server processes
// sell the last items of one product at once.
//
// First the naive way — read the stock, check it, write it back — with a
// sync.Mutex in each process: every process keeps its own goroutines apart and
// nothing else, so the processes sell more than there is. Then the same
// read-check-write under each strategy's guard (the same function, sellOne,
// passed to each Guard), the atomic conditional UPDATE, and a queue on Redis
// Streams that hands every purchase of the product to one consumer: none
// oversells. Each strategy's sale is one short function below, sellWith….
//
// It connects to the PostgreSQL server named by CONTEND_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable) and the Redis server
// named by CONTEND_REDIS_URL (default redis://127.0.0.1:6379/0), and works in
// a schema and under a key prefix of its own, removed at the end.
//
// With -db mariadb the products table is on MariaDB (or MySQL) instead: the
// server named by CONTEND_MARIADB_URL (default
// mysql://root@127.0.0.1:3306/test), in a database of the run's own, dropped
// at the end. The pool is opened by mysqldb.Open and wrapped by mysqldb.Wrap,
// and the statements are MySQL's (? placeholders). The queue strategy runs on
// PostgreSQL only: its handler records each purchase in the same statement
// as the sale (UPDATE ... RETURNING in a WITH), which MySQL has no form of.
//
//	go run ./examples/oversell [-processes 3] [-buyers 32] [-stock 200] [-db postgres|mariadb]
//
// It exits non-zero if any strategy but the naive one oversells, or if the
// naive one does not (the demonstration would then prove nothing).
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/mysqldb"
	"github.com/contend/contend/optimistic"
	"github.com/contend/contend/pessimistic"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// errSoldOut is a buyer's lost race: nothing left. It matches
// contend.ErrConflict, as the guards' own lost races do.
var errSoldOut = fmt.Errorf("sold out: %w", contend.ErrConflict)

// statements are the sale's SQL in one server's syntax; their arguments
// come in the same order on both.
type statements struct {
	readStock  string // product → stock
	writeStock string // stock, product
	sellIfLeft string // product: the atomic sale
}

var (
	postgresSQL = statements{
		readStock:  `SELECT stock FROM products WHERE id = $1`,
		writeStock: `UPDATE products SET stock = $1 WHERE id = $2`,
		sellIfLeft: `UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`,
	}
	mysqlSQL = statements{
		readStock:  `SELECT stock FROM products WHERE id = ?`,
		writeStock: `UPDATE products SET stock = ? WHERE id = ?`,
		sellIfLeft: `UPDATE products SET stock = stock - 1 WHERE id = ? AND stock >= 1`,
	}
)

// sellOne is the naive read-check-write: read the stock, refuse when none is
// left, write back what was read minus one. Two buyers that read the same
// stock both write stock-1, and one sale vanishes from the stock: it is
// correct only when nothing else sells the product between its read and its
// write. Under a guard, contend.Querier hands it the guard's transaction.
func (s *shop) sellOne(ctx context.Context, product string) error {
	q := contend.Querier(ctx, s.db)
	var stock int64
	if err := q.QueryRowContext(ctx, s.sql.readStock, product).Scan(&stock); err != nil {
		return err
	}
	if stock < 1 {
		return errSoldOut
	}
	_, err := q.ExecContext(ctx, s.sql.writeStock, stock-1, product)
	return err
}

// shop is one server process's way to sell: a pool, and the guard or queue
// of the strategy it runs.
type shop struct {
	db *sqlx.DB
	// h is what the strategies take: db itself on PostgreSQL, db wrapped by
	// mysqldb.Wrap on MariaDB (contend.Querier still takes db).
	h      contend.DB
	sql    statements
	mu     sync.Mutex // the naive guard: this process's goroutines only
	locker *pessimistic.Locker
	guard  *optimistic.Guard
	locks  *distlock.Client
	queue  *redisq.Queue
}

// sellWithMutex keeps this process's buyers apart, and nothing else: the
// other processes read and write the stock meanwhile. It oversells.
func (s *shop) sellWithMutex(ctx context.Context, product string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sellOne(ctx, product)
}

// sellAtomic puts the check into the write: the database applies the UPDATE
// only while stock is left, so no read goes stale.
func (s *shop) sellAtomic(ctx context.Context, product string) error {
	sold, err := atomic.Update(ctx, s.h, s.sql.sellIfLeft, product)
	if err == nil && !sold {
		return errSoldOut
	}
	return err
}

// sellPessimistic locks the product's row (SELECT ... FOR UPDATE) and runs
// the read-check-write in that transaction: the other buyers wait.
func (s *shop) sellPessimistic(ctx context.Context, product string) error {
	return s.locker.Do(ctx, product, func(ctx context.Context) error { return s.sellOne(ctx, product) })
}

// sellOptimistic runs the read-check-write in a transaction that commits only
// if the row's version did not move meanwhile, and runs it again if it did.
func (s *shop) sellOptimistic(ctx context.Context, product string) error {
	return s.guard.Do(ctx, product, func(ctx context.Context) error { return s.sellOne(ctx, product) })
}

// sellWithDistlock holds a Redis lock on the product, in every process,
// around the read-check-write.
func (s *shop) sellWithDistlock(ctx context.Context, product string) error {
	return s.locks.Do(ctx, product, func(ctx context.Context) error { return s.sellOne(ctx, product) })
}

// sellQueued submits the purchase to the product's partition and waits for
// the answer; handlePurchase, in whichever process consumes that partition,
// makes the sale.
func (s *shop) sellQueued(ctx context.Context, product string) error {
	answer, err := s.queue.Submit(ctx, product, []byte(randomID()))
	if err == nil && string(answer) == "sold out" {
		return errSoldOut
	}
	return err
}

// handlePurchase sells one item for a purchase off the queue. The queue
// delivers at least once: a purchase redelivered after its consumer died
// answers what it answered before instead of selling again. The sale and its
// record are one statement, so the record exists exactly when the sale does;
// two deliveries of one purchase at once cannot both record it (the primary
// key), and the one that fails is undone entirely and, retried, answers from
// the record.
func (s *shop) handlePurchase(ctx context.Context, job queue.Job) ([]byte, error) {
	var sold bool
	err := s.db.QueryRowContext(ctx, `SELECT sold FROM sales WHERE id = $1`, string(job.Payload)).Scan(&sold)
	if errors.Is(err, sql.ErrNoRows) {
		err = s.db.QueryRowContext(ctx, `
			WITH sale AS (UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1 RETURNING 1)
			INSERT INTO sales (id, sold) VALUES ($2, EXISTS (SELECT 1 FROM sale)) RETURNING sold`,
			job.Key, string(job.Payload)).Scan(&sold)
	}
	if err != nil {
		return nil, err
	}
	if !sold {
		return []byte("sold out"), nil
	}
	return []byte("sold"), nil
}

// strategies, in the order they are shown, with each one's sale; the queue's
// runs on PostgreSQL only.
var strategies = []struct {
	name         string
	sell         func(s *shop, ctx context.Context, product string) error
	postgresOnly bool
}{
	{"naive-mutex", (*shop).sellWithMutex, false},
	{"atomic", (*shop).sellAtomic, false},
	{"pessimistic", (*shop).sellPessimistic, false},
	{"optimistic", (*shop).sellOptimistic, false},
	{"distlock", (*shop).sellWithDistlock, false},
	{"queue", (*shop).sellQueued, true},
}

// product is the one product every buyer wants.
const product = "sku-1"

func main() {
	var (
		processes = flag.Int("processes", 3, "server processes selling at once")
		buyers    = flag.Int("buyers", 32, "concurrent buyers in each process")
		stock     = flag.Int64("stock", 200, "items in stock at the start")
		server    = flag.String("db", "postgres", "the products table's server: postgres or mariadb")
	)
	flag.Parse()
	if isWorker() {
		os.Exit(workerMain())
	}
	ok, err := run(*server, *processes, *buyers, *stock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oversell:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// outcome is what one server process reports.
type outcome struct {
	Sold    int           `json:"sold"`
	Errors  []string      `json:"errors"`
	Elapsed time.Duration `json:"elapsed"`
}

// orders is what a server process is told to do, in its environment.
type orders struct {
	Strategy    string `json:"strategy"`
	Buyers      int    `json:"buyers"`
	Server      string `json:"server"`       // postgres or mariadb
	DatabaseURL string `json:"database_url"` // the run's schema or database
	RedisURL    string `json:"redis_url"`
	RedisPrefix string `json:"redis_prefix"`
}

func run(server string, processes, buyers int, stock int64) (ok bool, err error) {
	ctx := context.Background()
	var (
		dbURL string
		drop  func() error
	)
	switch server {
	case "postgres":
		dbURL, drop, err = createSchema(ctx, env("CONTEND_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
	case "mariadb":
		dbURL, drop, err = createDatabase(ctx, env("CONTEND_MARIADB_URL", "mysql://root@127.0.0.1:3306/test"))
	default:
		return false, fmt.Errorf("-db %q: want postgres or mariadb", server)
	}
	if err != nil {
		return false, err
	}
	defer func() { err = errors.Join(err, drop()) }()
	db, _, sqlText, err := open(server, dbURL)
	if err != nil {
		return false, err
	}
	defer db.Close()
	redisURL := env("CONTEND_REDIS_URL", "redis://127.0.0.1:6379/0")
	prefix := "oversell:" + randomID() + ":"
	defer func() { err = errors.Join(err, deleteKeys(context.WithoutCancel(ctx), redisURL, prefix)) }()

	fmt.Printf("%d server processes × %d buyers each, selling %d items of one product (on %s)\n\n", processes, buyers, stock, server)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "strategy\tsold\tstock left\toversold\tsales/s\t")
	ok = true
	for _, s := range strategies {
		if s.postgresOnly && server != "postgres" {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t  ← PostgreSQL only\n", s.name)
			continue
		}
		if err := createTables(ctx, db, server); err != nil {
			return false, err
		}
		if _, err := db.ExecContext(ctx, db.Rebind(`INSERT INTO products (id, stock) VALUES (?, ?)`), product, stock); err != nil {
			return false, err
		}
		total, err := spawn(ctx, processes, orders{Strategy: s.name, Buyers: buyers, Server: server,
			DatabaseURL: dbURL, RedisURL: redisURL, RedisPrefix: prefix + s.name + ":"})
		if err != nil {
			return false, fmt.Errorf("%s: %w", s.name, err)
		}
		var left int64
		if err := db.GetContext(ctx, &left, sqlText.readStock, product); err != nil {
			return false, err
		}
		// Sales the stock does not show: items sold twice.
		oversold := int64(total.Sold) - (stock - left)
		verdict := ""
		switch {
		case s.name == "naive-mutex" && oversold <= 0:
			verdict, ok = "  ← expected to oversell, and did not: the demonstration failed", false
		case s.name == "naive-mutex":
			verdict = "  ← each process's mutex kept only its own goroutines apart"
		case oversold != 0 || left < 0 || int64(total.Sold) > stock:
			verdict, ok = "  ← OVERSOLD", false
		case len(total.Errors) > 0:
			verdict, ok = "  ← errors: "+total.Errors[0], false
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%.0f\t%s\n", s.name, total.Sold, left, oversold,
			float64(total.Sold)/total.Elapsed.Seconds(), verdict)
	}
	w.Flush()
	if ok {
		fmt.Println("\nevery strategy sold exactly what there was; the naive one did not")
	}
	return ok, nil
}

// createTables makes the products table afresh, with the version column the
// optimistic guard checks, and on PostgreSQL the sales table the queue's
// handler records each purchase in.
func createTables(ctx context.Context, db *sqlx.DB, server string) error {
	stmts := []string{`DROP TABLE IF EXISTS products, sales;
		CREATE TABLE products (id text PRIMARY KEY, stock bigint NOT NULL, version bigint NOT NULL DEFAULT 0);
		CREATE TABLE sales (id text PRIMARY KEY, sold boolean NOT NULL)`}
	if server == "mariadb" {
		stmts = []string{`DROP TABLE IF EXISTS products`,
			`CREATE TABLE products (id varchar(64) PRIMARY KEY, stock bigint NOT NULL, version bigint NOT NULL DEFAULT 0) ENGINE=InnoDB`}
	}
	for _, stmt := range stmts {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// open opens a pool on the run's schema or database, and returns it with
// what the strategies take and the statements in the server's syntax. On
// MariaDB, mysqldb.Open sets clientFoundRows, which the strategies need, and
// mysqldb.Wrap states the dialect once.
func open(server, dbURL string) (*sqlx.DB, contend.DB, statements, error) {
	if server != "mariadb" {
		db, err := sqlx.Open("pgx", dbURL)
		return db, db, postgresSQL, err
	}
	cfg, err := mysqlConfig(dbURL)
	if err != nil {
		return nil, nil, statements{}, err
	}
	pool, err := mysqldb.Open(cfg)
	if err != nil {
		return nil, nil, statements{}, err
	}
	db := sqlx.NewDb(pool, "mysql")
	return db, mysqldb.Wrap(db), mysqlSQL, nil
}

// serve is one server process: it connects, tells the parent it is ready on
// out, waits for the word on in, and lets its buyers buy until told "sold
// out".
func serve(o orders, in io.Reader, out io.Writer) (outcome, error) {
	ctx := context.Background()
	var sell func(*shop, context.Context, string) error
	for _, s := range strategies {
		if s.name == o.Strategy {
			sell = s.sell
		}
	}
	if sell == nil {
		return outcome{}, fmt.Errorf("unknown strategy %q", o.Strategy)
	}
	db, h, sqlText, err := open(o.Server, o.DatabaseURL)
	if err != nil {
		return outcome{}, err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	opts, err := redis.ParseURL(o.RedisURL)
	if err != nil {
		return outcome{}, err
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	s, closeShop, err := openShop(ctx, &shop{db: db, h: h, sql: sqlText}, rdb, o.RedisPrefix, o.Strategy == "queue")
	if err != nil {
		return outcome{}, err
	}
	defer closeShop()
	if err := db.PingContext(ctx); err != nil {
		return outcome{}, err
	}
	// Ready, then wait: every process starts buying at the same moment.
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return outcome{}, err
	}
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		return outcome{}, err
	}

	var (
		mu  sync.Mutex // protects res
		res outcome
		wg  sync.WaitGroup
	)
	start := time.Now()
	for range o.Buyers {
		wg.Go(func() {
			var sold int
			var failure error
			for {
				err := sell(s, ctx, product)
				if err == nil {
					sold++
					continue
				}
				if !errors.Is(err, contend.ErrConflict) {
					failure = err
				}
				break
			}
			mu.Lock()
			defer mu.Unlock()
			res.Sold += sold
			if failure != nil {
				res.Errors = append(res.Errors, failure.Error())
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, nil
}

// openShop makes s's guards, on s.h and rdb, with a queue consumer when
// withQueue is set, and returns s with what closes it.
func openShop(ctx context.Context, s *shop, rdb *redis.Client, prefix string, withQueue bool) (*shop, func(), error) {
	var err error
	if s.locker, err = pessimistic.NewLocker(s.h, pessimistic.LockerConfig{Table: "products"}); err != nil {
		return nil, nil, err
	}
	// Every buyer retries on the one hot row: allow many attempts.
	if s.guard, err = optimistic.NewGuard(s.h, optimistic.Config{Table: "products", Retry: contend.Retry{MaxAttempts: 1000}}); err != nil {
		return nil, nil, err
	}
	if s.locks, err = distlock.NewClient(rdb, distlock.Config{Prefix: prefix + "locks:"}); err != nil {
		return nil, nil, err
	}
	closeLocks := func() { _ = s.locks.Close(context.WithoutCancel(ctx)) }
	if !withQueue {
		return s, closeLocks, nil
	}
	s.queue, err = redisq.New(rdb, redisq.Config{Prefix: prefix + "queue:", Partitions: 4, Handler: s.handlePurchase})
	if err != nil {
		closeLocks()
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = s.queue.Run(runCtx)
	}()
	return s, func() {
		_ = s.queue.Close(context.WithoutCancel(ctx))
		cancel()
		<-ran
		closeLocks()
	}, nil
}

// workerEnv carries a server process's orders: a copy of this program (or of
// its test binary) that finds it set is a server process, not the story.
const workerEnv = "OVERSELL_WORKER"

func isWorker() bool { return os.Getenv(workerEnv) != "" }

// workerMain runs this process as a server process and returns its exit code.
func workerMain() int {
	var o orders
	err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &o)
	var res outcome
	if err == nil {
		res, err = serve(o, os.Stdin, os.Stdout)
	}
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "oversell worker:", err)
		return 1
	}
	return 0
}

// spawn runs processes copies of this program as server processes with o,
// starts them together once every one is ready, and sums what they report.
func spawn(ctx context.Context, processes int, o orders) (outcome, error) {
	self, err := os.Executable()
	if err != nil {
		return outcome{}, err
	}
	assigned, err := json.Marshal(o)
	if err != nil {
		return outcome{}, err
	}
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	procs := make([]proc, 0, processes)
	defer func() {
		for _, p := range procs {
			p.stdin.Close() // a copy still waiting for the word ends
			_ = p.cmd.Wait()
		}
	}()
	for range processes {
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
		procs = append(procs, proc{cmd, stdin, bufio.NewReader(stdout)})
	}
	// Every copy connects first; then all start together, so the buyers
	// race rather than run in the order the copies booted.
	for i, p := range procs {
		if line, err := p.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
			return outcome{}, fmt.Errorf("server process %d did not get ready: %q: %v", i, line, err)
		}
	}
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			return outcome{}, err
		}
	}
	var total outcome
	for i, p := range procs {
		var o outcome
		if err := json.NewDecoder(p.out).Decode(&o); err != nil {
			return outcome{}, fmt.Errorf("server process %d report: %w", i, err)
		}
		total.Sold += o.Sold
		total.Errors = append(total.Errors, o.Errors...)
		total.Elapsed = max(total.Elapsed, o.Elapsed)
	}
	return total, nil
}

// env is the environment variable name's value, or def when it is unset.
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// randomID returns 64 random bits in hex: a purchase id, a key prefix.
func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// createSchema creates a schema of the run's own on the server, so that the
// story never touches another program's tables, and returns a URL whose
// connections work in it, and what drops it.
func createSchema(ctx context.Context, server string) (schemaURL string, drop func() error, err error) {
	name := "oversell_" + randomID()
	u, err := url.Parse(server)
	if err != nil {
		return "", nil, fmt.Errorf("CONTEND_POSTGRES_URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", name) // sent to the server as a run-time setting
	u.RawQuery = q.Encode()
	execute := func(ctx context.Context, stmt string) error {
		return execOnce(ctx, func() (*sql.DB, error) { return sql.Open("pgx", server) }, stmt)
	}
	if err := execute(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", nil, fmt.Errorf("create schema: %w", err)
	}
	return u.String(), func() error { return execute(context.WithoutCancel(ctx), "DROP SCHEMA "+name+" CASCADE") }, nil
}

// execOnce runs stmt on a pool of its own, opened by open on the server
// (not the run's schema or database), and closes the pool.
func execOnce(ctx context.Context, open func() (*sql.DB, error), stmt string) error {
	db, err := open()
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// mysqlConfig is the driver's config for a mysql://user:password@host:port/database URL.
func mysqlConfig(rawURL string) (*mysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "mysql" {
		return nil, fmt.Errorf("CONTEND_MARIADB_URL %q: want mysql://user:password@host:port/database", rawURL)
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return cfg, nil
}

// createDatabase creates a database of the run's own on the MariaDB server,
// and returns a URL whose connections use it, and what drops it.
func createDatabase(ctx context.Context, server string) (dbURL string, drop func() error, err error) {
	name := "oversell_" + randomID()
	cfg, err := mysqlConfig(server)
	if err != nil {
		return "", nil, err
	}
	execute := func(ctx context.Context, stmt string) error {
		return execOnce(ctx, func() (*sql.DB, error) { return mysqldb.Open(cfg) }, stmt)
	}
	if err := execute(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	u, _ := url.Parse(server)
	u.Path = "/" + name
	return u.String(), func() error { return execute(context.WithoutCancel(ctx), "DROP DATABASE "+name) }, nil
}

// deleteKeys deletes the Redis keys under prefix.
func deleteKeys(ctx context.Context, redisURL, prefix string) error {
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := rdb.Del(ctx, iter.Val()).Err(); err != nil {
			return err
		}
	}
	return iter.Err()
}
