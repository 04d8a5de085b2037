package distlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/distlock"
)

// A cron job that every instance starts on the hour and only one must run:
// with NoWait, the others give up at once with ErrConflict.
func ExampleClient_Do() {
	rdb, prefix, done := exampleRedis()
	defer done()
	ctx := context.Background()
	locks, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix, TTL: 10 * time.Second, NoWait: true})
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	err = locks.Do(ctx, "nightly-report", func(ctx context.Context) error {
		// While this runs (refreshed every TTL/3), every other instance's Do
		// is refused.
		err := locks.Do(ctx, "nightly-report", func(context.Context) error { return nil })
		fmt.Println("another instance is refused:", errors.Is(err, contend.ErrConflict))
		l, _ := distlock.FromContext(ctx)
		fmt.Println("fn has a fencing token:", l.Fence() > 0)
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// another instance is refused: true
	// fn has a fencing token: true
	// done: <nil>
}

// Obtain waits in line: the release hands the lock straight to the waiter,
// with a larger fencing token.
func ExampleClient_Obtain() {
	rdb, prefix, done := exampleRedis()
	defer done()
	ctx := context.Background()
	locks, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	first, err := locks.Obtain(ctx, "invoice-42", 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	second := make(chan *distlock.Lock)
	go func() {
		l, err := locks.Obtain(ctx, "invoice-42", 5*time.Second) // waits for first
		if err != nil {
			log.Fatal(err)
		}
		second <- l
	}()
	// ... call the external API once for invoice 42 ...
	if err := first.Release(ctx); err != nil {
		log.Fatal(err)
	}
	next := <-second
	fmt.Println("handed over, fencing token larger:", next.Fence() > first.Fence())
	_ = first.Release(ctx) // again: a no-op, the new holder keeps its lock
	_, err = next.TTL(ctx)
	fmt.Println("new holder still holds it:", err == nil)
	fmt.Println("released:", next.Release(ctx))
	// Output:
	// handed over, fencing token larger: true
	// new holder still holds it: true
	// released: <nil>
}

// A holder that stalled past its lease writes late with its old fencing
// token; the resource refuses it with one conditional UPDATE, because a newer
// holder already wrote with a larger token.
func ExampleLock_Fence() {
	rdb, prefix, done := exampleRedis()
	defer done()
	db, dropSchema := exampleDB(`CREATE TABLE accounts (id text PRIMARY KEY, last_fence bigint NOT NULL, balance bigint NOT NULL);
		INSERT INTO accounts VALUES ('acct-1', 0, 100)`)
	defer dropSchema()
	ctx := context.Background()
	locks, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)
	credit := func(l *distlock.Lock, amount int) bool {
		applied, err := atomic.Update(ctx, db,
			`UPDATE accounts SET balance = balance + $3, last_fence = $2 WHERE id = $1 AND last_fence < $2`,
			"acct-1", l.Fence(), amount)
		if err != nil {
			log.Fatal(err)
		}
		return applied
	}

	stalled, err := locks.TryObtain(ctx, "acct-1", 50*time.Millisecond)
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a GC pause: the lease runs out
	current, err := locks.Obtain(ctx, "acct-1", time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("current holder's credit applied:", credit(current, 10))
	fmt.Println("stalled holder's late credit applied:", credit(stalled, 10))
	fmt.Println("stalled holder's release:", errors.Is(stalled.Release(ctx), contend.ErrLockLost))
	if err := current.Release(ctx); err != nil {
		log.Fatal(err)
	}
	var balance int
	if err := db.Get(&balance, `SELECT balance FROM accounts WHERE id = 'acct-1'`); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// current holder's credit applied: true
	// stalled holder's late credit applied: false
	// stalled holder's release: true
	// balance: 110
}

// A quorum over independent Redis masters keeps the lock while a minority of
// them is down. (Here three databases of one server stand in for three
// servers, which a real deployment needs.)
func ExampleQuorum() {
	rdb, prefix, done := exampleRedis()
	defer done()
	var nodes []redis.Scripter
	for db := range 3 {
		node := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, DB: db})
		defer node.Close()
		nodes = append(nodes, node)
	}
	ctx := context.Background()
	q, err := distlock.NewQuorum(nodes, distlock.QuorumConfig{Prefix: prefix, NodeTimeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close(ctx)
	l, err := q.TryObtain(ctx, "ledger-close", 10*time.Second)
	fmt.Println("obtained on a majority:", err == nil)
	_, err = q.TryObtain(ctx, "ledger-close", 10*time.Second)
	fmt.Println("second attempt busy:", errors.Is(err, contend.ErrConflict))
	fmt.Println("released:", l.Release(ctx))
	// Output:
	// obtained on a majority: true
	// second attempt busy: true
	// released: <nil>
}

// exampleRedis returns a client of the Redis server named by
// CONTEND_REDIS_URL (default: the local one), a key prefix no other run
// uses, and a function that deletes the prefix's keys and closes the client.
func exampleRedis() (*redis.Client, string, func()) {
	addr := os.Getenv("CONTEND_REDIS_URL")
	if addr == "" {
		addr = "redis://127.0.0.1:6379/0"
	}
	opts, err := redis.ParseURL(addr)
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "example:" + hex.EncodeToString(b[:]) + ":"
	return rdb, prefix, func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			log.Print(err)
		}
		rdb.Close()
	}
}

// exampleDB opens a pool on the PostgreSQL server named by
// CONTEND_POSTGRES_URL (default: the local one, database test), in a schema
// of its own so that examples running at once never share a table, runs setup
// there, and returns the pool with a function that drops the schema.
func exampleDB(setup string) (*sqlx.DB, func()) {
	server := os.Getenv("CONTEND_POSTGRES_URL")
	if server == "" {
		server = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + hex.EncodeToString(b[:])
	admin := sqlx.MustOpen("pgx", server)
	admin.MustExec("CREATE SCHEMA " + schema)
	u, err := url.Parse(server)
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema) // sent to the server as a run-time setting
	u.RawQuery = q.Encode()
	db := sqlx.MustOpen("pgx", u.String())
	db.MustExec(setup)
	return db, func() {
		db.Close()
		admin.MustExec("DROP SCHEMA " + schema + " CASCADE")
		admin.Close()
	}
}
