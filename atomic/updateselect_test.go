package atomic_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

// 40 goroutines buy from a stock of 20 with UpdateSelect: 20 win, and each
// winner reads back the stock its own decrement left, so the values read
// are 19 … 0, each once. The naive shape, the read-back after the update's
// own commit, the negative control, reads what later buyers left.
func TestUpdateSelectReadsItsOwnWrite(t *testing.T) {
	t.Parallel()
	const stock, buyers = 20, 40
	for _, driver := range append([]string{testserver.MariaDBDriver}, testserver.AllDrivers...) {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.URL(t, driver)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			update, query := `UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`, `SELECT stock FROM products WHERE id = $1`
			if driver == testserver.MariaDBDriver {
				mariaProducts(t, db, stock, "p")
				update, query = mariaDecrement, "SELECT stock FROM products WHERE id = ?"
			} else {
				workload.Products(t, db, stock, "p")
			}
			buy := func(ctx context.Context) (int, bool, error) {
				var left int
				applied, err := atomic.UpdateSelect(ctx, h, []any{&left}, update, []any{"p"}, query, "p")
				return left, applied, err
			}
			require.Equal(t, seq(stock), reads(t, buyers, buy))

			if driver != testserver.MariaDBDriver {
				return
			}
			_, err := db.Exec("UPDATE products SET stock = ? WHERE id = 'p'", stock)
			require.NoError(t, err)
			naive := func(ctx context.Context) (int, bool, error) {
				applied, err := atomic.Update(ctx, h, update, "p")
				if err != nil || !applied {
					return 0, false, err
				}
				time.Sleep(5 * time.Millisecond) // others buy meanwhile
				var left int
				err = db.GetContext(ctx, &left, query, "p")
				return left, true, err
			}
			require.NotEqual(t, seq(stock), reads(t, buyers, naive), "the naive read-back read only its own writes: the test cannot tell")
		})
	}
}

// seq returns 0 … n-1.
func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// reads runs buy from n goroutines at once and returns, sorted, the values
// the winners read.
func reads(t *testing.T, n int, buy func(ctx context.Context) (int, bool, error)) []int {
	t.Helper()
	var (
		mu   sync.Mutex
		read []int
	)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			left, applied, err := buy(t.Context())
			if err != nil {
				errs <- fmt.Errorf("buy: %w", err)
				return
			}
			if applied {
				mu.Lock()
				read = append(read, left)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	sort.Ints(read)
	return read
}
