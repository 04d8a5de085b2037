package redisq_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/token"
	"github.com/contend/contend/internal/txn"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// sellOnce is the sale's batch handler: each job is a purchase of its key,
// the payload the purchase's id. In one transaction, a batch's new purchases
// are recorded, sold by one conditional UPDATE per product (the first
// min(n, stock) of them, in order) and marked; a purchase already recorded, a
// redelivery (delivery is at least once), is answered from its record and
// sells nothing again.
func sellOnce(db *sqlx.DB) queue.BatchHandler {
	return func(ctx context.Context, jobs []queue.Job) ([]queue.Result, error) {
		ids := make([]string, len(jobs))
		for i, j := range jobs {
			ids[i] = string(j.Payload)
		}
		sold := map[string]bool{}
		_, err := txn.Run(ctx, db, txn.Options{}, func(ctx context.Context, tx contend.DBTX) error {
			clear(sold)
			rows, err := tx.QueryContext(ctx, `INSERT INTO sales (id) SELECT unnest($1::text[]) ON CONFLICT (id) DO NOTHING RETURNING id`, pq.Array(ids))
			if err != nil {
				return err
			}
			fresh := map[string]bool{}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return err
				}
				fresh[id] = true
			}
			if err := rows.Err(); err != nil {
				return err
			}
			byKey, order := map[string][]string{}, []string(nil)
			for _, j := range jobs {
				if id := string(j.Payload); fresh[id] {
					if byKey[j.Key] == nil {
						order = append(order, j.Key)
					}
					byKey[j.Key] = append(byKey[j.Key], id)
				}
			}
			var won []string
			for _, k := range order {
				var n int
				if err := tx.QueryRowContext(ctx, workload.SellN, k, len(byKey[k])).Scan(&n); err != nil {
					return err
				}
				won = append(won, byKey[k][:n]...)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE sales SET sold = true WHERE id = ANY($1)`, pq.Array(won)); err != nil {
				return err
			}
			// Every purchase's answer, the redelivered ones' from before.
			rows, err = tx.QueryContext(ctx, `SELECT id FROM sales WHERE id = ANY($1) AND sold`, pq.Array(ids))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					return err
				}
				sold[id] = true
			}
			return rows.Err()
		})
		if err != nil {
			return nil, err
		}
		results := make([]queue.Result, len(jobs))
		for i, id := range ids {
			results[i].Value = []byte("sold-out")
			if sold[id] {
				results[i].Value = []byte("sold")
			}
		}
		return results, nil
	}
}

// The oversell story's sale across three OS processes, each running an instance
// and 64 buyers: stock 1000 of one product in PostgreSQL, 8 buys per buyer
// (1536 in all), sold through Submit and a batch handler. Exactly 1000 are
// sold, the stock never goes below zero (a CHECK refuses it on every
// write), and every buyer gets an answer, sold or sold out, although the
// product's partition moves between processes as they finish. It runs on
// one Redis node here, and on a Redis Cluster in TestCluster.
func TestSellAcrossProcesses(t *testing.T) { sellAcrossProcesses(t, oneNode) }

// sellAcrossProcesses runs the test above on the deployment setup makes.
func sellAcrossProcesses(t *testing.T, setup deployment) {
	const (
		processes, buyers, buys = 3, 64, 8
		stock                   = 1000
	)
	var db *sqlx.DB
	res := harness.Run(t, harness.Config{Processes: processes, Goroutines: buyers, Ops: buys},
		func() harness.Params {
			url := testserver.Postgres(t)
			db = testserver.Open(t, "pgx", url)
			workload.Products(t, db, stock, workload.Hot)
			_, err := db.Exec(`ALTER TABLE products ADD CHECK (stock >= 0);
				CREATE TABLE sales (id text PRIMARY KEY, sold boolean NOT NULL DEFAULT false)`)
			require.NoError(t, err)
			_, p := setup(t)
			p["postgres"] = url
			return p
		},
		func(t testing.TB, p harness.Params) harness.Op {
			client := workerRedis(t, p)
			db := testserver.Open(t, "pgx", p["postgres"])
			q := instance(t, client, p["prefix"], redisq.Config{BatchHandler: sellOnce(db)})
			return func(ctx context.Context, key string) error {
				answer, err := q.Submit(ctx, key, []byte(token.New()))
				switch {
				case err != nil:
					return err
				case string(answer) == "sold-out":
					return workload.ErrSoldOut
				case string(answer) != "sold":
					return fmt.Errorf("unexpected answer %q", answer)
				}
				return nil
			}
		})
	t.Logf("sold %d, sold out %d, errors %d %v, in %v", res.Successes, res.Conflicts, res.Errors, res.FirstErrors, res.Elapsed)
	require.Zero(t, res.Errors, "every buyer got an answer: %v", res.FirstErrors)
	require.Equal(t, stock, res.Successes)
	require.Equal(t, processes*buyers*buys-stock, res.Conflicts)
	require.Zero(t, workload.Stock(t, db, workload.Hot))
	var recorded, sold int
	require.NoError(t, db.QueryRow(`SELECT count(*), count(*) FILTER (WHERE sold) FROM sales`).Scan(&recorded, &sold))
	require.Equal(t, processes*buyers*buys, recorded, "one record per purchase")
	require.Equal(t, stock, sold)
}

// A redelivered purchase is answered as before and sells nothing again.
func TestSellOnceIdempotent(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	workload.Products(t, db, 2, workload.Hot)
	_, err := db.Exec(`CREATE TABLE sales (id text PRIMARY KEY, sold boolean NOT NULL DEFAULT false)`)
	require.NoError(t, err)
	sell := sellOnce(db)
	answers := func(ids ...string) []string {
		jobs := make([]queue.Job, len(ids))
		for i, id := range ids {
			jobs[i] = queue.Job{Key: workload.Hot, Payload: []byte(id)}
		}
		res, err := sell(t.Context(), jobs)
		require.NoError(t, err)
		out := make([]string, len(res))
		for i, r := range res {
			out[i] = string(r.Value)
		}
		return out
	}
	require.Equal(t, []string{"sold", "sold", "sold-out"}, answers("a", "b", "c"))
	require.Equal(t, []string{"sold", "sold-out", "sold-out", "sold"}, answers("b", "c", "d", "a"))
	require.Zero(t, workload.Stock(t, db, workload.Hot))
	var recorded int
	require.NoError(t, db.Get(&recorded, `SELECT count(*) FROM sales`))
	require.Equal(t, 4, recorded)
}
