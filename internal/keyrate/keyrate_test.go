package keyrate

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A key turns hot once its rate reaches Enter, stays hot while the rate is
// between the thresholds, and cools only once it falls to Leave: the gap
// between them is the hysteresis.
func TestHysteresis(t *testing.T) {
	t.Parallel()
	const window = 32
	tb := New(Config{Window: window, Enter: 0.2, Leave: 0.05, Keys: 16})
	require.False(t, tb.Hot("k"))

	// A lost race in ten is below Enter: it stays cold.
	for range 100 {
		tb.Record("k", 10, 1)
	}
	require.False(t, tb.Hot("k"))

	// Every other sample lost: it turns hot.
	var n int
	for n = 1; n <= 100 && !tb.Hot("k"); n++ {
		tb.Record("k", 2, 1)
	}
	require.True(t, tb.Hot("k"))
	require.Greater(t, n, 2, "a single call of lost races is not enough")

	// One conflict in ten is below Enter but above Leave: it stays hot.
	for i := range 200 {
		tb.Record("k", 1, b2i(i%10 == 0))
	}
	require.True(t, tb.Hot("k"))

	// No conflicts: it cools, after a while.
	for n = 0; n < 1000 && tb.Hot("k"); n++ {
		tb.Record("k", 1, 0)
	}
	require.False(t, tb.Hot("k"))
	require.Greater(t, n, window/2, "one quiet call is not a cool key")
}

// The table holds Keys slots whatever the keys; a key whose slot another
// took starts over, cold.
func TestBounded(t *testing.T) {
	t.Parallel()
	tb := New(Config{Window: 32, Enter: 0.2, Leave: 0.05, Keys: 5})
	require.Len(t, tb.slots, 8, "rounded up to a power of two")
	for i := range 10_000 {
		tb.Record(fmt.Sprint("k", i), 1, 1)
	}
	require.Len(t, tb.slots, 8)

	for range 100 {
		tb.Record("hot", 1, 1)
	}
	require.True(t, tb.Hot("hot"))
	// Find a key that shares hot's slot and let it take it.
	h := tb.hash("hot")
	other := ""
	for i := 0; other == ""; i++ {
		if k := fmt.Sprint("other", i); tb.hash(k)&tb.mask == h&tb.mask {
			other = k
		}
	}
	tb.Record(other, 1, 0)
	require.False(t, tb.Hot("hot"), "an evicted key starts over")
	require.False(t, tb.Hot(other))
}
