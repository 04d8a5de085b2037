package queue_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/queue"
)

// A payload that does not decode is the handler's error, dead-lettered like
// any other, and a good job after it still runs.
func TestTypedBadPayload(t *testing.T) {
	t.Parallel()
	var calc queue.Typed[int, int]
	q := start(t, queue.Config{Partitions: 2, Retry: fast, Handler: calc.Handler(func(_ context.Context, _ string, n int) (int, error) {
		return n * 2, nil
	})})
	_, err := q.Submit(t.Context(), "k", []byte("not json"))
	require.ErrorIs(t, err, queue.ErrDeadLettered)
	var syntax *json.SyntaxError
	require.ErrorAs(t, err, &syntax, "the codec's error stays reachable")

	got, err := calc.Submit(t.Context(), q, "k", 21)
	require.NoError(t, err)
	require.Equal(t, 42, got)
	require.NoError(t, calc.Enqueue(t.Context(), q, "k", 1))
}
