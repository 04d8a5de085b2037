package distlock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A clean-up call keeps the caller's values (a tracing hook reads them) but
// neither its cancellation nor its deadline: it has its own.
func TestCleanupContextKeepsValuesNotCancellation(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithDeadline(context.WithValue(t.Context(), key{}, "trace-1"), time.Now().Add(-time.Second))
	cancel()
	ctx := cleanupContext(parent)
	require.NoError(t, ctx.Err())
	require.Nil(t, ctx.Done())
	require.Equal(t, "trace-1", ctx.Value(key{}))
	deadline, ok := ctx.Deadline()
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(releaseTimeout), deadline, time.Second)
}
