package atomic_test

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
	"github.com/contend/contend/atomic"
)

// Selling the last item: the stock check is part of the UPDATE, so however
// many servers run this at once, the database lets exactly as many through as
// there are items.
func ExampleUpdate() {
	db, done := exampleDB(`CREATE TABLE products (id text PRIMARY KEY, stock int NOT NULL);
		INSERT INTO products VALUES ('sku-1', 1)`)
	defer done()
	ctx := context.Background()

	for range 2 {
		sold, err := atomic.Update(ctx, db,
			`UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`, "sku-1")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("sold:", sold)
	}
	// Output:
	// sold: true
	// sold: false
}

// A bot starts once: the engine id is made first, claimed into the bot's
// row only where it is empty, and handed to the engine.
func ExampleClaimer_Claim() {
	db, done := exampleDB(`CREATE TABLE bots (id text PRIMARY KEY, engine_id text);
		INSERT INTO bots VALUES ('bot-1', NULL)`)
	defer done()
	ctx := context.Background()
	claimer, err := atomic.NewClaimer(db, atomic.ClaimerConfig{Table: "bots", OwnerColumn: "engine_id"})
	if err != nil {
		log.Fatal(err)
	}
	defer claimer.Close(ctx)

	engineID, err := claimer.Claim(ctx, "bot-1") // the first click
	fmt.Println("first start:", err == nil)
	_, err = claimer.Claim(ctx, "bot-1") // the double click
	fmt.Println("second start already running:", errors.Is(err, contend.ErrConflict))

	released, err := claimer.Release(ctx, "bot-1", engineID) // stop
	fmt.Println("stopped:", released, err)
	// Output:
	// first start: true
	// second start already running: true
	// stopped: true <nil>
}

// As a guard, the claimer runs fn only for the caller that won the claim and
// releases it afterwards, also when fn fails.
func ExampleClaimer_Do() {
	db, done := exampleDB(`CREATE TABLE jobs (id text PRIMARY KEY, owner text);
		INSERT INTO jobs VALUES ('nightly-report', NULL)`)
	defer done()
	ctx := context.Background()
	claimer, err := atomic.NewClaimer(db, atomic.ClaimerConfig{Table: "jobs"})
	if err != nil {
		log.Fatal(err)
	}
	defer claimer.Close(ctx)

	var g contend.Guard = claimer
	err = g.Do(ctx, "nightly-report", func(ctx context.Context) error {
		// While this runs, every other instance's Do gets ErrConflict.
		err := g.Do(ctx, "nightly-report", func(context.Context) error { return nil })
		fmt.Println("inside, a second run is refused:", errors.Is(err, contend.ErrConflict))
		return nil
	})
	fmt.Println("done:", err)
	err = g.Do(ctx, "nightly-report", func(context.Context) error { return nil })
	fmt.Println("released, runs again:", err)
	// Output:
	// inside, a second run is refused: true
	// done: <nil>
	// released, runs again: <nil>
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
