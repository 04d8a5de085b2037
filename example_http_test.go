package contend_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/contendtest"
)

// status maps what a guard's Do returned to an HTTP status. The order
// matters: a wait that ctx's end cut short matches both ctx's error and
// ErrConflict, and it is a timeout (try again), not a lost race (already
// done); a missing row is not a lost race either. ctx's end is read from
// ctx itself, not from err: when a lease is lost, fn's own ctx is cancelled
// and an fn that returns its ctx's error makes err match
// [context.Canceled] while the request is still alive.
func status(ctx context.Context, err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case ctx.Err() != nil:
		return http.StatusServiceUnavailable
	case errors.Is(err, contend.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, contend.ErrNotFound):
		return http.StatusNotFound
	default:
		return http.StatusInternalServerError
	}
}

// startHandler starts the bot named in the path under g: one instance of
// the service starts it, the others answer 409.
func startHandler(g contend.Guard) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Wait for a busy key at most 200ms: a request's ctx ends the wait.
		ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
		defer cancel()
		bot := r.PathValue("bot")
		err := g.Do(ctx, bot, func(ctx context.Context) error {
			return ctx.Err() // start the engine here, heeding ctx
		})
		code := status(ctx, err)
		if code == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, http.StatusText(code), code)
	})
}

// An HTTP handler answering each outcome of a guard with its status. Any
// guard fits; here a scripted one plays each outcome in turn (package
// contendtest).
func Example_httpHandler() {
	g := contendtest.NewGuard(
		contendtest.Run(),
		contendtest.Conflict(),
		contendtest.NotFound(),
		contendtest.WaitForCtx(), // the wait outlasts the handler's 200ms
		contendtest.LoseLock(0),  // matches context.Canceled, but the request is alive
		contendtest.Fail(errors.New("connection reset")),
	)
	mux := http.NewServeMux()
	mux.Handle("POST /bots/{bot}/start", startHandler(g))
	for range 6 {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("POST", "/bots/bot-1/start", nil))
		fmt.Println(rec.Code, http.StatusText(rec.Code))
	}
	// Output:
	// 200 OK
	// 409 Conflict
	// 404 Not Found
	// 503 Service Unavailable
	// 500 Internal Server Error
	// 500 Internal Server Error
}
