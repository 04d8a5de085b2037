package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const input = `goos: linux
BenchmarkObtainRelease/raw/hotkey/workers=8-2        8049   200 ns/op   2.0 max/min   1000 p99-ns
BenchmarkObtainRelease/distlock/hotkey/workers=8-2   7880   100 ns/op   1.0 max/min    250 p99-ns
BenchmarkObtainRelease/raw/hotkey/workers=8-2        8049   400 ns/op   4.0 max/min   3000 p99-ns
BenchmarkObtainRelease/distlock/hotkey/workers=8-2   7880   100 ns/op   1.0 max/min    500 p99-ns
BenchmarkOther/lonely/hotkey/workers=8-2             7880   100 ns/op   1.0 max/min    500 p99-ns
PASS
`

func TestPairsTimeAndMetricsWithRaw(t *testing.T) {
	samples, order, err := read(strings.NewReader(input))
	require.NoError(t, err)
	require.Equal(t, []float64{1000, 3000}, samples["BenchmarkObtainRelease/raw/hotkey/workers=8"]["p99-ns"])
	var out strings.Builder
	require.Equal(t, 1, write(&out, samples, order), "one pair: the benchmark without a raw sibling is left out")
	got := out.String()
	t.Log("\n" + got)
	// ns/op: medians 300 and 100; paired: median of 0.5 and 0.25.
	require.Regexp(t, `distlock/hotkey/workers=8\s+300\s+100\s+0\.333\s+0\.375\s+3\.00\s+2`, got)
	require.Regexp(t, `distlock/hotkey/workers=8\s+p99-ns\s+2000\s+375\s+0\.188\s+0\.208\s+2`, got)
	require.Regexp(t, `distlock/hotkey/workers=8\s+max/min\s+3\s+1\s+0\.333\s+0\.375\s+2`, got)
	require.NotContains(t, got, "lonely")
}

func TestAllocationsBesideTime(t *testing.T) {
	const in = `BenchmarkUpdate/raw/hot-2      10  100 ns/op  64 B/op  4 allocs/op
BenchmarkUpdate/contend/hot-2  10  110 ns/op  96 B/op  6 allocs/op
BenchmarkUpdate/raw/hot-2      10  100 ns/op  64 B/op  4 allocs/op
BenchmarkUpdate/contend/hot-2  10  110 ns/op  96 B/op  7 allocs/op
BenchmarkUpdate/raw/hot-2      10  100 ns/op  64 B/op  4 allocs/op
BenchmarkUpdate/contend/hot-2  10  110 ns/op  96 B/op  7 allocs/op
`
	samples, order, err := read(strings.NewReader(in))
	require.NoError(t, err)
	var out strings.Builder
	require.Equal(t, 1, write(&out, samples, order))
	got := out.String()
	t.Log("\n" + got)
	require.Regexp(t, `contend/hot\s+100\s+110\s+1\.100\s+1\.100\s+0\.91\s+3\s+4\s+7\s+\+3`, got)
	require.NotContains(t, got, "metric", "allocations are in the time table, not in the table of other metrics")
}

func TestRefusesUnpairedValues(t *testing.T) {
	_, _, err := read(strings.NewReader("BenchmarkX/raw-2  10  100 ns/op 7\n"))
	require.ErrorContains(t, err, "do not pair up")
}

func TestTellsPackagesApart(t *testing.T) {
	const in = `pkg: github.com/contend/contend/atomic
BenchmarkOnMariaDB/raw/hot-2      10  100 ns/op
BenchmarkOnMariaDB/contend/hot-2  10  110 ns/op
pkg: github.com/contend/contend/optimistic
BenchmarkOnMariaDB/raw/hot-2      10  200 ns/op
BenchmarkOnMariaDB/optimistic/hot-2  10  300 ns/op
`
	samples, order, err := read(strings.NewReader(in))
	require.NoError(t, err)
	var out strings.Builder
	require.Equal(t, 2, write(&out, samples, order))
	got := out.String()
	t.Log("\n" + got)
	require.Regexp(t, `atomic\.BenchmarkOnMariaDB/contend/hot\s+100\s+110\s`, got)
	require.Regexp(t, `optimistic\.BenchmarkOnMariaDB/optimistic/hot\s+200\s+300\s`, got)
}
