package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// The story runs as described: each period settled once, the stalled
// holder's late write refused.
func TestSettlement(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(t.Context(), &out, 3, 200*time.Millisecond))
	t.Log("\n" + out.String())
	require.NotContains(t, out.String(), "FAILED")
	require.Contains(t, out.String(), "ok the database refused the stalled holder's late write")
	require.Contains(t, out.String(), "ok the ledger shows each of the 4 periods settled exactly once")
}

func TestRefusesBadFlags(t *testing.T) {
	require.Error(t, run(t.Context(), &strings.Builder{}, 0, time.Second))
	require.Error(t, run(t.Context(), &strings.Builder{}, 1, time.Millisecond))
}
