package inflight

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Wait returns once every goroutine ended, including one started while it
// waited, or when its ctx ends first, saying how many are still under way.
func TestWait(t *testing.T) {
	var g Group
	require.NoError(t, g.Wait(t.Context()), "nothing under way")

	release := make(chan struct{})
	g.Go(func() { <-release })
	short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err := g.Wait(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "1 still under way")

	waited := make(chan error, 1)
	go func() { waited <- g.Wait(t.Context()) }()
	second := make(chan struct{})
	g.Go(func() { <-second })
	close(release)
	select {
	case err := <-waited:
		t.Fatalf("Wait returned while a goroutine was under way: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(second)
	require.NoError(t, <-waited)
}
