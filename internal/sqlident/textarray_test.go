package sqlident_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/sqlident"
	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// Whatever the values hold, the server reads the literal back as exactly
// those values, in order, under every driver: nothing in a value can end an
// element or the array early, or turn into a NULL.
func TestTextArrayRoundTrips(t *testing.T) {
	values := []string{"plain", "", `"`, `\`, `\"`, `a,b`, `{x}`, "NULL", "null", " spaced ",
		"'; DROP TABLE x; --", "naïve", "tab\there", "new\nline"}
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			q := testserver.Querier(t.Context(), testserver.Handle(t, driver, testserver.Postgres(t)))
			rows, err := q.Query(t.Context(), `SELECT v, v IS NULL FROM unnest($1::text[]) WITH ORDINALITY AS a(v, i) ORDER BY i`,
				sqlident.TextArray(values))
			require.NoError(t, err)
			var got []string
			for rows.Next() {
				var v string
				var isNull bool
				require.NoError(t, rows.Scan(&v, &isNull))
				require.False(t, isNull)
				got = append(got, v)
			}
			require.NoError(t, rows.Close())
			require.Equal(t, values, got)
		})
	}
}
