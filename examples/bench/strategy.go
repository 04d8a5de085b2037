package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	stdatomic "sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/adaptive"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/harness"
	load "github.com/contend/contend/internal/workload"
	"github.com/contend/contend/optimistic"
	"github.com/contend/contend/pessimistic"
	"github.com/contend/contend/pgxdb"
	"github.com/contend/contend/queue"
)

// The strategies, in the order they are shown. raw is the floor every other
// one is measured against; poll (the bare 1 ms polling loop), redislock and
// redsync are peers of distlock; naive is the negative control. The -mariadb
// strategies are their namesakes on MariaDB, beside raw-mariadb, their floor.
var allStrategies = []string{"raw", "atomic", "raw-pgx", "atomic-pgx", "pessimistic", "pessimistic-noqueue", "optimistic", "optimistic-guard", "adaptive", "oracle",
	"distlock", "poll", "redislock", "redsync", "queue", "naive",
	"unique-insert", "idempotency", "check-then-insert",
	"raw-mariadb", "atomic-mariadb", "pessimistic-mariadb", "optimistic-guard-mariadb", "adaptive-mariadb"}

// defaultStrategies run unless the strategies are named: all but the
// MariaDB ones, which would make the default run a minute and more longer
// (-mariadb adds them).
var defaultStrategies = slices.DeleteFunc(slices.Clone(allStrategies), onMariaDB)

// mariadbStrategies are the strategies that run on MariaDB.
var mariadbStrategies = slices.DeleteFunc(slices.Clone(allStrategies), func(s string) bool { return !onMariaDB(s) })

// quickMariaDB are the MariaDB strategies the smoke run adds to the default
// ones: the floor, atomic and adaptive (which runs both the optimistic guard
// and the row lock), so that every workload runs on MariaDB, at fourteen
// short cells rather than the whole set's twenty-four.
var quickMariaDB = []string{"raw-mariadb", "atomic-mariadb", "adaptive-mariadb"}

// pgxNative reports whether strategy runs on pgx's native interface (a
// pgxpool.Pool) rather than on database/sql; its floor is raw-pgx.
func pgxNative(strategy string) bool { return strings.HasSuffix(strategy, "-pgx") }

// onMariaDB reports whether strategy runs on MariaDB, through package
// mysqldb; its floor is raw-mariadb.
func onMariaDB(strategy string) bool { return strings.HasSuffix(strategy, "-mariadb") }

// floor is the strategy strategy's throughput is measured against: the bare
// statement through the same driver on the same server. The floors of pgx
// and MariaDB are themselves measured against raw.
func floor(strategy string) string {
	switch {
	case slices.Contains(stormStrategies, strategy):
		return "unique-insert"
	case strategy == "raw-pgx" || strategy == "raw-mariadb":
		return "raw"
	case pgxNative(strategy):
		return "raw-pgx"
	case onMariaDB(strategy):
		return "raw-mariadb"
	}
	return "raw"
}

// The workloads: "decrement stock if available", "claim a job once", and
// "shift", a decrement whose keys turn from spread to hot halfway through the
// cell (see shiftPicker); three decrements whose fn waits thinkTime
// between its read and its write, on a pool of thinkPool connections:
// "think" on spread keys, "mixed" with mixedHot of its calls on one hot key
// (see mixedPicker), and "shift-think", shift with the wait; and the retry
// storm (see stormWorkload), each request sent three times.
var allWorkloads = []string{"decrement", "claim", "shift", "think", "mixed", "shift-think", stormWorkload}

// thinkTime is what the think workloads' fn waits between its read and its
// write, holding whatever its strategy holds: a stand-in for a call to
// another service.
const thinkTime = 2 * time.Millisecond

// thinkPool is each process's pool in the think workloads: smaller than
// their workers, as a service's pool is, so that what a waiter holds shows.
const thinkPool = 10

// thinks reports whether workload's fn waits thinkTime.
func thinks(workload string) bool {
	return workload == "think" || workload == "mixed" || workload == "shift-think"
}

// thinkStrategies are the strategies the think workloads run: the guards
// that run a read-think-write (the row lock with and without its queue in
// the process, the optimistic guard, the adaptive one and oracle, its
// reference), raw, their floor,
// and the naive control; and on MariaDB, those that run there.
var thinkStrategies = []string{"raw", "pessimistic", "pessimistic-noqueue", "optimistic-guard", "adaptive", "oracle", "naive",
	"raw-mariadb", "pessimistic-mariadb", "optimistic-guard-mariadb", "adaptive-mariadb"}

// shiftStrategies are the strategies the shift workload runs: the guards it
// is there to set apart (the adaptive one beside the two it chooses
// between, and oracle, the reference it is measured against), the
// optimistic Store, and raw, the floor.
var shiftStrategies = []string{"raw", "pessimistic", "optimistic", "optimistic-guard", "adaptive", "oracle",
	"raw-mariadb", "pessimistic-mariadb", "optimistic-guard-mariadb", "adaptive-mariadb"}

// operation is what workload's operations do: shift and the think
// workloads sell, as decrement does; only the keys they sell and the wait
// in fn differ.
func operation(workload string) string {
	if workload == "claim" || workload == stormWorkload {
		return workload
	}
	return "decrement"
}

// Lost races, as the harness counts them: it matches contend.ErrConflict.
var (
	errSoldOut = load.ErrSoldOut
	errTaken   = fmt.Errorf("already claimed: %w", contend.ErrConflict)
)

// initialStock is every product's stock at the start of a cell: more than any
// cell can sell, so every decrement is a sale and the invariant compares
// sales with what the stock shows.
const initialStock = 1_000_000_000

// product and job are the rows the optimistic Store reads and writes.
type product struct {
	ID      string `db:"id"`
	Stock   int64  `db:"stock"`
	Version int64  `db:"version"`
}

type job struct {
	ID      string         `db:"id"`
	Owner   sql.NullString `db:"owner"`
	Version int64          `db:"version"`
}

// dialect is one server's text of the workloads' statements. Their
// arguments come in the same order on every server.
type dialect struct {
	mysql bool
	// decrement sells one item of key if any is left; claim sets the
	// owner (first argument) of job key (second) if it is free: raw's
	// statements, and atomic's decrement.
	decrement, claim string
	// The read-check-write's reads (key) and writes (the new value, key).
	readStock, writeStock, readOwner, writeOwner string
}

var (
	postgresSQL = dialect{
		decrement:  `UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`,
		claim:      `UPDATE jobs SET owner = $1 WHERE id = $2 AND owner IS NULL`,
		readStock:  `SELECT stock FROM products WHERE id = $1`,
		writeStock: `UPDATE products SET stock = $1 WHERE id = $2`,
		readOwner:  `SELECT owner FROM jobs WHERE id = $1`,
		writeOwner: `UPDATE jobs SET owner = $1 WHERE id = $2`,
	}
	mariadbSQL = dialect{
		mysql:      true,
		decrement:  `UPDATE products SET stock = stock - 1 WHERE id = ? AND stock >= 1`,
		claim:      `UPDATE jobs SET owner = ? WHERE id = ? AND owner IS NULL`,
		readStock:  `SELECT stock FROM products WHERE id = ?`,
		writeStock: `UPDATE products SET stock = ? WHERE id = ?`,
		readOwner:  `SELECT owner FROM jobs WHERE id = ?`,
		writeOwner: `UPDATE jobs SET owner = ? WHERE id = ?`,
	}
)

// dialectOf is the dialect of strategy's server.
func dialectOf(strategy string) dialect {
	if onMariaDB(strategy) {
		return mariadbSQL
	}
	return postgresSQL
}

// createTable makes workload's table afresh, on d's server, with one row per
// key. Both tables carry a version column, which the optimistic and adaptive
// strategies use.
func createTable(ctx context.Context, db *sqlx.DB, d dialect, workload string, keys []string) error {
	workload = operation(workload)
	if d.mysql {
		return createMariaDBTable(ctx, db, workload, keys)
	}
	stmts := map[string]string{
		"decrement": `DROP TABLE IF EXISTS products;
			CREATE TABLE products (id text PRIMARY KEY, stock bigint NOT NULL, version bigint NOT NULL DEFAULT 0)`,
		"claim": `DROP TABLE IF EXISTS jobs;
			CREATE TABLE jobs (id text PRIMARY KEY, owner text, version bigint NOT NULL DEFAULT 0)`,
	}
	if _, err := db.ExecContext(ctx, stmts[workload]); err != nil {
		return fmt.Errorf("create %s table: %w", workload, err)
	}
	var err error
	switch workload {
	case "decrement":
		_, err = db.ExecContext(ctx, `INSERT INTO products (id, stock) SELECT unnest($1::text[]), $2`, keys, initialStock)
	case "claim":
		_, err = db.ExecContext(ctx, `INSERT INTO jobs (id) SELECT unnest($1::text[])`, keys)
	}
	if err != nil {
		return fmt.Errorf("fill %s table: %w", workload, err)
	}
	// Fresh statistics, so that the planner picks the primary key from the
	// first statement on, whatever the row count.
	_, err = db.ExecContext(ctx, `ANALYZE `+table(workload))
	return err
}

// createMariaDBTable is createTable on MariaDB: InnoDB tables, filled a few
// hundred rows to a statement (the keys are bound, never spliced in).
func createMariaDBTable(ctx context.Context, db *sqlx.DB, workload string, keys []string) error {
	create := map[string]string{
		"decrement": `CREATE TABLE products (id varchar(64) PRIMARY KEY, stock bigint NOT NULL, version bigint NOT NULL DEFAULT 0) ENGINE=InnoDB`,
		"claim":     `CREATE TABLE jobs (id varchar(64) PRIMARY KEY, owner varchar(64), version bigint NOT NULL DEFAULT 0) ENGINE=InnoDB`,
	}
	for _, stmt := range []string{`DROP TABLE IF EXISTS ` + table(workload), create[workload]} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("create %s table: %w", workload, err)
		}
	}
	for chunk := range slices.Chunk(keys, 500) {
		var (
			stmt string
			args []any
		)
		if workload == "decrement" {
			stmt = `INSERT INTO products (id, stock) VALUES ` + strings.TrimSuffix(strings.Repeat(`(?, ?),`, len(chunk)), ",")
			for _, k := range chunk {
				args = append(args, k, initialStock)
			}
		} else {
			stmt = `INSERT INTO jobs (id) VALUES ` + strings.TrimSuffix(strings.Repeat(`(?),`, len(chunk)), ",")
			for _, k := range chunk {
				args = append(args, k)
			}
		}
		if _, err := db.ExecContext(ctx, stmt, args...); err != nil {
			return fmt.Errorf("fill %s table: %w", workload, err)
		}
	}
	_, err := db.ExecContext(ctx, `ANALYZE TABLE `+table(workload))
	return err
}

// backends is what a process's operations run against.
type backends struct {
	// db is the pool of the strategy's server, and h what the strategies
	// take: db itself on PostgreSQL, db wrapped by mysqldb on MariaDB.
	db          *sqlx.DB
	h           contend.DB
	sql         dialect
	pool        *pgxpool.Pool // only for the -pgx strategies
	rdb         *redis.Client
	redisPrefix string
	// hot is the key the workload makes hot (mixed's, shift's after the
	// shift), "" when it makes none: what oracle knows in advance.
	hot string
}

// counters is what a strategy reports besides the harness's counts.
type counters struct {
	// retries counts the runs an operation made beyond its first
	// (optimistic: attempts − 1, from Config.Observer; the guards of
	// countsRetries: fn's runs − 1, from retried).
	retries stdatomic.Int64
	// split counts the retry storm's requests whose copies got different
	// answers.
	split stdatomic.Int64
	// modes counts the adaptive guard's calls by the mode they began in.
	modes modeCounts
}

// modeCounts counts an adaptive guard's calls on the workload's hot key and
// on the others, and those of each that began in locked mode; flips counts
// the hot key's changes of mode, as its successive calls saw them.
type modeCounts struct {
	hot, hotLocked, cold, coldLocked, flips stdatomic.Int64
	last                                    stdatomic.Int32 // the hot key's last mode seen
	// first is when the first call began (UnixNano), and locked how long
	// after it the hot key's first call began in locked mode; 0 if none did.
	first, locked stdatomic.Int64
}

// counted is an adaptive Guard whose calls count in m by the mode they
// began in (Guard.Mode just before Do: the mode Do reads).
type counted struct {
	g   *adaptive.Guard
	hot string
	m   *modeCounts
}

func (c counted) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	locked := c.g.Mode(key) == adaptive.Pessimistic
	now := time.Now().UnixNano()
	c.m.first.CompareAndSwap(0, now)
	switch {
	case key == c.hot:
		c.m.hot.Add(1)
		if locked {
			c.m.hotLocked.Add(1)
		}
		if c.m.last.Swap(int32(b2i(locked))) != int32(b2i(locked)) {
			c.m.flips.Add(1)
		}
		if locked {
			c.m.locked.CompareAndSwap(0, max(now-c.m.first.Load(), 1))
		}
	default:
		c.m.cold.Add(1)
		if locked {
			c.m.coldLocked.Add(1)
		}
	}
	return c.g.Do(ctx, key, fn)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// oracleGuard is the reference the adaptive guard is measured against, not
// a strategy for users: it knows in advance which key the workload makes
// hot, and runs that key's calls under the pessimistic Locker and every other
// key's under the optimistic guard, with nothing to measure or learn. Any
// guard choosing between those two per key, from what it sees, can at best
// match it. On shift it locks the hot key from the start, where a choice at
// the shift would lock it from the half-way instant on: before the shift the
// key takes one call in the cell's key count, cold.
type oracleGuard struct {
	hot          string
	locked, cold contend.Guard
}

func (g oracleGuard) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	if key == g.hot {
		return g.locked.Do(ctx, key, fn)
	}
	return g.cold.Do(ctx, key, fn)
}

// countsRetries reports whether strategy counts its retries.
func countsRetries(strategy string) bool {
	return slices.Contains([]string{"optimistic", "optimistic-guard", "adaptive", "oracle"}, strings.TrimSuffix(strategy, "-mariadb"))
}

// retried is a Guard that counts in n the runs of fn beyond the first of
// each call: what any guard re-ran after a lost race or a deadlock.
type retried struct {
	g contend.Guard
	n *stdatomic.Int64
}

func (r retried) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	runs := 0
	err := r.g.Do(ctx, key, func(ctx context.Context) error {
		runs++
		return fn(ctx)
	})
	r.n.Add(int64(max(runs-1, 0)))
	return err
}

// newOp returns strategy's operation for workload, and what closes it.
func newOp(ctx context.Context, b backends, workload, strategy string, c *counters) (harness.Op, func(), error) {
	var think time.Duration
	if thinks(workload) {
		think = thinkTime
	}
	workload = operation(workload)
	nothing := func() {}
	if workload == stormWorkload {
		op, err := stormOp(b.db, b.h, strategy, c)
		return op, nothing, err
	}
	observe := contend.ObserverFunc(func(_ context.Context, e contend.Event) {
		if e.Kind != contend.EventRetry { // one event ends each call
			c.retries.Add(int64(e.Attempts - 1))
		}
	})
	rcw := readCheckWrite(b.db, b.sql, workload, think)
	// Enough attempts that a hot key at 64 workers still ends in a sale;
	// the retries it took are what the report shows.
	optRetry := contend.Retry{MaxAttempts: 1000}
	// A -mariadb strategy is its namesake on b's MariaDB handles.
	switch strings.TrimSuffix(strategy, "-mariadb") {
	case "raw":
		if think > 0 {
			return rawThinkOp(b.db, b.sql, think), nothing, nil
		}
		return rawOp(b.db, b.sql, workload), nothing, nil
	case "raw-pgx":
		return rawPgxOp(b.pool, workload), nothing, nil
	case "atomic":
		return atomicOp(ctx, b.h, b.sql, workload)
	case "atomic-pgx":
		return atomicOp(ctx, pgxdb.Wrap(b.pool), b.sql, workload)
	case "pessimistic":
		l, err := pessimistic.NewLocker(b.h, pessimistic.LockerConfig{Table: table(workload)})
		return load.Guarded(l, rcw), nothing, err
	case "pessimistic-noqueue":
		// Every waiter for a held row waits at the server, holding a
		// pooled connection: the Locker as it was before its queue.
		l, err := pessimistic.NewLocker(b.h, pessimistic.LockerConfig{Table: table(workload), NoLocalQueue: true})
		return load.Guarded(l, rcw), nothing, err
	case "optimistic-guard":
		// The optimistic Guard around the read-check-write, the same shape
		// of call as pessimistic and adaptive, where the optimistic Store
		// above reads and writes the row itself.
		g, err := optimistic.NewGuard(b.h, optimistic.Config{Table: table(workload), Retry: optRetry})
		return load.Guarded(retried{g, &c.retries}, rcw), nothing, err
	case "adaptive":
		g, err := adaptive.NewGuard(b.h, adaptive.Config{Table: table(workload), Retry: optRetry})
		if err != nil {
			return nil, nil, err
		}
		return load.Guarded(retried{counted{g, b.hot, &c.modes}, &c.retries}, rcw), nothing, nil
	case "oracle":
		l, err := pessimistic.NewLocker(b.h, pessimistic.LockerConfig{Table: table(workload)})
		if err != nil {
			return nil, nil, err
		}
		g, err := optimistic.NewGuard(b.h, optimistic.Config{Table: table(workload), Retry: optRetry})
		if err != nil {
			return nil, nil, err
		}
		return load.Guarded(retried{oracleGuard{hot: b.hot, locked: l, cold: g}, &c.retries}, rcw), nothing, nil
	case "optimistic":
		cfg := optimistic.Config{Table: table(workload), Retry: optRetry, Observer: observe}
		if workload == "decrement" {
			s, err := optimistic.NewStore[product](b.h, cfg)
			return func(ctx context.Context, key string) error {
				_, err := s.Update(ctx, key, func(p *product) error {
					if p.Stock < 1 {
						return errSoldOut
					}
					p.Stock--
					return nil
				})
				return err
			}, nothing, err
		}
		s, err := optimistic.NewStore[job](b.h, cfg)
		return func(ctx context.Context, key string) error {
			_, err := s.Update(ctx, key, func(j *job) error {
				if j.Owner.Valid {
					return errTaken
				}
				j.Owner = sql.NullString{String: newToken(), Valid: true}
				return nil
			})
			return err
		}, nothing, err
	case "distlock":
		cl, err := distlock.NewClient(b.rdb, distlock.Config{Prefix: b.redisPrefix})
		if err != nil {
			return nil, nil, err
		}
		return load.Guarded(cl, rcw), func() { cl.Close(context.WithoutCancel(ctx)) }, nil
	case "poll":
		return load.Guarded(&pollGuard{rdb: b.rdb, prefix: b.redisPrefix}, rcw), nothing, nil
	case "redislock":
		return load.Guarded(newRedislockGuard(b.rdb, b.redisPrefix), rcw), nothing, nil
	case "redsync":
		return load.Guarded(newRedsyncGuard(b.rdb, b.redisPrefix), rcw), nothing, nil
	case "queue":
		return queueOp(ctx, b.db, workload)
	case "naive":
		return load.Guarded(&load.MutexGuard{}, rcw), nothing, nil
	}
	return nil, nil, fmt.Errorf("unknown strategy %q", strategy)
}

// atomicOp is the atomic strategy on db: the conditional UPDATE for
// decrement, the Claimer for claim.
func atomicOp(ctx context.Context, db contend.DB, d dialect, workload string) (harness.Op, func(), error) {
	if workload == "decrement" {
		return func(ctx context.Context, key string) error {
			sold, err := atomic.Update(ctx, db, d.decrement, key)
			if err == nil && !sold {
				err = errSoldOut
			}
			return err
		}, func() {}, nil
	}
	cl, err := atomic.NewClaimer(db, atomic.ClaimerConfig{Table: "jobs"})
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, key string) error {
		_, err := cl.Claim(ctx, key)
		return err
	}, func() { cl.Close(context.Background()) }, nil
}

func table(workload string) string {
	if workload == "claim" {
		return "jobs"
	}
	return "products"
}

// rawOp is the floor: the one conditional statement through database/sql,
// with no library in between.
func rawOp(db *sqlx.DB, d dialect, workload string) harness.Op {
	query, lost := rawStatement(d, workload)
	return func(ctx context.Context, key string) error {
		res, err := db.ExecContext(ctx, query, rawArgs(workload, key)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return lost
		}
		return nil
	}
}

// rawStatement is the workload's one conditional statement, and the error
// that a call which changed no row answers.
func rawStatement(d dialect, workload string) (string, error) {
	if workload == "claim" {
		return d.claim, errTaken
	}
	return d.decrement, errSoldOut
}

// rawArgs are rawStatement's arguments for key.
func rawArgs(workload, key string) []any {
	if workload == "claim" {
		return []any{newToken(), key}
	}
	return []any{key}
}

// rawPgxOp is the floor of the -pgx strategies: the same statement through
// pgxpool, with no library in between.
func rawPgxOp(pool *pgxpool.Pool, workload string) harness.Op {
	query, lost := rawStatement(postgresSQL, workload)
	return func(ctx context.Context, key string) error {
		tag, err := pool.Exec(ctx, query, rawArgs(workload, key)...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return lost
		}
		return nil
	}
}

// readCheckWrite is the body every guard runs, through whatever transaction
// the guard hands it, in d's statements: read the row, refuse when the check
// fails, write back what was read, changed. Unguarded, two callers can read
// the same state and both write: the lost update and the double claim. A
// decrement waits think between its read and its write.
func readCheckWrite(db *sqlx.DB, d dialect, workload string, think time.Duration) func(ctx context.Context, key string) error {
	if workload == "claim" {
		return func(ctx context.Context, key string) error {
			q := contend.Querier(ctx, db)
			var owner sql.NullString
			if err := q.QueryRowContext(ctx, d.readOwner, key).Scan(&owner); err != nil {
				return err
			}
			if owner.Valid {
				return errTaken
			}
			_, err := q.ExecContext(ctx, d.writeOwner, newToken(), key)
			return err
		}
	}
	return func(ctx context.Context, key string) error {
		q := contend.Querier(ctx, db)
		var stock int64
		if err := q.QueryRowContext(ctx, d.readStock, key).Scan(&stock); err != nil {
			return err
		}
		if stock < 1 {
			return errSoldOut
		}
		if think > 0 {
			time.Sleep(think)
		}
		_, err := q.ExecContext(ctx, d.writeStock, stock-1, key)
		return err
	}
}

// rawThinkOp is the floor of the think workloads: the locked transaction
// written by hand (BEGIN; SELECT stock ... FOR NO KEY UPDATE; wait think;
// UPDATE; COMMIT), every waiter holding a connection at the server.
func rawThinkOp(db *sqlx.DB, d dialect, think time.Duration) harness.Op {
	lockedRead := d.readStock + " FOR NO KEY UPDATE"
	var opts *sql.TxOptions
	if d.mysql {
		lockedRead = d.readStock + " FOR UPDATE"
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return func(ctx context.Context, key string) error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var stock int64
		if err := tx.QueryRowContext(ctx, lockedRead, key).Scan(&stock); err != nil {
			return err
		}
		if stock < 1 {
			return errSoldOut
		}
		time.Sleep(think)
		if _, err := tx.ExecContext(ctx, d.writeStock, stock-1, key); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// queuePartitions is how many partitions, and so consumers, the queue
// strategy runs: enough to keep a small pool busy on spread keys.
const queuePartitions = 8

// queueOp submits each operation to its key's partition of an in-memory queue
// and waits for the answer. The partition's consumer turns the operations
// pending in it into one statement, so a hot key costs one round trip per
// batch instead of one per operation.
func queueOp(ctx context.Context, db *sqlx.DB, workload string) (harness.Op, func(), error) {
	handler := decrementBatch(db)
	if workload == "claim" {
		handler = claimBatch(db)
	}
	q, err := queue.New(queue.Config{Partitions: queuePartitions, BatchHandler: handler})
	if err != nil {
		return nil, nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Run ends when Close has drained the queue; each operation has
		// its own answer from Submit, so Run's adds nothing.
		_ = q.Run(runCtx)
	}()
	closeFn := func() {
		q.Close(context.WithoutCancel(ctx))
		stop()
		<-done
	}
	return func(ctx context.Context, key string) error {
		_, err := q.Submit(ctx, key, nil)
		return err
	}, closeFn, nil
}

// decrementBatch sells, per key, as many items as the batch holds jobs, in
// one statement for the whole batch. A key whose stock cannot cover all of
// its jobs sells none of them: conservative, and never an oversell.
func decrementBatch(db *sqlx.DB) queue.BatchHandler {
	return func(ctx context.Context, jobs []queue.Job) ([]queue.Result, error) {
		keys, counts := countByKey(jobs)
		rows, err := db.QueryContext(ctx, `
			UPDATE products p SET stock = p.stock - d.n
			FROM (SELECT unnest($1::text[]) AS id, unnest($2::bigint[]) AS n) d
			WHERE p.id = d.id AND p.stock >= d.n
			RETURNING p.id`, keys, counts)
		if err != nil {
			return nil, err
		}
		sold, err := collectKeys(rows)
		if err != nil {
			return nil, err
		}
		res := make([]queue.Result, len(jobs))
		for i, j := range jobs {
			if !sold[j.Key] {
				res[i].Err = errSoldOut
			}
		}
		return res, nil
	}
}

// claimBatch claims every key of the batch that is still free in one
// statement; the first job of a key that got it wins, the others lost.
func claimBatch(db *sqlx.DB) queue.BatchHandler {
	return func(ctx context.Context, jobs []queue.Job) ([]queue.Result, error) {
		keys, _ := countByKey(jobs)
		rows, err := db.QueryContext(ctx, `UPDATE jobs SET owner = $2 WHERE id = ANY($1::text[]) AND owner IS NULL RETURNING id`,
			keys, newToken())
		if err != nil {
			return nil, err
		}
		won, err := collectKeys(rows)
		if err != nil {
			return nil, err
		}
		res := make([]queue.Result, len(jobs))
		for i, j := range jobs {
			if won[j.Key] {
				won[j.Key] = false
				continue
			}
			res[i].Err = errTaken
		}
		return res, nil
	}
}

func countByKey(jobs []queue.Job) (keys []string, counts []int64) {
	at := map[string]int{}
	for _, j := range jobs {
		i, ok := at[j.Key]
		if !ok {
			i = len(keys)
			at[j.Key] = i
			keys = append(keys, j.Key)
			counts = append(counts, 0)
		}
		counts[i]++
	}
	return keys, counts
}

func collectKeys(rows *sql.Rows) (map[string]bool, error) {
	defer rows.Close()
	got := map[string]bool{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		got[k] = true
	}
	return got, rows.Err()
}

// newToken names a claim's owner.
func newToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
