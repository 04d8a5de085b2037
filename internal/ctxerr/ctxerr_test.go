package ctxerr_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/ctxerr"
)

func TestOf(t *testing.T) {
	t.Parallel()
	require.NoError(t, ctxerr.Of(t.Context()))

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, ctxerr.Of(ctx), context.Canceled)

	why := errors.New("lease lost")
	ctx, cancelCause := context.WithCancelCause(t.Context())
	cancelCause(why)
	err := ctxerr.Of(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, why)
}
