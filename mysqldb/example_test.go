package mysqldb_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/mysqldb"
)

// Wrap a pool once, then hand it to the strategies: the last item sells
// once, and a bot starts once.
func ExampleWrap() {
	ctx := context.Background()
	server, err := testserver.MariaDBURL()
	if err != nil {
		panic(err)
	}
	name, url, err := testserver.CreateDatabase(ctx, server)
	if err != nil {
		panic(err)
	}
	defer testserver.DropDatabase(ctx, server, name)
	cfg, err := testserver.MariaDBConfig(url)
	if err != nil {
		panic(err)
	}
	db, err := mysqldb.Open(cfg) // sets clientFoundRows
	if err != nil {
		panic(err)
	}
	defer db.Close()
	for _, stmt := range []string{
		"CREATE TABLE products (id varchar(64) PRIMARY KEY, stock int NOT NULL)",
		"INSERT INTO products VALUES ('sku-1', 1)",
		"CREATE TABLE bots (id varchar(64) PRIMARY KEY, engine_id varchar(64))",
		"INSERT INTO bots VALUES ('bot-1', NULL)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			panic(err)
		}
	}

	h := mysqldb.Wrap(db)
	for range 2 {
		applied, err := atomic.Update(ctx, h, "UPDATE products SET stock = stock - 1 WHERE id = ? AND stock >= 1", "sku-1")
		fmt.Println("sold:", applied, err)
	}

	claimer, err := atomic.NewClaimer(ctx, h, atomic.ClaimConfig{Table: "bots", OwnerColumn: "engine_id"})
	if err != nil {
		panic(err)
	}
	defer claimer.Close()
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
