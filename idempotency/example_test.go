package idempotency_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
)

const exampleTables = `CREATE TABLE idempotency_keys (id text PRIMARY KEY, fingerprint text NOT NULL,
		state smallint NOT NULL, answer bytea, fence bigint NOT NULL, expires_at timestamptz NOT NULL);
	CREATE INDEX ON idempotency_keys (expires_at);
	CREATE TABLE engines (bot text NOT NULL, started_at timestamptz NOT NULL DEFAULT now())`

// A "start the bot" endpoint behind the middleware: a double click sends
// the same request twice with one Idempotency-Key, and the bot starts once;
// the second click gets the first one's answer. The same key on another
// request is refused.
func ExampleMiddleware() {
	db, done := exampleDB(exampleTables)
	defer done()
	store, err := idempotency.New(db, idempotency.Config{Table: "idempotency_keys"})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.Middleware(store, idempotency.HTTPConfig{
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }, // your auth here
	})
	if err != nil {
		log.Fatal(err)
	}
	start := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Through the store's transaction: the start and its recorded
		// answer commit together.
		q := contend.Querier(r.Context(), db)
		if _, err := q.ExecContext(r.Context(), `INSERT INTO engines (bot) VALUES ($1)`, r.PathValue("bot")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var n int
		if err := q.QueryRowContext(r.Context(), `SELECT count(*) FROM engines WHERE bot = $1`, r.PathValue("bot")).Scan(&n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "bot %s started, engines running: %d\n", r.PathValue("bot"), n)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /bots/{bot}/start", mw(start))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	click := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/bots/7/start", strings.NewReader(body))
		req.Header.Set("X-User", "ann")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get(idempotency.ReplayedHeader), b)
	}
	click("3f6c", `{"strategy":"grid"}`)
	click("3f6c", `{"strategy":"grid"}`) // the double click
	click("3f6c", `{"strategy":"momentum"}`)
	// Output:
	// 200 replayed="" bot 7 started, engines running: 1
	// 200 replayed="true" bot 7 started, engines running: 1
	// 422 replayed="" {"detail":"the Idempotency-Key was used for another request","status":422,"title":"Unprocessable Entity"}
}

// exampleDB opens a pool on a schema of its own, made with setup, and
// returns it with the function that drops it.
func exampleDB(setup string) (*sqlx.DB, func()) {
	server := os.Getenv("CONTEND_POSTGRES_URL")
	if server == "" {
		server = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + hex.EncodeToString(b[:])
	admin := sqlx.MustOpen("pgx", server)
	admin.MustExec("CREATE SCHEMA " + schema)
	u, err := url.Parse(server)
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	db := sqlx.MustOpen("pgx", u.String())
	db.MustExec(setup)
	return db, func() {
		db.Close()
		admin.MustExec("DROP SCHEMA " + schema + " CASCADE")
		admin.Close()
	}
}
