package idempotency_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/idempotency"
)

// reply is what the client got.
type reply struct {
	status   int
	body     string
	effect   string // the X-Effect header
	replayed bool
}

func send(t testing.TB, client *http.Client, url, principal, key, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Principal", principal)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, string(b), resp.Header.Get("X-Effect"), resp.Header.Get(idempotency.ReplayedHeader) == "true"}
}

// server serves a handler that writes one effect per run, in the store's
// transaction, behind the middleware on s; hold, when set, is waited for
// before the handler answers; fail500, while positive, makes that many
// runs answer 500 after their write.
func server(t *testing.T, e *env, s *idempotency.Store, hold <-chan struct{}, fail500 *atomic.Int32) string {
	t.Helper()
	mw, err := idempotency.Middleware(s, idempotency.HTTPConfig{
		Principal: func(r *http.Request) (string, error) {
			if p := r.Header.Get("X-Principal"); p != "" {
				return p, nil
			}
			return "", errors.New("who are you?")
		},
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /bots/{bot}/start", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		answer, err := e.writeEffect(r.Context(), r.PathValue("bot"), string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if hold != nil {
			<-hold
		}
		if fail500 != nil && fail500.Add(-1) >= 0 {
			http.Error(w, "engine room on fire", http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Effect", string(answer))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"started":%q}`, answer)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestMiddleware(t *testing.T) {
	e := newEnv(t, "pgx")
	s := e.store(t, idempotency.Config{})
	url := server(t, e, s, nil, nil)
	client := &http.Client{Timeout: 30 * time.Second}
	bot := func(name string) string { return url + "/bots/" + name + "/start" }

	t.Run("missing key", func(t *testing.T) {
		r := send(t, client, bot("b0"), "ann", "", "{}")
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Zero(t, e.effects(t, "b0"))
	})
	t.Run("no principal", func(t *testing.T) {
		r := send(t, client, bot("b0"), "", "k0", "{}")
		require.Equal(t, http.StatusUnauthorized, r.status)
	})
	t.Run("replay", func(t *testing.T) {
		first := send(t, client, bot("b1"), "ann", "k1", `{"size":1}`)
		require.Equal(t, http.StatusCreated, first.status)
		require.False(t, first.replayed)
		again := send(t, client, bot("b1"), "ann", "k1", `{"size":1}`)
		require.Equal(t, http.StatusCreated, again.status)
		require.True(t, again.replayed)
		require.Equal(t, first.body, again.body)
		require.Equal(t, first.effect, again.effect, "headers are replayed")
		require.Equal(t, 1, e.effects(t, "b1"))
	})
	t.Run("mismatch", func(t *testing.T) {
		require.Equal(t, http.StatusCreated, send(t, client, bot("b2"), "ann", "k2", `{"size":1}`).status)
		r := send(t, client, bot("b2"), "ann", "k2", `{"size":2}`)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, r.body)
		require.Equal(t, 1, e.effects(t, "b2"))
	})
	t.Run("principals", func(t *testing.T) {
		a := send(t, client, bot("b3"), "ann", "k3", `{}`)
		b := send(t, client, bot("b3"), "bob", "k3", `{}`)
		require.Equal(t, http.StatusCreated, a.status)
		require.Equal(t, http.StatusCreated, b.status)
		require.False(t, b.replayed, "another principal's key is another key")
		require.Equal(t, 2, e.effects(t, "b3"))
	})
	t.Run("concurrent", func(t *testing.T) {
		const n = 24
		replies := make([]reply, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { replies[i] = send(t, client, bot("b4"), "ann", "k4", `{"size":4}`) })
		}
		wg.Wait()
		replayed := 0
		for _, r := range replies {
			require.Equal(t, http.StatusCreated, r.status, r.body)
			require.Equal(t, replies[0].body, r.body)
			if r.replayed {
				replayed++
			}
		}
		require.Equal(t, n-1, replayed)
		require.Equal(t, 1, e.effects(t, "b4"))
	})
}

// A 500 is not an answer: nothing is recorded, the handler's write rolls
// back, and the retry runs the handler again.
func TestMiddlewareServerErrorIsNotRecorded(t *testing.T) {
	e := newEnv(t, "postgres")
	s := e.store(t, idempotency.Config{})
	var fail atomic.Int32
	fail.Store(1)
	url := server(t, e, s, nil, &fail) + "/bots/b5/start"
	client := &http.Client{Timeout: 30 * time.Second}
	r := send(t, client, url, "ann", "k5", `{}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Contains(t, r.body, "engine room on fire")
	require.Zero(t, e.effects(t, "b5"))
	r = send(t, client, url, "ann", "k5", `{}`)
	require.Equal(t, http.StatusCreated, r.status)
	require.False(t, r.replayed)
	require.Equal(t, 1, e.effects(t, "b5"))
}

// Under NoWait a request whose key is in flight gets 409 at once.
func TestMiddlewareNoWaitInFlight(t *testing.T) {
	e := newEnv(t, "pgx-native")
	hold := make(chan struct{})
	url := server(t, e, e.store(t, idempotency.Config{NoWait: true}), hold, nil) + "/bots/b6/start"
	client := &http.Client{Timeout: 30 * time.Second}
	first := make(chan reply, 1)
	go func() { first <- send(t, client, url, "ann", "k6", `{}`) }()
	require.Eventually(t, func() bool { return e.inFlight(t) }, 10*time.Second, 10*time.Millisecond)
	r := send(t, client, url, "ann", "k6", `{}`)
	require.Equal(t, http.StatusConflict, r.status, r.body)
	close(hold)
	require.Equal(t, http.StatusCreated, (<-first).status)
	require.Equal(t, 1, e.effects(t, "b6"))
}

// inFlight reports whether a transaction holds an uncommitted record.
func (e *env) inFlight(t testing.TB) bool {
	var n int
	require.NoError(t, e.own.Get(&n, `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE c.relname = 'idem' AND c.relnamespace = current_schema()::regnamespace AND l.mode = 'RowExclusiveLock'`))
	return n > 0
}
