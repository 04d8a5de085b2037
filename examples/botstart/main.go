// Command botstart is the story of a double-clicked "start bot" as a small
// HTTP service. The click spawned two trading engines because the handler read
// "not running" and then wrote the engine's id, and both requests read before
// either wrote. Here the engine's id is made first and claimed in one
// conditional UPDATE,
//
//	UPDATE bots SET engine_id = $id WHERE id = $bot AND engine_id IS NULL
//
// so that of any number of concurrent starts, on any number of servers,
// exactly one writes the row and goes on to spawn; the others get 409 at once.
// A failed spawn releases the claim with WHERE engine_id = $id, so a late
// release never clears a newer claim.
//
// It connects to the PostgreSQL server named by CONTEND_POSTGRES_URL
// (default postgres://postgres@127.0.0.1:5432/test?sslmode=disable).
//
// Run with no arguments, it runs two instances of the service on a schema of
// its own, plays the story against them, drops the schema, and exits non-zero
// if anything went otherwise than described:
//
//	go run ./examples/botstart [-spawn 2s]
//
// With -serve, it is the service: one instance listening on the address,
// working on the database's bots table, which it creates when missing, with
// the bots of -bots:
//
//	go run ./examples/botstart -serve :8080 [-bots bot-1,bot-2] [-spawn 2s]
//	curl -X POST localhost:8080/bots/bot-1/start   # 200 {"id":"bot-1","engine_id":"…"}
//	curl -X POST localhost:8080/bots/bot-1/start   # 409 {"error":"bot bot-1 is already running"}
//	curl localhost:8080/bots/bot-1                 # 200 the bot's row
//	curl -X POST localhost:8080/bots/bot-1/stop    # 200 {"id":"bot-1","engine_id":null}
//	curl -X POST localhost:8080/bots/bot-9/start   # 404 {"error":"there is no bot bot-9"}
//
// A start sent with an Idempotency-Key header runs once per key: a double
// click that sends the same key twice gets the same 200 twice (the second
// with Idempotent-Replayed: true), and only another request is refused:
//
//	curl -X POST -H 'Idempotency-Key: 7c1e' localhost:8080/bots/bot-2/start   # 200 {"id":"bot-2","engine_id":"…"}
//	curl -X POST -H 'Idempotency-Key: 7c1e' localhost:8080/bots/bot-2/start   # the same 200, replayed
//	curl -X POST -H 'Idempotency-Key: 9d0a' localhost:8080/bots/bot-2/start   # 409 {"error":"bot bot-2 is already running"}
//	curl -X POST -H 'Idempotency-Key: 7c1e' -d '{}' localhost:8080/bots/bot-2/start # 422: the key was used for another request
//
// The engines it spawns are an in-process stand-in for a container platform
// (see Engines): instances in other processes could claim a bot but not stop
// an engine this one spawned.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"
)

func main() {
	spawn := flag.Duration("spawn", 2*time.Second, "how long spawning an engine takes")
	addr := flag.String("serve", "", `serve the API on this address (e.g. ":8080") instead of playing the story`)
	bots := flag.String("bots", "bot-1,bot-2,bot-3", "with -serve: the bots to create when missing, comma-separated")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	var err error
	if *addr != "" {
		err = serve(ctx, *addr, postgresURL(), strings.Split(*bots, ","), *spawn)
	} else {
		err = run(ctx, *spawn)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "botstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, spawnDelay time.Duration) (err error) {
	if spawnDelay < 0 {
		return fmt.Errorf("-spawn %v is negative", spawnDelay)
	}
	server := postgresURL()
	schemaName, dbURL, dropSchema, err := createSchema(ctx, server)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dropSchema()) }()
	if err := createBots(ctx, dbURL, "bot-1"); err != nil {
		return err
	}

	engines := &Engines{SpawnDelay: spawnDelay}
	var instances []*instance
	defer func() {
		for _, in := range instances {
			err = errors.Join(err, in.close(context.WithoutCancel(ctx)))
		}
	}()
	for _, name := range []string{"A", "B"} {
		in, err := startInstance(ctx, name, dbURL, engines)
		if err != nil {
			return err
		}
		instances = append(instances, in)
	}

	d := &demo{
		client:  &http.Client{Timeout: spawnDelay + 10*time.Second},
		engines: engines,
		a:       instances[0],
		b:       instances[1],
	}
	defer d.client.CloseIdleConnections()
	host := server // only the host is printed: the URL may carry a password
	if u, err := url.Parse(server); err == nil {
		host = u.Host
	}
	fmt.Printf("PostgreSQL at %s, schema %s\ninstances A at %s and B at %s; a spawn takes %v\n",
		host, schemaName, d.a.url, d.b.url, spawnDelay)
	d.script(ctx)
	if d.failed > 0 {
		return fmt.Errorf("%d of %d expectations failed", d.failed, d.checked)
	}
	fmt.Printf("\nall %d expectations held\n", d.checked)
	return nil
}

// postgresURL is the server's URL: CONTEND_POSTGRES_URL, else the local
// server's.
func postgresURL() string {
	if u := os.Getenv("CONTEND_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// createSchema creates a schema of the story's own on the server, so that the
// story never touches another program's bots table, and returns its name, a
// URL whose connections work in it, and what drops it.
func createSchema(ctx context.Context, server string) (name, schemaURL string, drop func() error, err error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	name = "botstart_" + hex.EncodeToString(b[:])
	u, err := url.Parse(server)
	if err != nil {
		return "", "", nil, fmt.Errorf("CONTEND_POSTGRES_URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", name) // sent to the server as a run-time setting
	u.RawQuery = q.Encode()
	execute := func(ctx context.Context, stmt string) error {
		db, err := sqlx.Open("pgx", server)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, stmt)
		return err
	}
	if err := execute(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", "", nil, fmt.Errorf("create schema: %w", err)
	}
	drop = func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return execute(ctx, "DROP SCHEMA "+name+" CASCADE")
	}
	return name, u.String(), drop, nil
}

func createBots(ctx context.Context, dbURL string, ids ...string) error {
	db, err := sqlx.Open("pgx", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	return prepare(ctx, db, ids...)
}

// instance is one server of the service, as a deployment runs several: its
// own pool and claimer, sharing the database and the engine platform with the
// others.
type instance struct {
	name   string
	url    string
	db     *sqlx.DB
	svc    *Service
	srv    *http.Server
	served chan error // Serve's error, once it returned
}

func startInstance(ctx context.Context, name, dbURL string, engines Spawner) (*instance, error) {
	db, err := sqlx.Open("pgx", dbURL)
	if err != nil {
		return nil, err
	}
	svc, err := NewService(db, engines, log.New(os.Stdout, "    "+name+" logs: ", 0))
	if err != nil {
		db.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		svc.Close(ctx)
		db.Close()
		return nil, err
	}
	in := &instance{
		name:   name,
		url:    "http://" + ln.Addr().String(),
		db:     db,
		svc:    svc,
		srv:    &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second},
		served: make(chan error, 1),
	}
	go func() { in.served <- in.srv.Serve(ln) }()
	return in, nil
}

// close stops taking requests, waits for those in flight, and closes the
// instance's claimer and pool.
func (in *instance) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := in.srv.Shutdown(ctx)
	if serr := <-in.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return errors.Join(err, in.svc.Close(ctx), in.db.Close())
}

// answer is an HTTP response as the demo and the tests look at it.
type answer struct {
	code int
	body []byte
	took time.Duration
}

func call(ctx context.Context, client *http.Client, method, url string) (answer, error) {
	began := time.Now()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return answer{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, body: body, took: time.Since(began)}, err
}

// demo plays the story against two instances and checks what it claims.
type demo struct {
	client  *http.Client
	engines *Engines
	a, b    *instance

	checked, failed int
}

func (d *demo) script(ctx context.Context) {
	const start, stop = "/bots/bot-1/start", "/bots/bot-1/stop"

	fmt.Println("\n(a) double click: start bot-1 on A and on B at the same time")
	got := d.race(ctx, start, d.a, d.b)
	won, lost := got[http.StatusOK], got[http.StatusConflict]
	d.expect(len(won) == 1 && len(lost) == 1,
		fmt.Sprintf("one start won (%s), the other got 409 (%s)", strings.Join(won, ""), strings.Join(lost, "")), "answers by status: %v", got)
	d.expectOneEngine(ctx, 1)

	fmt.Println("\n(b) stop bot-1 on B")
	d.expect(d.do(ctx, d.b, http.MethodPost, stop) == http.StatusOK, "stop got 200", "")
	d.expectStopped(ctx)

	fmt.Println("\n(c) start bot-1 on A; the spawn fails")
	d.engines.FailNext(errors.New("container runtime: image pull failed"))
	d.expect(d.do(ctx, d.a, http.MethodPost, start) == http.StatusInternalServerError, "start got 500", "")
	d.expectStopped(ctx)

	fmt.Println("\n(d) start bot-1 again, on B")
	d.expect(d.do(ctx, d.b, http.MethodPost, start) == http.StatusOK, "start got 200", "")
	d.expectOneEngine(ctx, 3)
}

// race posts path to every instance at once, prints the answers in the order
// they came, and returns which instances got each status.
func (d *demo) race(ctx context.Context, path string, to ...*instance) map[int][]string {
	type result struct {
		in  *instance
		ans answer
		err error
	}
	results := make(chan result, len(to))
	var ready, done sync.WaitGroup
	ready.Add(len(to))
	gate := make(chan struct{})
	for _, in := range to {
		done.Go(func() {
			// A barrier: no request leaves before every goroutine is ready,
			// so they reach the instances together, like a double click.
			ready.Done()
			<-gate
			ans, err := call(ctx, d.client, http.MethodPost, in.url+path)
			results <- result{in, ans, err}
		})
	}
	ready.Wait()
	close(gate)
	done.Wait()
	close(results)

	got := make(map[int][]string)
	for r := range results {
		d.print(r.in, http.MethodPost, path, r.ans, r.err)
		got[r.ans.code] = append(got[r.ans.code], r.in.name)
	}
	return got
}

// do sends one request to in, prints the answer, and returns its status.
func (d *demo) do(ctx context.Context, in *instance, method, path string) int {
	ans, err := call(ctx, d.client, method, in.url+path)
	d.print(in, method, path, ans, err)
	return ans.code
}

func (d *demo) print(in *instance, method, path string, ans answer, err error) {
	if err != nil {
		fmt.Printf("    %s %s %s: %v\n", in.name, method, path, err)
		return
	}
	var e errorBody
	msg := string(bytes.TrimSpace(ans.body))
	if json.Unmarshal(ans.body, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	fmt.Printf("    %s %s %s → %d %s  (%v)\n", in.name, method, path, ans.code, msg, ans.took.Round(time.Millisecond))
}

// status reads bot-1 through the API, as a dashboard would.
func (d *demo) status(ctx context.Context) (botStatus, error) {
	var st botStatus
	ans, err := call(ctx, d.client, http.MethodGet, d.a.url+"/bots/bot-1")
	if err != nil {
		return st, err
	}
	if ans.code != http.StatusOK {
		return st, fmt.Errorf("GET /bots/bot-1: %d %s", ans.code, ans.body)
	}
	return st, json.Unmarshal(ans.body, &st)
}

func (d *demo) expectOneEngine(ctx context.Context, spawns int) {
	st, err := d.status(ctx)
	running := d.engines.Running()
	ok := err == nil && st.EngineID != nil && len(running) == 1 && running[*st.EngineID] == "bot-1"
	what := "one engine runs, the one bot-1's row names"
	if ok {
		what = fmt.Sprintf("one engine runs, %s, the one bot-1's row names", *st.EngineID)
	}
	d.expect(ok, what, "running %v; row %s; %v", running, engineOf(st), err)
	d.expect(d.engines.Spawns() == spawns, fmt.Sprintf("spawns so far: %d", spawns), "got %d", d.engines.Spawns())
}

func (d *demo) expectStopped(ctx context.Context) {
	st, err := d.status(ctx)
	running := d.engines.Running()
	d.expect(err == nil && st.EngineID == nil && len(running) == 0, "no engine runs and bot-1's claim is released",
		"running %v; row %s; %v", running, engineOf(st), err)
}

// expect prints what it checked, and on failure why it failed.
func (d *demo) expect(ok bool, what, failure string, args ...any) {
	d.checked++
	if ok {
		fmt.Printf("    ok   %s\n", what)
		return
	}
	d.failed++
	fmt.Printf("    FAIL %s: %s\n", what, fmt.Sprintf(failure, args...))
}

func engineOf(st botStatus) string {
	if st.EngineID == nil {
		return "engine_id NULL"
	}
	return "engine_id " + *st.EngineID
}
