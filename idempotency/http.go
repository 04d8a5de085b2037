package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/contend/contend"
)

// HTTPConfig says how [Middleware] reads a request's key and who sent it.
type HTTPConfig struct {
	// Header is the request header that carries the key. Zero means
	// "Idempotency-Key".
	Header string
	// Principal returns who sent the request (an account, an API client),
	// which scopes the key: equal keys of two principals are two keys, so
	// that one client can neither replay nor block another's request. An
	// error answers the request with 401. Required.
	Principal func(r *http.Request) (string, error)
	// Fingerprint returns the fingerprint of a request whose body is body.
	// Zero means a SHA-256 of the method, the request URI and the body.
	Fingerprint func(r *http.Request, body []byte) string
	// MaxBody bounds the body read for the fingerprint; a longer one is
	// answered with 413. Zero means 1 MiB.
	MaxBody int64
}

// ReplayedHeader is set, to "true", on a response that replays a stored
// one.
const ReplayedHeader = "Idempotent-Replayed"

// Middleware returns a middleware that runs each request with an
// idempotency key through s, as the IETF Idempotency-Key draft has it:
//
//   - a request without the key gets 400 (GET, HEAD and OPTIONS pass
//     through: they are idempotent already);
//   - the first request with a key runs the handler, under [Store.Do]: its
//     writes through [contend.Querier] (or pgxdb.Querier) on the request's
//     ctx commit with the recorded response (status, headers, body);
//   - a later request with the key and the same fingerprint gets the
//     recorded response, with [ReplayedHeader]; one that comes while the
//     first is in flight waits for it (bounded by the request's ctx), or
//     gets 409 under [Config.NoWait];
//   - a request with the key and another fingerprint gets 422.
//
// A response with a status of 500 or more is a failure of the server, not
// an answer: it is sent, nothing is recorded, the handler's writes roll
// back, and a retry runs the handler again. The handler's response is
// buffered, so it cannot stream. Keys are stored as a SHA-256 of the
// principal and the key.
//
// It fails with an error matching [contend.ErrInvalid] when s is nil or
// cfg has no Principal.
func Middleware(s *Store, cfg HTTPConfig) (func(http.Handler) http.Handler, error) {
	if s == nil {
		return nil, fmt.Errorf("idempotency: middleware: nil store: %w", contend.ErrInvalid)
	}
	if cfg.Principal == nil {
		return nil, fmt.Errorf("idempotency: middleware: no Principal: keys must be scoped by who sends them: %w", contend.ErrInvalid)
	}
	if cfg.Header == "" {
		cfg.Header = "Idempotency-Key"
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.Fingerprint == nil {
		cfg.Fingerprint = defaultFingerprint
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.Method {
			case http.MethodGet, http.MethodHead, http.MethodOptions:
				next.ServeHTTP(w, r)
				return
			}
			key := r.Header.Get(cfg.Header)
			if key == "" {
				problem(w, http.StatusBadRequest, "this request needs an "+cfg.Header+" header")
				return
			}
			principal, err := cfg.Principal(r)
			if err != nil {
				problem(w, http.StatusUnauthorized, err.Error())
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, cfg.MaxBody+1))
			if err != nil {
				problem(w, http.StatusBadRequest, "reading the body: "+err.Error())
				return
			}
			if int64(len(body)) > cfg.MaxBody {
				problem(w, http.StatusRequestEntityTooLarge, "the body is longer than "+strconv.FormatInt(cfg.MaxBody, 10)+" bytes")
				return
			}
			fp := cfg.Fingerprint(r, body)
			answer, replayed, err := s.Do(r.Context(), scope(principal, key), fp, func(ctx context.Context) ([]byte, error) {
				rec := &recorder{header: http.Header{}, status: http.StatusOK}
				req := r.WithContext(ctx)
				req.Body = io.NopCloser(bytes.NewReader(body))
				next.ServeHTTP(rec, req)
				if rec.status >= 500 {
					return nil, Transient(&unrecorded{rec})
				}
				return json.Marshal(rec.response())
			})
			var un *unrecorded
			switch {
			case errors.As(err, &un):
				un.rec.response().write(w)
			case errors.Is(err, ErrMismatch):
				problem(w, http.StatusUnprocessableEntity, "the "+cfg.Header+" was used for another request")
			case errors.Is(err, ErrInFlight):
				problem(w, http.StatusConflict, "a request with this "+cfg.Header+" is being processed")
			case err != nil && r.Context().Err() != nil:
				problem(w, http.StatusServiceUnavailable, "gave up waiting: "+err.Error())
			case err != nil:
				problem(w, http.StatusInternalServerError, err.Error())
			default:
				var resp response
				if err := json.Unmarshal(answer, &resp); err != nil {
					problem(w, http.StatusInternalServerError, "the recorded response does not decode: "+err.Error())
					return
				}
				if replayed {
					w.Header().Set(ReplayedHeader, "true")
				}
				resp.write(w)
			}
		})
	}, nil
}

// scope is the stored key of principal's key: a hash, so that neither can
// end the other early, and of one length, whatever the client sends.
func scope(principal, key string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s:%s", len(principal), principal, key)
	return hex.EncodeToString(h.Sum(nil))
}

func defaultFingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s %d:", r.Method, r.URL.RequestURI(), len(body))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// problem answers with an RFC 9457 problem document, as the draft shows.
func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"title": http.StatusText(status), "status": status, "detail": detail})
}

// response is a handler's response as it is recorded.
type response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header"`
	Body   []byte      `json:"body"`
}

func (resp response) write(w http.ResponseWriter) {
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// recorder buffers a handler's response.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.body.Write(b)
}

func (r *recorder) response() response {
	h := r.header.Clone()
	h.Del("Date")
	return response{Status: r.status, Header: h, Body: r.body.Bytes()}
}

// unrecorded carries a server error's response out of Do, which rolls
// back, to be sent as it is.
type unrecorded struct{ rec *recorder }

func (u *unrecorded) Error() string {
	return "idempotency: the handler answered " + strconv.Itoa(u.rec.status) + ", not recorded"
}
