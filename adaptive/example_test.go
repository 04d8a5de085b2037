package adaptive_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/contend/contend"
	"github.com/contend/contend/adaptive"
	"github.com/contend/contend/internal/workload"
)

var errSoldOut = errors.New("sold out")

// A sale decides on the stock it read, in whichever mode the key is in: the
// same fn runs optimistically while the product is quiet and under its row
// lock once buyers pile up.
func ExampleGuard_Do() {
	db, done := workload.Scratch(`CREATE TABLE products (id text PRIMARY KEY, stock bigint NOT NULL,
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
