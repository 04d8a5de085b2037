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
// done); a missing row is not a lost race either.
func status(err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
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
			return nil // start the engine here
		})
		code := status(err)
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
		contendtest.Fail(errors.New("connection reset")),
	)
	mux := http.NewServeMux()
	mux.Handle("POST /bots/{bot}/start", startHandler(g))
	for range 5 {
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
}
