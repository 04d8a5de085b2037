package guardtest

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// mutexGuard is the naive guard: a process-local mutex per key. It keeps the
// goroutines of one process apart and nothing else.
type mutexGuard struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (g *mutexGuard) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	g.mu.Lock()
	l, ok := g.locks[key]
	if !ok {
		l = &sync.Mutex{}
		g.locks[key] = l
	}
	g.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	return fn(ctx)
}

var naive = Suite{
	Driver:    "pgx",
	New:       func(testing.TB, Env) contend.Guard { return &mutexGuard{locks: map[string]*sync.Mutex{}} },
	Exclusive: true,
}

// Within one process the mutex is a correct guard: the suite must not accuse it.
func TestNaiveMutexHoldsInOneProcess(t *testing.T) {
	rep := Contend(t, naive, harness.Config{Goroutines: 16, Ops: 10, Keys: keys(2)})
	rep.RequireHeld(t, naive)
}

// Across processes it is not, and the suite must see it: the negative control
// that shows the checks can fail.
func TestNaiveMutexLosesUpdatesAcrossProcesses(t *testing.T) {
	rep := Contend(t, naive, harness.Config{Processes: 3, Goroutines: 16, Ops: 10, Keys: keys(2)})
	t.Logf("successes %d, counted %d, overlaps %d", rep.Successes, rep.Counted, rep.Overlaps)
	require.Zero(t, rep.Errors, "%v", rep.FirstErrors)
	require.Less(t, rep.Counted, int64(rep.Successes), "a process-local mutex must lose updates across processes")
	require.Positive(t, rep.Overlaps, "the overlap detector must see two processes inside at once")
	requireRejected(t, rep)
}

// The same guard under the faults of the linearizability run: the history
// checker, not only the counter, must reject it.
func TestNaiveMutexIsNotLinearizableUnderFaults(t *testing.T) {
	rep := ContendUnderFaults(t, naive, faultConfig(3))
	t.Logf("successes %d, errors %d, counted %d; faults %+v", rep.Successes, rep.Errors, rep.Counted, rep.Faults)
	requireRejected(t, rep)
	require.Positive(t, rep.Faults.Reset, "the faults cut no connection")
}

// requireRejected checks that the checker found, and decided, a key whose
// history no order explains.
func requireRejected(t *testing.T, rep Report) {
	t.Helper()
	t.Logf("history: %v", rep.History)
	require.NotEmpty(t, rep.History.Illegal, "the checker must reject a guard that loses updates")
	require.Empty(t, rep.History.Unknown, "the checker must decide every key in time")
	require.False(t, rep.History.Linearizable())
}
