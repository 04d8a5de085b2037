package contend_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
)

// The promises of this module's guards, as their Promises methods give them
// with default configuration; the packages' own tests check that each guard
// reports these and that its behaviour keeps them.
var (
	claimer    = contend.Promises{Exclusive: true, AtMostOnce: true, AcrossProcesses: true}
	rowLock    = contend.Promises{Exclusive: true, Waits: true, AcrossProcesses: true, InTransaction: true}
	optimistic = contend.Promises{Waits: true, AcrossProcesses: true, InTransaction: true}
	lease      = contend.Promises{Exclusive: true, AtMostOnce: true, Waits: true, AcrossProcesses: true}
	inMemory   = contend.Promises{Exclusive: true, AtMostOnce: true, Waits: true}
)

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		old, new contend.Promises
		lost     []string
	}{
		{"same guard", lease, lease, nil},
		{"fail fast to waiting", claimer, lease, nil},
		{"waiting to fail fast", lease, claimer, nil},
		{"lease to optimistic", lease, optimistic, []string{"not exclusive", "more than once"}},
		{"lease to row lock", lease, rowLock, []string{"more than once"}},
		{"row lock to lease", rowLock, lease, []string{"commit or roll back"}},
		{"row lock to optimistic", rowLock, optimistic, []string{"not exclusive"}},
		{"optimistic to row lock", optimistic, rowLock, nil},
		{"lease to in-memory queue", lease, inMemory, []string{"one process"}},
		{"in-memory queue to lease", inMemory, lease, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.new.Check(tc.old)
			if tc.lost == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, s := range tc.lost {
				require.Contains(t, err.Error(), s)
			}
		})
	}
}

// A call site can check, once at start-up, that the guard it was given
// keeps what its fn relies on: here, that fn's external call is not made
// twice.
func ExamplePromises_Check() {
	var g contend.Guard = optimisticGuard{} // say, configured elsewhere
	needs := contend.Promises{AtMostOnce: true}
	if p, ok := g.(contend.Promiser); ok {
		fmt.Println(p.Promises().Check(needs))
	}
	// Output:
	// contend: the replacement breaks promises: fn may run more than once per Do: its effects outside the guard's transaction must be idempotent
}

type optimisticGuard struct{ contend.Guard }

func (optimisticGuard) Promises() contend.Promises { return optimistic }
