package mysqldb_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"

	"github.com/go-sql-driver/mysql"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/mysqldb"
)

// Wrap a pool once, then hand it to the strategies: the last item sells
// once, and a bot starts once.
func ExampleWrap() {
	ctx := context.Background()
	cfg, done := exampleDatabase(ctx) // a database of the example's own
	defer done()
	db, err := mysqldb.Open(cfg) // sets clientFoundRows
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	for _, stmt := range []string{
		"CREATE TABLE products (id varchar(64) PRIMARY KEY, stock int NOT NULL)",
		"INSERT INTO products VALUES ('sku-1', 1)",
		"CREATE TABLE bots (id varchar(64) PRIMARY KEY, engine_id varchar(64))",
		"INSERT INTO bots VALUES ('bot-1', NULL)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			log.Fatal(err)
		}
	}

	h := mysqldb.Wrap(db)
	for range 2 {
		applied, err := atomic.Update(ctx, h, "UPDATE products SET stock = stock - 1 WHERE id = ? AND stock >= 1", "sku-1")
		fmt.Println("sold:", applied, err)
	}

	claimer, err := atomic.NewClaimer(h, atomic.ClaimerConfig{Table: "bots", OwnerColumn: "engine_id"})
	if err != nil {
		log.Fatal(err)
	}
	defer claimer.Close(ctx)
	err = claimer.Do(ctx, "bot-1", func(ctx context.Context) error {
		// A double click while the engine starts:
		err := claimer.Do(ctx, "bot-1", func(context.Context) error { return nil })
		fmt.Println("second start conflicts:", errors.Is(err, contend.ErrConflict))
		return nil
	})
	fmt.Println("first start:", err)
	// Output:
	// sold: true <nil>
	// sold: false <nil>
	// second start conflicts: true
	// first start: <nil>
}

// exampleDatabase creates a database of its own on the server that
// CONTEND_MARIADB_URL names (mysql://user:password@host:port/database;
// default: root on the local server), and returns the driver's config for
// it and what drops it.
func exampleDatabase(ctx context.Context) (*mysql.Config, func()) {
	server := os.Getenv("CONTEND_MARIADB_URL")
	if server == "" {
		server = "mysql://root@127.0.0.1:3306/test"
	}
	u, err := url.Parse(server)
	if err != nil {
		log.Fatal(err)
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, u.Path[1:]
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	admin, err := mysqldb.Open(cfg)
	if err != nil {
		log.Fatal(err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "example_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		log.Fatal(err)
	}
	own := cfg.Clone()
	own.DBName = name
	return own, func() {
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			log.Fatal(err)
		}
		admin.Close()
	}
}
