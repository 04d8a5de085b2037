// Package ctxerr says why a context ended, in one error.
package ctxerr

import (
	"context"
	"errors"
	"fmt"
)

// Of returns ctx's error, with its cause when that says more, or nil when
// ctx has not ended: errors.Is matches both the error
// ([context.Canceled] or [context.DeadlineExceeded]) and the cause.
func Of(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", err, cause)
	} else if cause != nil {
		return cause
	}
	return err
}
