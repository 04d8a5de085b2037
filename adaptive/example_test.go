package adaptive_test

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
	"github.com/contend/contend/adaptive"
)

var errSoldOut = errors.New("sold out")

// A sale decides on the stock it read, in whichever mode the key is in: the
// same fn runs optimistically while the product is quiet and under its row
// lock once buyers pile up.
func ExampleGuard_Do() {
	db, done := exampleDB(`CREATE TABLE products (id text PRIMARY KEY, stock bigint NOT NULL,
		version bigint NOT NULL DEFAULT 0);
		INSERT INTO products (id, stock) VALUES ('sku-1', 1)`)
	defer done()
	ctx := context.Background()
	g, err := adaptive.NewGuard(db, adaptive.Config{Table: "products"})
	if err != nil {
		log.Fatal(err)
	}

	sell := func(ctx context.Context) error {
		q := contend.Querier(ctx, db)
		var stock int64
		if err := q.QueryRowContext(ctx, `SELECT stock FROM products WHERE id = 'sku-1'`).Scan(&stock); err != nil {
			return err
		}
		if stock < 1 {
			return errSoldOut
		}
		_, err := q.ExecContext(ctx, `UPDATE products SET stock = stock - 1 WHERE id = 'sku-1'`)
		return err
	}
	fmt.Println(g.Mode("sku-1"), g.Do(ctx, "sku-1", sell))
	fmt.Println(g.Mode("sku-1"), g.Do(ctx, "sku-1", sell))
	// Output:
	// optimistic <nil>
	// optimistic sold out
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
