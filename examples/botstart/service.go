package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/idempotency"
)

// schema is the tables the service works on: bots, one row per bot,
// engine_id NULL while the bot is stopped, and otherwise the id of its
// engine, running or still being spawned; and idempotency_keys, the answers
// of the starts sent with an Idempotency-Key header (package idempotency).
const schema = `CREATE TABLE IF NOT EXISTS bots (id text PRIMARY KEY, engine_id text);
	CREATE TABLE IF NOT EXISTS idempotency_keys (id text PRIMARY KEY, fingerprint text NOT NULL,
		state smallint NOT NULL, answer bytea, fence bigint NOT NULL, expires_at timestamptz NOT NULL);
	CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at)`

// releaseTimeout bounds the release of a claim, which runs even after the
// request that made the claim is gone.
const releaseTimeout = 5 * time.Second

// Service is one instance of the bot API. Any number of instances, in any
// number of processes, share the bots table and the engine platform. The claim
// on a bot's row is all that keeps two of them from starting the same bot; no
// lock is held anywhere while an engine spawns.
//
// A claim lasts until the bot is stopped or its spawn fails. A claim whose
// release is lost (the process died mid-spawn) stays until cleared by hand.
type Service struct {
	db      *sqlx.DB
	claims  *atomic.Claimer
	keyed   func(http.Handler) http.Handler // a start sent with an Idempotency-Key
	engines Spawner
	log     *log.Logger // errors answered with 500, whose details the client does not see
}

// NewService returns a service on db, whose bots table must exist. It does
// no I/O (the claimer prepares its statements at its first claim) and never
// closes db.
func NewService(db *sqlx.DB, engines Spawner, logger *log.Logger) (*Service, error) {
	claims, err := atomic.NewClaimer(db, atomic.ClaimerConfig{Table: "bots", OwnerColumn: "engine_id"})
	if err != nil {
		return nil, fmt.Errorf("botstart: %w", err)
	}
	// A start sent with an Idempotency-Key runs once per key: the claim
	// (which joins the store's transaction) and the recorded answer commit
	// together, and a second click with the key gets the first one's 200.
	keys, err := idempotency.New(db, idempotency.Config{Table: "idempotency_keys"})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("botstart: %w", err), claims.Close(context.Background()))
	}
	keyed, err := idempotency.Middleware(keys, idempotency.HTTPConfig{
		// The story has no accounts: a real service scopes keys by the
		// authenticated user.
		Principal: func(r *http.Request) (string, error) { return "anyone", nil },
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("botstart: %w", err), claims.Close(context.Background()))
	}
	return &Service{db: db, claims: claims, keyed: keyed, engines: engines, log: logger}, nil
}

// Close waits, as long as ctx lets it, for the releases of claims whose
// outcome was unknown, and releases the service's prepared statements.
func (s *Service) Close(ctx context.Context) error { return s.claims.Close(ctx) }

// Handler returns the service's routes.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	start := s.handle(s.start)
	keyed := s.keyed(start)
	mux.Handle("POST /bots/{id}/start", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") != "" {
			keyed.ServeHTTP(w, r)
			return
		}
		start.ServeHTTP(w, r)
	}))
	mux.Handle("POST /bots/{id}/stop", s.handle(s.stop))
	mux.Handle("GET /bots/{id}", s.handle(s.get))
	return mux
}

// botStatus is a bot's row as the API shows it.
type botStatus struct {
	ID       string  `json:"id"`
	EngineID *string `json:"engine_id"` // nil while stopped
}

// start claims the bot and spawns its engine. The claim's token is the new
// engine's id: it exists before the engine does, so the row names the engine
// before it is spawned, and of any number of concurrent starts only the one
// whose claim wrote the row goes on to spawn. The others get 409 at once.
func (s *Service) start(w http.ResponseWriter, r *http.Request) error {
	bot := r.PathValue("id")
	engineID, err := s.claims.Claim(r.Context(), bot)
	switch {
	case errors.Is(err, contend.ErrConflict): // running, or starting
		return refuse(http.StatusConflict, err, "bot %s is already running", bot)
	case errors.Is(err, contend.ErrNotFound):
		return refuse(http.StatusNotFound, err, "there is no bot %s", bot)
	case err != nil:
		return fmt.Errorf("start %s: %w", bot, err)
	}
	if err := s.engines.Spawn(r.Context(), engineID, bot); err != nil {
		// Unreleased, the bot would stay claimed by an engine that never ran
		// and could never be started again.
		_, rerr := s.release(r.Context(), bot, engineID)
		return errors.Join(fmt.Errorf("start %s: spawn engine %s: %w", bot, engineID, err), rerr)
	}
	writeJSON(w, http.StatusOK, botStatus{ID: bot, EngineID: &engineID})
	return nil
}

// stop stops the bot's engine, then releases the claim with the engine's id.
// In that order: released first, the claim would let a start spawn a second
// engine while the first still trades.
func (s *Service) stop(w http.ResponseWriter, r *http.Request) error {
	bot := r.PathValue("id")
	st, err := s.status(r.Context(), bot)
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if st.EngineID == nil {
		return refuse(http.StatusConflict, nil, "bot %s is not running", bot)
	}
	engineID := *st.EngineID
	if err := s.engines.Stop(r.Context(), engineID); errors.Is(err, ErrNoEngine) {
		// The start that claimed the bot is still spawning (or another stop
		// got here first). Releasing now would let that engine come up with
		// no row naming it: the orphan of the story.
		return refuse(http.StatusConflict, err, "bot %s is still starting or stopping; try again", bot)
	} else if err != nil {
		return fmt.Errorf("stop %s: %w", bot, err)
	}
	released, err := s.release(r.Context(), bot, engineID)
	if err != nil {
		return fmt.Errorf("stop %s: engine %s stopped: %w", bot, engineID, err)
	}
	if !released {
		return refuse(http.StatusConflict, nil, "bot %s was stopped and started again meanwhile", bot)
	}
	writeJSON(w, http.StatusOK, botStatus{ID: bot})
	return nil
}

func (s *Service) get(w http.ResponseWriter, r *http.Request) error {
	st, err := s.status(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (s *Service) status(ctx context.Context, bot string) (botStatus, error) {
	st := botStatus{ID: bot}
	err := s.db.GetContext(ctx, &st.EngineID, `SELECT engine_id FROM bots WHERE id = $1`, bot)
	if errors.Is(err, sql.ErrNoRows) {
		return st, refuse(http.StatusNotFound, err, "there is no bot %s", bot)
	}
	return st, err
}

// release clears the bot's claim if engineID still holds it; a late release
// never clears a newer claim. It runs even when the request is gone (a client
// that gave up may be why the spawn failed), hence a context of its own.
func (s *Service) release(ctx context.Context, bot, engineID string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return s.claims.Release(ctx, bot, engineID)
}

// refusal is a request the service turns down, a normal answer and not a
// failure: the status and a message written for the user. The cause (the
// library's error chain, "atomic: claim ...: contend: conflict") is for the
// code and the logs; the client never sees it.
type refusal struct {
	code  int
	msg   string
	cause error
}

func refuse(code int, cause error, format string, args ...any) *refusal {
	return &refusal{code: code, msg: fmt.Sprintf(format, args...), cause: cause}
}

func (r *refusal) Error() string {
	if r.cause == nil {
		return r.msg
	}
	return r.msg + ": " + r.cause.Error()
}

func (r *refusal) Unwrap() error { return r.cause }

// handle answers a handler's error: a refusal with its status and message
// (409 for a lost race, 404 for an unknown bot); anything else is 500, logged
// here and not shown to the client.
func (s *Service) handle(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		if ref, ok := errors.AsType[*refusal](err); ok {
			writeJSON(w, ref.code, errorBody{Error: ref.msg})
			return
		}
		s.log.Printf("%s %s: %v", r.Method, r.URL.Path, err)
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: http.StatusText(http.StatusInternalServerError)})
	})
}

type errorBody struct {
	Error string `json:"error"`
}

// writeJSON answers v with code. An encoding error is not reported: the
// status line is sent already, and with these types only a vanished client
// makes one.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
