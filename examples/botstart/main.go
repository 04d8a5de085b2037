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
// Run with no arguments, it finds or starts a PostgreSQL server (see
// internal/testserver), runs two instances of the service on a fresh schema,
// plays the story against them, and exits non-zero if anything went otherwise
// than described:
//
//	go run ./examples/botstart [-spawn 2s]
package main

import (
	"bytes"
	"context"
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

	"github.com/contend/contend/internal/testserver"
)

func main() {
	spawn := flag.Duration("spawn", 2*time.Second, "how long spawning an engine takes")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, *spawn)
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
	// PostgresURL starts a throwaway server when none answers; StopAll stops it.
	defer func() { err = errors.Join(err, testserver.StopAll()) }()
	server, err := testserver.PostgresURL()
	if err != nil {
		return err
	}
	schemaName, dbURL, err := testserver.CreateSchema(ctx, server)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, testserver.DropSchema(context.WithoutCancel(ctx), server, schemaName))
	}()
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

func createBots(ctx context.Context, dbURL string, ids ...string) error {
	db, err := sqlx.Open("pgx", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create bots: %w", err)
	}
	for _, id := range ids {
		if _, err := db.ExecContext(ctx, `INSERT INTO bots (id) VALUES ($1)`, id); err != nil {
			return fmt.Errorf("insert bot %s: %w", id, err)
		}
	}
	return nil
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
	svc, err := NewService(ctx, db, engines, log.New(os.Stdout, "    "+name+" logs: ", 0))
	if err != nil {
		db.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		svc.Close()
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
	return errors.Join(err, in.svc.Close(), in.db.Close())
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
