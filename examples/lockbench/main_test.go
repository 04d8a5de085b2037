package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// A short run of every lock on every workload completes without errors.
func TestRun(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(t.Context(), &out, 100*time.Millisecond, []int{1, 8}))
	t.Log("\n" + out.String())
	for _, name := range []string{"raw-poll", "bsm/redislock", "redsync", "distlock", "distlock-ctxtimeout"} {
		require.Contains(t, out.String(), name)
	}
	require.NotContains(t, out.String(), "first error")
}

func TestParseWorkers(t *testing.T) {
	got, err := parseWorkers("1, 8,64")
	require.NoError(t, err)
	require.Equal(t, []int{1, 8, 64}, got)
	for _, bad := range []string{"", "0", "x", "8,-1"} {
		_, err := parseWorkers(bad)
		require.Error(t, err, bad)
	}
}
