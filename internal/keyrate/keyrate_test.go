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

// A key new to the table turns hot as soon as its rate reaches Enter, its
// rate being the mean of the samples it has: the stay is for a key that
// moved, which must not move back on the samples that moved it. Once
// moved, the key stays half a window, whatever its samples.
func TestNewcomerMovesAtOnce(t *testing.T) {
	t.Parallel()
	const window = 32
	tb := New(Config{Window: window, Enter: 0.2, Leave: 0.05, Keys: 16})
	n := 0
	for ; n < window && !tb.Hot("k"); n++ {
		tb.Record("k", 1, 1)
	}
	require.True(t, tb.Hot("k"))
	// A running average from zero, 1 − (31/32)^n ≥ 0.2, would take 8;
	// half a window (16) would be the stay's.
	require.Equal(t, 1, n, "conflicts before a new key turned hot")

	// A new key's lost race among more wins than 1/Enter is below Enter.
	tb.Record("calm", 9, 1)
	require.False(t, tb.Hot("calm"))
	tb.Record("calm", 1, 1)
	require.True(t, tb.Hot("calm"), "two conflicts in ten samples reach 0.2")

	// Cooled, it has moved: its rate reaches Enter again within six
	// conflicts, but it stays cold for half a window.
	for tb.Hot("k") {
		tb.Record("k", 1, 0)
	}
	for n = 0; n < window && !tb.Hot("k"); n++ {
		tb.Record("k", 1, 1)
	}
	require.Equal(t, window/2, n, "conflicts before a key that cooled turned hot again")
}

// The table holds Keys slots whatever the keys.
func TestBounded(t *testing.T) {
	t.Parallel()
	tb := New(Config{Window: 32, Enter: 0.2, Leave: 0.05, Keys: 5})
	require.Len(t, tb.pairs, 4, "rounded up to a power of two, in pairs")
	for i := range 10_000 {
		tb.Record(fmt.Sprint("k", i), 1, 1)
	}
	require.Len(t, tb.pairs, 4)
}

// sharing returns n keys other than key whose slots are key's pair.
func sharing(tb *Table, key string, n int) []string {
	var keys []string
	h := tb.hash(key)
	for i := 0; len(keys) < n; i++ {
		if k := fmt.Sprint("other", i); tb.hash(k)&tb.mask == h&tb.mask {
			keys = append(keys, k)
		}
	}
	return keys
}

func heat(tb *Table, key string) {
	for range 100 {
		tb.Record(key, 1, 1)
	}
}

// A hot key keeps its state against the cold keys that share its slots: a
// newcomer takes a cold key's slot. With one slot per key, each of them
// would send the hot key back to cold.
func TestHotKeyKeepsItsSlot(t *testing.T) {
	t.Parallel()
	tb := New(Config{Window: 32, Enter: 0.2, Leave: 0.05, Keys: 64})
	heat(tb, "hot")
	require.True(t, tb.Hot("hot"))
	others := sharing(tb, "hot", 20)
	for range 5 {
		for _, k := range others {
			tb.Record(k, 1, 0)
			require.True(t, tb.Hot("hot"), "a cold key displaced the hot one")
		}
	}
}

// A key whose slot another took starts over, cold: with both slots hot,
// the newcomer takes the one recorded less recently.
func TestEvictedKeyStartsOver(t *testing.T) {
	t.Parallel()
	tb := New(Config{Window: 32, Enter: 0.2, Leave: 0.05, Keys: 64})
	ks := sharing(tb, "a", 2)
	b, newcomer := ks[0], ks[1]
	heat(tb, "a")
	heat(tb, b)
	tb.Record("a", 1, 1) // b is now the one recorded less recently
	require.True(t, tb.Hot("a"))
	require.True(t, tb.Hot(b))

	tb.Record(newcomer, 1, 0)
	require.True(t, tb.Hot("a"), "the key recorded more recently stays")
	require.False(t, tb.Hot(b), "an evicted key starts over")
	require.False(t, tb.Hot(newcomer), "a newcomer starts cold")
	tb.Record(b, 1, 0)
	require.False(t, tb.Hot(b), "a key that comes back starts over")
}
