package optimistic_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/optimistic"
)

const exampleAccounts = `CREATE TABLE accounts (id text PRIMARY KEY, owner text NOT NULL,
	balance bigint NOT NULL, version bigint NOT NULL DEFAULT 0);
	INSERT INTO accounts (id, owner, balance) VALUES ('acc-1', 'ann', 100)`

// Account is a row of the accounts table.
type Account struct {
	ID      string `db:"id"`
	Owner   string `db:"owner"`
	Balance int64  `db:"balance"`
	Version int64  `db:"version"`
}

var errInsufficientFunds = errors.New("insufficient funds")

// A withdrawal decides on the balance it read; if another withdrawal commits
// in between, Update reads again and decides again, so both count and the
// balance never goes below zero.
func ExampleStore_Update() {
	db, done := exampleDB(exampleAccounts)
	defer done()
	ctx := context.Background()
	accounts, err := optimistic.NewStore[Account](db, optimistic.Config{Table: "accounts"})
	if err != nil {
		log.Fatal(err)
	}

	withdraw := func(amount int64) (Account, error) {
		return accounts.Update(ctx, "acc-1", func(a *Account) error {
			if a.Balance < amount {
				return errInsufficientFunds
			}
			a.Balance -= amount
			return nil
		})
	}
	a, err := withdraw(80)
	fmt.Println("balance:", a.Balance, "version:", a.Version, err)
	_, err = withdraw(80)
	fmt.Println("second withdrawal:", err)
	// Output:
	// balance: 20 version: 1 <nil>
	// second withdrawal: insufficient funds
}

// A form shows the account and sends back the version it showed. If the
// account changed meanwhile, saving the form conflicts instead of silently
// undoing the other change.
func ExampleStore_Save() {
	db, done := exampleDB(exampleAccounts)
	defer done()
	ctx := context.Background()
	accounts, err := optimistic.NewStore[Account](db, optimistic.Config{Table: "accounts"})
	if err != nil {
		log.Fatal(err)
	}

	form, err := accounts.Get(ctx, "acc-1") // GET /accounts/acc-1, shown to the user
	if err != nil {
		log.Fatal(err)
	}
	// Meanwhile a payment lands.
	if _, err := accounts.Update(ctx, "acc-1", func(a *Account) error { a.Balance += 50; return nil }); err != nil {
		log.Fatal(err)
	}

	form.Owner = "Ann Smith" // PUT /accounts/acc-1 with version 0
	err = accounts.Save(ctx, &form)
	fmt.Println("stale form refused:", errors.Is(err, contend.ErrConflict))

	form, _ = accounts.Get(ctx, "acc-1") // the user reloads and edits again
	form.Owner = "Ann Smith"
	fmt.Println("saved:", accounts.Save(ctx, &form), "version:", form.Version)
	fmt.Println("saved again:", accounts.Save(ctx, &form), "version:", form.Version)
	// Output:
	// stale form refused: true
	// saved: <nil> version: 2
	// saved again: <nil> version: 3
}

// A discount is granted based on the customer's tier, which the grant does
// not change. Touching the customer in the grant's transaction makes the
// grant fail if the tier changed since it was read.
func ExampleStore_Touch() {
	db, done := exampleDB(`CREATE TABLE customers (id text PRIMARY KEY, tier text NOT NULL, version bigint NOT NULL);
		CREATE TABLE discounts (customer text NOT NULL, pct int NOT NULL);
		INSERT INTO customers VALUES ('c-1', 'gold', 0)`)
	defer done()
	ctx := context.Background()
	type Customer struct {
		ID      string `db:"id"`
		Tier    string `db:"tier"`
		Version int64  `db:"version"`
	}
	customers, err := optimistic.NewStore[Customer](db, optimistic.Config{Table: "customers"})
	if err != nil {
		log.Fatal(err)
	}

	grant := func(c Customer) error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if c.Tier != "gold" {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO discounts VALUES ($1, 20)`, c.ID); err != nil {
			return err
		}
		if err := customers.Touch(contend.WithQuerier(ctx, tx), &c); err != nil {
			return err // the tier may have changed: the insert rolls back
		}
		return tx.Commit()
	}

	c, _ := customers.Get(ctx, "c-1")
	// Before the grant commits, the customer is downgraded.
	if _, err := customers.Update(ctx, "c-1", func(c *Customer) error { c.Tier = "silver"; return nil }); err != nil {
		log.Fatal(err)
	}
	err = grant(c)
	fmt.Println("grant on a stale tier:", errors.Is(err, contend.ErrConflict))
	var n int
	_ = db.Get(&n, `SELECT count(*) FROM discounts`)
	fmt.Println("discounts:", n)
	// Output:
	// grant on a stale tier: true
	// discounts: 0
}

// The guard runs fn in a transaction that commits only if nobody else
// committed a change to the key meanwhile; fn reaches the transaction through
// contend.Querier, so the same fn works under every guard. fn may run more
// than once.
func ExampleGuard_Do() {
	db, done := exampleDB(exampleAccounts)
	defer done()
	ctx := context.Background()
	guard, err := optimistic.NewGuard(db, optimistic.Config{
		Table: "accounts",
		Observer: contend.ObserverFunc(func(_ context.Context, e contend.Event) {
			fmt.Printf("%s %s: %d attempt(s), err %v\n", e.Kind, e.Key, e.Attempts, e.Err)
		}),
	})
	if err != nil {
		log.Fatal(err)
	}

	var g contend.Guard = guard
	err = g.Do(ctx, "acc-1", func(ctx context.Context) error {
		q := contend.Querier(ctx, db)
		var balance int64
		if err := q.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 'acc-1'`).Scan(&balance); err != nil {
			return err
		}
		_, err := q.ExecContext(ctx, `UPDATE accounts SET balance = $1 WHERE id = 'acc-1'`, balance-30)
		return err
	})
	fmt.Println("done:", err)
	var a Account
	_ = db.Get(&a, `SELECT * FROM accounts WHERE id = 'acc-1'`)
	fmt.Println("balance:", a.Balance, "version:", a.Version)
	// Output:
	// released acc-1: 1 attempt(s), err <nil>
	// done: <nil>
	// balance: 70 version: 1
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
