package pessimistic_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"sync"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/pessimistic"
)

// Three servers sell the last item at once. Each reads the stock, checks it
// and writes it back, a read-check-write that oversells without a lock; with
// the row locked first, the others wait, then read the stock the first one
// left, and exactly one sale goes through.
func ExampleLocker_Do() {
	db, done := exampleDB(`CREATE TABLE products (id text PRIMARY KEY, stock int NOT NULL);
		INSERT INTO products VALUES ('sku-1', 1)`)
	defer done()
	locker, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "products"})
	if err != nil {
		log.Fatal(err)
	}
	errSoldOut := errors.New("sold out")
	sell := func(ctx context.Context) error {
		q := contend.Querier(ctx, db) // the locker's transaction, never the pool
		var stock int
		if err := q.QueryRowContext(ctx, `SELECT stock FROM products WHERE id = $1`, "sku-1").Scan(&stock); err != nil {
			return err
		}
		if stock < 1 {
			return errSoldOut
		}
		_, err := q.ExecContext(ctx, `UPDATE products SET stock = $2 WHERE id = $1`, "sku-1", stock-1)
		return err
	}

	var (
		mu            sync.Mutex
		sold, refused int
		wg            sync.WaitGroup
	)
	for range 3 {
		wg.Go(func() {
			err := locker.Do(context.Background(), "sku-1", sell)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				sold++
			case errors.Is(err, errSoldOut):
				refused++
			default:
				log.Print(err)
			}
		})
	}
	wg.Wait()
	fmt.Printf("sold %d, sold out %d\n", sold, refused)
	// Output: sold 1, sold out 2
}

// A transfer reads two balances and writes both. LockMany locks both rows in
// one statement, in key order, so a transfer the other way round at the same
// time waits instead of deadlocking.
func ExampleLocker_LockMany() {
	db, done := exampleDB(`CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL);
		INSERT INTO accounts VALUES ('alice', 100), ('bob', 20)`)
	defer done()
	ctx := context.Background()
	accounts, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "accounts"})
	if err != nil {
		log.Fatal(err)
	}
	errNoFunds := errors.New("insufficient funds")
	transfer := func(from, to string, amount int) error {
		return accounts.LockMany(ctx, []string{from, to}, func(ctx context.Context, tx contend.DBTX, _ []string) error {
			var balance int
			if err := tx.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = $1`, from).Scan(&balance); err != nil {
				return err
			}
			if balance < amount {
				return errNoFunds
			}
			if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance - $2 WHERE id = $1`, from, amount); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, to, amount)
			return err
		})
	}

	fmt.Println("alice → bob 30:", transfer("alice", "bob", 30))
	fmt.Println("bob → alice 80:", transfer("bob", "alice", 80))
	fmt.Println("alice → carol 5:", errors.Is(transfer("alice", "carol", 5), contend.ErrNotFound))
	var alice, bob int
	if err := db.QueryRow(`SELECT (SELECT balance FROM accounts WHERE id = 'alice'), (SELECT balance FROM accounts WHERE id = 'bob')`).Scan(&alice, &bob); err != nil {
		log.Fatal(err)
	}
	fmt.Println("alice", alice, "bob", bob)
	// Output:
	// alice → bob 30: <nil>
	// bob → alice 80: insufficient funds
	// alice → carol 5: true
	// alice 70 bob 50
}

// A work queue: each worker claims a batch of pending jobs, skipping the ones
// other workers hold, and marks them done in the same transaction, so a
// worker that dies mid-batch puts its jobs back.
func ExampleLocker_Claim() {
	db, done := exampleDB(`CREATE TABLE jobs (id text PRIMARY KEY, done boolean NOT NULL DEFAULT false);
		INSERT INTO jobs (id) VALUES ('job-1'), ('job-2'), ('job-3')`)
	defer done()
	ctx := context.Background()
	queue, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "jobs", ClaimWhere: "NOT done"})
	if err != nil {
		log.Fatal(err)
	}
	work := func(ctx context.Context, tx contend.DBTX, claimed []string) error {
		fmt.Println("working on", claimed)
		for _, id := range claimed {
			if _, err := tx.ExecContext(ctx, `UPDATE jobs SET done = true WHERE id = $1`, id); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		err := queue.Claim(ctx, 2, work)
		if errors.Is(err, contend.ErrNotFound) {
			fmt.Println("queue empty")
			break
		}
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// working on [job-1 job-2]
	// working on [job-3]
	// queue empty
}

// A monthly report must be made once, by whichever instance gets there
// first; there is no row to lock before it exists. An advisory lock on the
// period's name keeps the others out while the first one works.
func ExampleAdvisory_Do() {
	db, done := exampleDB(`CREATE TABLE reports (period text PRIMARY KEY)`)
	defer done()
	guard, err := pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{OnHeld: pessimistic.NoWait})
	if err != nil {
		log.Fatal(err)
	}
	report := func(ctx context.Context) error {
		_, err := contend.Querier(ctx, db).ExecContext(ctx, `INSERT INTO reports VALUES ('2024-06') ON CONFLICT DO NOTHING`)
		return err
	}

	err = guard.Do(context.Background(), "report:2024-06", func(ctx context.Context) error {
		// Meanwhile another instance tries (its own transaction: a context
		// that does not carry this one).
		err := guard.Do(context.Background(), "report:2024-06", report)
		fmt.Println("another instance meanwhile:", errors.Is(err, contend.ErrConflict))
		return report(ctx)
	})
	fmt.Println("first instance:", err)
	// Output:
	// another instance meanwhile: true
	// first instance: <nil>
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
