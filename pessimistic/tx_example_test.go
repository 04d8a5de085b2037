package pessimistic_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/contend/contend"
	"github.com/contend/contend/pessimistic"
	"github.com/contend/contend/pgxdb"
)

// Three transfers of 40 leave an account of 100 at once. Each reads the
// balance, checks it and writes it back; under SERIALIZABLE the server
// fails all but one of the transactions that read the same balance, and
// InTx runs the losers again from the start, on the balance the winner
// left: two transfers go through, the third finds too little.
func ExampleInTx() {
	dsn, drop := txExampleSchema(`CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL);
		INSERT INTO accounts VALUES ('a', 100), ('b', 0)`)
	defer drop()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	errTooLittle := errors.New("too little")
	transfer := func(ctx context.Context) error {
		q := contend.Querier(ctx, db) // InTx's transaction
		var balance int
		if err := q.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 'a'`).Scan(&balance); err != nil {
			return err
		}
		if balance < 40 {
			return errTooLittle
		}
		if _, err := q.ExecContext(ctx, `UPDATE accounts SET balance = $1 WHERE id = 'a'`, balance-40); err != nil {
			return err
		}
		_, err := q.ExecContext(ctx, `UPDATE accounts SET balance = balance + 40 WHERE id = 'b'`)
		return err
	}
	opts := &pessimistic.TxOptions{Isolation: sql.LevelSerializable, Retry: contend.Retry{MaxAttempts: 20}}

	var (
		mu            sync.Mutex
		done, refused int
		wg            sync.WaitGroup
	)
	for range 3 {
		wg.Go(func() {
			err := pessimistic.InTx(context.Background(), db, opts, transfer)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				done++
			case errors.Is(err, errTooLittle):
				refused++
			default:
				log.Fatal(err)
			}
		})
	}
	wg.Wait()
	var a, b int
	if err := db.QueryRow(`SELECT (SELECT balance FROM accounts WHERE id = 'a'), (SELECT balance FROM accounts WHERE id = 'b')`).Scan(&a, &b); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("transferred %d, refused %d; a=%d b=%d\n", done, refused, a, b)
	// Output: transferred 2, refused 1; a=20 b=80
}

// The same transaction on pgx's native pool: wrap the pool for InTx and
// the guards, and reach the transaction with pgxdb.Querier. A Locker on the
// pool called inside joins the transaction, so its row lock lasts until
// InTx commits.
func ExampleInTx_pgx() {
	dsn, drop := txExampleSchema(`CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL);
		INSERT INTO accounts VALUES ('a', 100), ('b', 0)`)
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := pgxdb.Wrap(pool)
	accounts, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "accounts"})
	if err != nil {
		log.Fatal(err)
	}

	err = pessimistic.InTx(ctx, db, nil, func(ctx context.Context) error {
		return accounts.LockMany(ctx, []string{"b", "a"}, func(ctx context.Context, _ contend.DBTX, locked []string) error {
			q := pgxdb.Querier(ctx, pool) // InTx's pgx.Tx
			if _, err := q.Exec(ctx, `UPDATE accounts SET balance = balance - 40 WHERE id = 'a'`); err != nil {
				return err
			}
			_, err := q.Exec(ctx, `UPDATE accounts SET balance = balance + 40 WHERE id = 'b'`)
			fmt.Println("locked", locked)
			return err
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	var a, b int
	if err := pool.QueryRow(ctx, `SELECT (SELECT balance FROM accounts WHERE id = 'a'), (SELECT balance FROM accounts WHERE id = 'b')`).Scan(&a, &b); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("a=%d b=%d\n", a, b)
	// Output:
	// locked [a b]
	// a=60 b=40
}

// txExampleSchema makes a schema of the example's own on the server that
// CONTEND_POSTGRES_URL names (default: the local server), runs setup in
// it, and returns a DSN whose sessions use it, and a func that drops it.
func txExampleSchema(setup string) (dsn string, drop func()) {
	server := os.Getenv("CONTEND_POSTGRES_URL")
	if server == "" {
		server = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("pgx", server)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		log.Fatal(err)
	}
	u, err := url.Parse(server)
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema) // sent to the server as a run-time setting
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(setup); err != nil {
		log.Fatal(err)
	}
	return u.String(), func() {
		if _, err := admin.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			log.Fatal(err)
		}
		admin.Close()
	}
}
