package waitfor_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/waitfor"
)

func TestCallReturnsTheCallsError(t *testing.T) {
	sentinel := errors.New("done")
	err := waitfor.Call(t, time.Second, "never", func(ctx context.Context) error {
		_, ok := ctx.Deadline()
		require.True(t, ok, "the call's ctx carries the bound")
		return sentinel
	})
	require.ErrorIs(t, err, sentinel)
}

// A call that ignores its ctx fails the test once the bound and the grace
// have passed, with the promise named: run in a child process, which must
// fail.
func TestCallThatNeverReturnsFailsNamed(t *testing.T) {
	if os.Getenv("WAITFOR_CHILD") == "1" {
		never := make(chan struct{})
		_ = waitfor.Call(t, 10*time.Millisecond, "the promise under test", func(context.Context) error { <-never; return nil })
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCallThatNeverReturnsFailsNamed$", "-test.count=1")
	cmd.Env = append(os.Environ(), "WAITFOR_CHILD=1")
	began := time.Now()
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the stuck call passed:\n%s", out)
	require.Contains(t, string(out), "the promise under test (nothing within 5.01s)")
	require.Less(t, time.Since(began), 30*time.Second)
}
