package adaptive

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func testTable(t *testing.T, keys int) *table {
	t.Helper()
	c, err := Config{Table: "t", Keys: keys}.withDefaults()
	require.NoError(t, err)
	return newTable(c)
}

// A key goes locked once its rate reaches enter, stays there while the rate is
// between the thresholds, and goes back only once it falls to leave: the gap
// between them is the hysteresis.
func TestTableHysteresis(t *testing.T) {
	t.Parallel()
	tb := testTable(t, 16)
	require.Equal(t, Optimistic, tb.mode("k"))

	// A lost race in ten is below enter: it stays optimistic.
	for range 100 {
		tb.record("k", 10, 1)
	}
	require.Equal(t, Optimistic, tb.mode("k"))

	// Every other attempt lost: it goes locked.
	var n int
	for n = 1; n <= 100 && tb.mode("k") == Optimistic; n++ {
		tb.record("k", 2, 1)
	}
	require.Equal(t, Pessimistic, tb.mode("k"))
	require.Greater(t, n, 2, "a single call of lost races is not enough")

	// One wait in ten is below enter but above leave: it stays locked.
	for i := range 200 {
		tb.record("k", 1, b2i(i%10 == 0))
	}
	require.Equal(t, Pessimistic, tb.mode("k"))

	// No waits: back to optimistic, after a while.
	for n = 0; n < 1000 && tb.mode("k") == Pessimistic; n++ {
		tb.record("k", 1, 0)
	}
	require.Equal(t, Optimistic, tb.mode("k"))
	require.Greater(t, n, window/2, "one quiet call is not a cool key")
}

func TestModeString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "optimistic", Optimistic.String())
	require.Equal(t, "pessimistic", Pessimistic.String())
	require.Equal(t, "Mode(7)", Mode(7).String())
}
