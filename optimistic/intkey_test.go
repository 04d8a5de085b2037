package optimistic_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/optimistic"
)

// intRow is a row of a table keyed by an integer.
type intRow struct {
	ID      int64 `db:"id"`
	N       int64 `db:"n"`
	Version int64 `db:"version"`
}

// Keys are strings, also for a bigint key column: every driver sends "42"
// as text, which the server converts to the column's type, so a Store and
// a Guard find, write and version-check the row of id 42. T's key field is
// the column's own type, and Save, Touch and Delete send its value.
func TestStringKeysOnAnIntegerKeyColumn(t *testing.T) {
	t.Parallel()
	for _, driver := range append(testserver.AllDrivers, testserver.MariaDBDriver) {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.URL(t, driver)
			db := testserver.Open(t, driver, url)
			_, err := db.Exec(`CREATE TABLE counters (id bigint PRIMARY KEY, n bigint NOT NULL, version bigint NOT NULL)`)
			require.NoError(t, err)
			_, err = db.Exec(`INSERT INTO counters (id, n, version) VALUES (42, 0, 0), (7, 0, 0)`)
			require.NoError(t, err)
			h := testserver.Handle(t, driver, url)
			ctx := t.Context()
			cfg := optimistic.Config{Table: "counters"}
			count := func(id int64) (n, version int64) {
				t.Helper()
				require.NoError(t, db.QueryRowx(db.Rebind(`SELECT n, version FROM counters WHERE id = ?`), id).Scan(&n, &version))
				return n, version
			}

			s, err := optimistic.NewStore[intRow](h, cfg)
			require.NoError(t, err)
			got, err := s.Get(ctx, "42")
			require.NoError(t, err)
			require.Equal(t, intRow{ID: 42}, got)
			_, err = s.Get(ctx, "43")
			require.ErrorIs(t, err, contend.ErrNotFound)

			got, err = s.Update(ctx, "42", func(c *intRow) error { c.N++; return nil })
			require.NoError(t, err)
			require.Equal(t, intRow{ID: 42, N: 1, Version: 1}, got)
			got.N = 10
			require.NoError(t, s.Save(ctx, &got))
			require.NoError(t, s.Touch(ctx, &got))
			stale := got
			stale.Version--
			require.ErrorIs(t, s.Save(ctx, &stale), contend.ErrConflict, "the version check holds")
			n, version := count(42)
			require.Equal(t, []int64{10, 3}, []int64{n, version})

			g, err := optimistic.NewGuard(h, cfg)
			require.NoError(t, err)
			require.NoError(t, g.Do(ctx, "42", func(ctx context.Context) error {
				_, err := testserver.Querier(ctx, h).Exec(ctx, `UPDATE counters SET n = n + 1 WHERE id = 42`)
				return err
			}))
			n, version = count(42)
			require.Equal(t, []int64{11, 4}, []int64{n, version}, "fn's write and the guard's bump committed")
			require.ErrorIs(t, g.Do(ctx, "43", func(context.Context) error {
				t.Error("fn ran for a key without a row")
				return nil
			}), contend.ErrNotFound)
			n, version = count(7)
			require.Equal(t, []int64{0, 0}, []int64{n, version}, "other rows untouched")

			require.NoError(t, s.Delete(ctx, &intRow{ID: 42, Version: 4}))
			_, err = s.Get(ctx, "42")
			require.ErrorIs(t, err, contend.ErrNotFound)
		})
	}
}
