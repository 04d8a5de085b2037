package contend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
)

func TestEventKindNames(t *testing.T) {
	t.Parallel()
	names := map[contend.EventKind]string{
		contend.EventObtained:     "obtained",
		contend.EventConflict:     "conflict",
		contend.EventRetry:        "retry",
		contend.EventGaveUp:       "gave-up",
		contend.EventReleased:     "released",
		contend.EventLost:         "lost",
		contend.EventFailed:       "failed",
		contend.EventDeadLettered: "dead-lettered",
		contend.EventExpired:      "expired",
		0:                         "EventKind(0)",
		200:                       "EventKind(200)",
	}
	for k, want := range names {
		require.Equal(t, want, k.String())
	}
}

func TestObserverFuncGetsContextAndEvent(t *testing.T) {
	t.Parallel()
	type ctxKey struct{}
	ctx := context.WithValue(t.Context(), ctxKey{}, "request-1")
	var got contend.Event
	var o contend.Observer = contend.ObserverFunc(func(ctx context.Context, e contend.Event) {
		require.Equal(t, "request-1", ctx.Value(ctxKey{}))
		got = e
	})
	e := contend.Event{Kind: contend.EventObtained, Strategy: "distlock", Key: "k", Wait: time.Millisecond, Attempts: 2, Fence: 7}
	o.Observe(ctx, e)
	require.Equal(t, e, got)
}

// logged runs events through a SlogObserver at level into a JSON handler
// that lets everything from handlerLevel through, and returns the records.
func logged(t *testing.T, level, handlerLevel slog.Level, events ...contend.Event) []map[string]any {
	t.Helper()
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: handlerLevel}))
	o := contend.SlogObserver(logger, level)
	for _, e := range events {
		o.Observe(t.Context(), e)
	}
	var records []map[string]any
	for line := range strings.Lines(buf.String()) {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		delete(r, "time")
		records = append(records, r)
	}
	return records
}

func TestSlogObserverWritesTheSetFields(t *testing.T) {
	t.Parallel()
	lost := fmt.Errorf("distlock: refresh %q: %w", "k", contend.ErrLockLost)
	records := logged(t, slog.LevelDebug, slog.LevelDebug,
		contend.Event{Kind: contend.EventObtained, Strategy: "distlock", Key: "k", Wait: 3 * time.Millisecond, Attempts: 1, Fence: 42},
		contend.Event{Kind: contend.EventLost, Strategy: "distlock", Key: "k", Hold: time.Second, Fence: 42, Err: lost},
	)
	require.Equal(t, []map[string]any{{
		"level": "DEBUG", "msg": "contend: obtained", "strategy": "distlock", "key": "k",
		"wait": float64(3 * time.Millisecond), "attempts": float64(1), "fence": float64(42),
	}, {
		"level": "WARN", "msg": "contend: lost", "strategy": "distlock", "key": "k",
		"hold": float64(time.Second), "fence": float64(42), "err": lost.Error(),
	}}, records)
}

// Routine events stay at the level asked for; trouble is raised to Warn, so
// that a logger at Info drops the first and keeps the second.
func TestSlogObserverRaisesTroubleToWarn(t *testing.T) {
	t.Parallel()
	records := logged(t, slog.LevelDebug, slog.LevelInfo,
		contend.Event{Kind: contend.EventReleased, Strategy: "queue", Key: "a"},
		contend.Event{Kind: contend.EventDeadLettered, Strategy: "queue", Key: "b", Attempts: 3, Err: contend.ErrConflict},
		contend.Event{Kind: contend.EventFailed, Strategy: "distlock", Key: "c", Err: contend.ErrConflict},
	)
	require.Len(t, records, 2)
	require.Equal(t, "contend: dead-lettered", records[0]["msg"])
	require.Equal(t, "WARN", records[0]["level"])
	require.Equal(t, "contend: failed", records[1]["msg"])

	records = logged(t, slog.LevelError, slog.LevelDebug, contend.Event{Kind: contend.EventLost, Key: "k"})
	require.Equal(t, "ERROR", records[0]["level"], "a level above Warn is kept")
}
