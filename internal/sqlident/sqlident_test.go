package sqlident

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
)

func TestQuote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"bots", `"bots"`},
		{"Bots_2", `"Bots_2"`},
		{"_x", `"_x"`},
		{"public.bots", `"public"."bots"`},
		{"user", `"user"`}, // reserved words are fine once quoted
	} {
		got, err := Quote("table", tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got)
	}
}

func TestQuoteRefuses(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"", "bots; DROP TABLE x", `bo"ts`, "2bots", "a.b.c", ".bots", "bots.",
		"bö", "a b", "bots--", strings.Repeat("a", 64),
	} {
		_, err := Quote("table", in)
		require.ErrorIs(t, err, contend.ErrInvalid, "%q", in)
		require.ErrorContains(t, err, "table")
	}
}

func TestQuoteInMySQL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"bots", "`bots`"},
		{"test.bots", "`test`.`bots`"},
		{"key", "`key`"}, // reserved in MySQL, fine once quoted
	} {
		got, err := QuoteIn(sqldb.MySQL, "table", tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got)
	}
	for _, in := range []string{"bo`ts", "bots`; DROP TABLE x; --", `bo"ts`, "a.b.c", strings.Repeat("a", 64)} {
		_, err := QuoteIn(sqldb.MySQL, "table", in)
		require.ErrorIs(t, err, contend.ErrInvalid, "%q", in)
	}
}
