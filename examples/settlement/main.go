// Command settlement is the cron job that three instances of a service all
// schedule, and that must run once per period: the settlement of a ledger.
//
// Every instance's timer fires at the same moment. Each asks distlock for the
// job's lock, failing fast: one gets it, the others skip the period. That
// alone is not enough. A lock is a lease, and a holder that stalls past it (a
// GC pause, a frozen VM) wakes up still believing it holds the lock, while
// another instance has taken it and done the work. So the settlement itself
// is guarded by the lock's fencing token, in one conditional UPDATE:
//
//	UPDATE jobs SET last_period = $period, last_fence = $fence
//	 WHERE name = 'settlement' AND last_period < $period AND last_fence < $fence
//
// Each acquisition's token is larger than every earlier one, so the late
// write of a stalled holder changes nothing: the database refuses it.
//
// It connects to the PostgreSQL server named by CONTEND_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable) and the Redis server
// named by CONTEND_REDIS_URL (default redis://127.0.0.1:6379/0), and works in
// a schema and under a key prefix of its own, removed at the end.
//
// The instances report their locks' events through otelcontend, the
// OpenTelemetry Observer, into an in-memory metric reader; the story ends by
// reading the conflicts and the lost lock it recorded.
//
// Run with no arguments, it runs three instances for a few periods, then
// plays a stalled holder, and exits non-zero if anything went otherwise than
// described:
//
//	go run ./examples/settlement [-periods 4] [-period 300ms]
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/otelcontend"
)

func main() {
	periods := flag.Int("periods", 4, "how many periods the instances run")
	period := flag.Duration("period", 300*time.Millisecond, "how long a period lasts (the job's lease is one period)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Stdout, *periods, *period)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "settlement:", err)
		os.Exit(1)
	}
}

const schema = `
CREATE TABLE jobs (name text PRIMARY KEY, last_period int NOT NULL, last_fence bigint NOT NULL);
INSERT INTO jobs VALUES ('settlement', 0, 0);
CREATE TABLE settlements (period int NOT NULL, instance text NOT NULL, fence bigint NOT NULL);
`

func run(ctx context.Context, out io.Writer, periods int, period time.Duration) (err error) {
	if periods < 1 || period < 50*time.Millisecond {
		return fmt.Errorf("need at least one period of at least 50ms, not %d of %v", periods, period)
	}
	redisURL := env("CONTEND_REDIS_URL", "redis://127.0.0.1:6379/0")
	dbURL, drop, err := createSchema(ctx, env("CONTEND_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, drop()) }()
	db, err := sqlx.Open("pgx", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	prefix := "settlement:" + randomID() + ":"
	// A real service would export these to its collector; the story reads
	// them back at the end.
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { err = errors.Join(err, meters.Shutdown(context.WithoutCancel(ctx))) }()
	obs, err := otelcontend.New(meters, nil)
	if err != nil {
		return err
	}

	var instances []*instance
	defer func() {
		for _, in := range instances {
			err = errors.Join(err, in.close(context.WithoutCancel(ctx)))
		}
	}()
	for _, name := range []string{"A", "B", "C"} {
		in, err := startInstance(name, dbURL, redisURL, prefix, period, obs)
		if err != nil {
			return err
		}
		instances = append(instances, in)
	}
	defer func() {
		err = errors.Join(err, deleteKeys(context.WithoutCancel(ctx), instances[0].rdb, prefix))
	}()

	d := &demo{out: out}
	fmt.Fprintf(out, "three instances, one settlement job, a period of %v\n\n", period)
	for p := 1; p <= periods; p++ {
		if err := d.tick(ctx, instances, p); err != nil {
			return err
		}
	}
	if err := d.stalledHolder(ctx, instances[0], instances[1], periods+1, period); err != nil {
		return err
	}
	if err := d.checkLedger(ctx, db, periods+1); err != nil {
		return err
	}
	if err := d.checkMetrics(ctx, reader); err != nil {
		return err
	}
	if d.failed > 0 {
		return fmt.Errorf("%d of %d expectations failed", d.failed, d.checked)
	}
	fmt.Fprintf(out, "\nall %d expectations held\n", d.checked)
	return nil
}

// instance is one server of the service: its own pool, Redis client and
// lock client, sharing the database and Redis with the others.
type instance struct {
	name  string
	db    *sqlx.DB
	rdb   *redis.Client
	locks *distlock.Client
}

func startInstance(name, dbURL, redisURL, prefix string, period time.Duration, obs contend.Observer) (*instance, error) {
	db, err := sqlx.Open("pgx", dbURL)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		db.Close()
		return nil, err
	}
	rdb := redis.NewClient(opts)
	// The lease is one period: a crashed instance delays the next period's
	// run, never skips it. NoWait: an instance that finds the job running
	// skips the period rather than queueing to run it again.
	locks, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix, TTL: period, NoWait: true, Observer: obs})
	if err != nil {
		rdb.Close()
		db.Close()
		return nil, err
	}
	return &instance{name: name, db: db, rdb: rdb, locks: locks}, nil
}

func (in *instance) close(ctx context.Context) error {
	return errors.Join(in.locks.Close(ctx), in.rdb.Close(), in.db.Close())
}

// outcome is what an instance's timer led to in one period.
type outcome int

const (
	settled outcome = iota // it ran the settlement
	busy                   // another instance held the job's lock
	done                   // it got the lock, but the period was already settled
)

// runJob is what every instance's timer runs: the job under the lock.
func (in *instance) runJob(ctx context.Context, period int) (outcome, int64, error) {
	result, fence := done, int64(0)
	err := in.locks.Do(ctx, "settlement", func(ctx context.Context) error {
		l, _ := distlock.FromContext(ctx)
		fence = l.Fence()
		applied, err := settle(ctx, in.db, in.name, period, fence)
		if applied {
			result = settled
		}
		return err
	})
	if errors.Is(err, contend.ErrConflict) {
		return busy, 0, nil
	}
	return result, fence, err
}

// settle records the period's settlement, in one transaction with the fenced
// UPDATE: it applies only for a period not settled yet, and only with a
// fencing token larger than any that wrote before.
func settle(ctx context.Context, db *sqlx.DB, instance string, period int, fence int64) (applied bool, err error) {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() {
		if !applied || err != nil {
			err = errors.Join(err, tx.Rollback())
		}
	}()
	applied, err = atomic.Update(ctx, tx,
		`UPDATE jobs SET last_period = $2, last_fence = $3
		  WHERE name = $1 AND last_period < $2 AND last_fence < $3`,
		"settlement", period, fence)
	if err != nil || !applied {
		return false, err
	}
	// The settlement's real work (summing the period's entries, paying out)
	// would go here, in the same transaction.
	if _, err := tx.ExecContext(ctx, `INSERT INTO settlements VALUES ($1, $2, $3)`, period, instance, fence); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	return true, nil
}

// demo prints what happens and counts the expectations it checks.
type demo struct {
	out             io.Writer
	checked, failed int
}

func (d *demo) expect(ok bool, format string, args ...any) {
	d.checked++
	mark := "ok "
	if !ok {
		d.failed++
		mark = "FAILED "
	}
	fmt.Fprintf(d.out, "  %s"+format+"\n", append([]any{mark}, args...)...)
}

// tick fires every instance's timer for period at once.
func (d *demo) tick(ctx context.Context, instances []*instance, period int) error {
	type result struct {
		outcome outcome
		fence   int64
		err     error
	}
	results := make([]result, len(instances))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, in := range instances {
		wg.Go(func() {
			<-start
			o, f, err := in.runJob(ctx, period)
			results[i] = result{o, f, err}
		})
	}
	close(start)
	wg.Wait()
	var ran, others []string
	for i, r := range results {
		name := instances[i].name
		switch {
		case r.err != nil:
			return fmt.Errorf("period %d, instance %s: %w", period, name, r.err)
		case r.outcome == settled:
			ran = append(ran, fmt.Sprintf("%s (fencing token %d)", name, r.fence))
		case r.outcome == busy:
			others = append(others, name+" found it running")
		default:
			others = append(others, name+" found it done")
		}
	}
	fmt.Fprintf(d.out, "period %d: settled by %s; %s\n", period, strings.Join(ran, ", "), strings.Join(others, ", "))
	d.expect(len(ran) == 1, "period %d settled exactly once", period)
	return nil
}

// stalledHolder plays the failure a fencing token exists for: the holder
// stalls past its lease, another instance takes over and settles, and the
// stalled holder's late write is refused.
func (d *demo) stalledHolder(ctx context.Context, stalled, next *instance, period int, lease time.Duration) error {
	fmt.Fprintf(d.out, "\nperiod %d: instance %s takes the lock and stalls (a GC pause) past its lease\n", period, stalled.name)
	// A bare lock, without Do's watchdog: a stalled process cannot refresh.
	l, err := stalled.locks.TryObtain(ctx, "settlement", lease)
	if err != nil {
		return err
	}
	// Instance next's timer fires while the other is stalled; it finds the
	// job running until the lease runs out, then takes the lock.
	deadline := time.Now().Add(10 * lease)
	var o outcome
	var fence int64
	for o, fence, err = next.runJob(ctx, period); err == nil && o == busy && time.Now().Before(deadline); o, fence, err = next.runJob(ctx, period) {
		select {
		case <-time.After(lease / 10):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "instance %s takes over when the lease runs out and settles with fencing token %d\n", next.name, fence)
	d.expect(o == settled, "the next instance settled period %d", period)
	d.expect(fence > l.Fence(), "its fencing token %d is larger than the stalled holder's %d", fence, l.Fence())

	fmt.Fprintf(d.out, "instance %s wakes up and settles period %d with its old fencing token %d\n", stalled.name, period, l.Fence())
	applied, err := settle(ctx, stalled.db, stalled.name, period, l.Fence())
	if err != nil {
		return err
	}
	d.expect(!applied, "the database refused the stalled holder's late write")
	rerr := l.Release(ctx)
	d.expect(errors.Is(rerr, contend.ErrLockLost), "its release reports the lock lost, and deletes nothing")
	return nil
}

// checkLedger checks the end state: every period settled once, by one
// instance.
func (d *demo) checkLedger(ctx context.Context, db *sqlx.DB, periods int) error {
	var rows []struct {
		Period int `db:"period"`
		N      int `db:"n"`
	}
	if err := db.SelectContext(ctx, &rows, `SELECT period, count(*) AS n FROM settlements GROUP BY period ORDER BY period`); err != nil {
		return err
	}
	once := len(rows) == periods
	for i, r := range rows {
		once = once && r.Period == i+1 && r.N == 1
	}
	fmt.Fprintln(d.out)
	d.expect(once, "the ledger shows each of the %d periods settled exactly once", periods)
	return nil
}

// checkMetrics reads what the instances' Observer recorded: the periods an
// instance found the job running are conflicts, and the stalled holder's
// lock is the one loss.
func (d *demo) checkMetrics(ctx context.Context, reader *sdkmetric.ManualReader) error {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if c, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range c.DataPoints {
					sums[m.Name] += p.Value
				}
			}
		}
	}
	fmt.Fprintf(d.out, "OpenTelemetry (otelcontend): contend.conflicts %d, contend.losses %d\n",
		sums["contend.conflicts"], sums["contend.losses"])
	d.expect(sums["contend.conflicts"] >= 1, "the metrics count the conflicts of instances that found the job running")
	d.expect(sums["contend.losses"] == 1, "the metrics count one lost lock, the stalled holder's")
	return nil
}

// env is the environment variable name's value, or def when it is unset.
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// randomID returns 64 random bits in hex, for names no other run picks.
func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// createSchema creates a schema of the run's own on the server, so that the
// story never touches another program's tables, and returns a URL whose
// connections work in it, and what drops it.
func createSchema(ctx context.Context, server string) (schemaURL string, drop func() error, err error) {
	name := "settlement_" + randomID()
	u, err := url.Parse(server)
	if err != nil {
		return "", nil, fmt.Errorf("CONTEND_POSTGRES_URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", name) // sent to the server as a run-time setting
	u.RawQuery = q.Encode()
	execute := func(ctx context.Context, stmt string) error {
		db, err := sqlx.Open("pgx", server)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, stmt)
		return err
	}
	if err := execute(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", nil, fmt.Errorf("create schema: %w", err)
	}
	return u.String(), func() error { return execute(context.WithoutCancel(ctx), "DROP SCHEMA "+name+" CASCADE") }, nil
}

// deleteKeys deletes the Redis keys under prefix.
func deleteKeys(ctx context.Context, rdb *redis.Client, prefix string) error {
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := rdb.Del(ctx, iter.Val()).Err(); err != nil {
			return err
		}
	}
	return iter.Err()
}
