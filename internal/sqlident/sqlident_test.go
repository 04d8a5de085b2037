package sqlident

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
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
