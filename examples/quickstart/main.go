// Command quickstart is the first program of the README: 100 buyers race
// for the last 3 items of a product, and exactly 3 are sold, because the
// stock check is part of the UPDATE.
//
//	go run ./examples/quickstart
//
// It uses PostgreSQL at $CONTEND_POSTGRES_URL, by default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"sync"

	_ "github.com/lib/pq" // or _ "github.com/jackc/pgx/v5/stdlib", driver "pgx"

	"github.com/contend/contend/atomic"
)

func main() {
	dsn := os.Getenv("CONTEND_POSTGRES_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	sold, left, err := run(context.Background(), dsn)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("sold %d, left %d\n", sold, left)
}

func run(ctx context.Context, dsn string) (sold, left int, err error) {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(10)

	// Three items left.
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS quickstart_products (id text PRIMARY KEY, stock int NOT NULL);
		INSERT INTO quickstart_products VALUES ('sku-1', 3) ON CONFLICT (id) DO UPDATE SET stock = 3`); err != nil {
		return 0, 0, err
	}

	// 100 buyers at once. Each sale is one statement whose WHERE clause is
	// the stock check: the database orders concurrent sellers, and a seller
	// that finds no stock changes no row, which Update reports as false.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := atomic.Update(ctx, db,
				`UPDATE quickstart_products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`, "sku-1")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case ok:
				sold++
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return sold, 0, errs[0]
	}

	err = db.QueryRowContext(ctx, `SELECT stock FROM quickstart_products WHERE id = 'sku-1'`).Scan(&left)
	return sold, left, err
}
