package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// patience bounds every wait on a signal, so a broken test fails instead of
// hanging.
const patience = 10 * time.Second

// env is two instances of the service on a fresh schema with one bot,
// "bot-1", sharing one engine platform, as in production.
type env struct {
	db      *sqlx.DB // the test's own pool, for looking at the row
	engines *Engines
	servers []*httptest.Server
}

func setup(t *testing.T, driver string, engines *Engines) *env {
	t.Helper()
	url := testserver.Postgres(t)
	e := &env{db: testserver.Open(t, driver, url), engines: engines}
	_, err := e.db.Exec(schema)
	require.NoError(t, err)
	_, err = e.db.Exec(`INSERT INTO bots (id) VALUES ('bot-1')`)
	require.NoError(t, err)
	for range 2 {
		svc, err := NewService(testserver.Open(t, driver, url), engines, log.New(t.Output(), "", 0))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, svc.Close(context.Background())) })
		srv := httptest.NewServer(svc.Handler())
		t.Cleanup(srv.Close)
		e.servers = append(e.servers, srv)
	}
	return e
}

// do sends a request to instance i.
func (e *env) do(t *testing.T, i int, method, path string) answer {
	t.Helper()
	ans, err := call(t.Context(), e.servers[i].Client(), method, e.servers[i].URL+path)
	require.NoError(t, err)
	return ans
}

// engineOf returns the engine id in bot-1's row, "" when NULL.
func (e *env) engineOf(t *testing.T) string {
	t.Helper()
	var id *string
	require.NoError(t, e.db.Get(&id, `SELECT engine_id FROM bots WHERE id = 'bot-1'`))
	if id == nil {
		return ""
	}
	return *id
}

type result struct {
	answer
	err error
}

// startAll sends n starts of bot-1 at once, alternating between the two
// instances. No request leaves before all n goroutines wait at a barrier, so
// they race. The results come in the order the answers did.
func (e *env) startAll(t *testing.T, n int) <-chan result {
	results := make(chan result, n)
	var ready, done sync.WaitGroup
	ready.Add(n)
	gate := make(chan struct{})
	for i := range n {
		srv := e.servers[i%2]
		done.Go(func() {
			ready.Done()
			<-gate
			ans, err := call(t.Context(), srv.Client(), http.MethodPost, srv.URL+"/bots/bot-1/start")
			results <- result{ans, err}
		})
	}
	ready.Wait()
	close(gate)
	t.Cleanup(done.Wait)
	return results
}

func next(t *testing.T, results <-chan result) answer {
	t.Helper()
	select {
	case r := <-results:
		require.NoError(t, r.err)
		return r.answer
	case <-time.After(patience):
		t.Fatal("no answer")
		return answer{}
	}
}

// spawnGate holds spawns in flight until the test opens it, and tells the
// test when each one has begun. A test that ends with the gate shut (it
// failed) lets the held spawns go, so they do not outlive it.
type spawnGate struct {
	begun  chan string // engine ids
	opened chan struct{}
	ended  <-chan struct{}
}

func newSpawnGate(t *testing.T) *spawnGate {
	return &spawnGate{begun: make(chan string, 100), opened: make(chan struct{}), ended: t.Context().Done()}
}

func (g *spawnGate) hold(ctx context.Context, engineID string) error {
	g.begun <- engineID
	select {
	case <-g.opened:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-g.ended:
		return errors.New("the test ended with the gate shut")
	}
}

func (g *spawnGate) open() { close(g.opened) }

// next waits for a spawn to begin and returns its engine id.
func (g *spawnGate) next(t *testing.T) string {
	t.Helper()
	select {
	case id := <-g.begun:
		return id
	case <-time.After(patience):
		t.Fatal("no spawn began")
		return ""
	}
}

// The double click of the story: two starts of one bot, one on each instance,
// at once. The loser is answered 409 while the winner is still spawning, and
// only one engine is ever spawned.
func TestDoubleStartSpawnsOneEngine(t *testing.T) {
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			gate := newSpawnGate(t)
			e := setup(t, driver, &Engines{Hold: gate.hold})

			results := e.startAll(t, 2)
			engineID := gate.next(t)
			require.Equal(t, http.StatusConflict, next(t, results).code, "the loser is answered first")
			gate.open()
			require.Equal(t, http.StatusOK, next(t, results).code)

			require.Equal(t, 1, e.engines.Spawns())
			require.Equal(t, map[string]string{engineID: "bot-1"}, e.engines.Running())
			require.Equal(t, engineID, e.engineOf(t), "the row names the engine that runs")
		})
	}
}

func TestManyStartsSpawnOneEngine(t *testing.T) {
	const n = 20
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			gate := newSpawnGate(t)
			e := setup(t, driver, &Engines{Hold: gate.hold})

			results := e.startAll(t, n)
			engineID := gate.next(t)
			for range n - 1 {
				require.Equal(t, http.StatusConflict, next(t, results).code)
			}
			gate.open()
			require.Equal(t, http.StatusOK, next(t, results).code)

			require.Equal(t, 1, e.engines.Spawns())
			require.Equal(t, map[string]string{engineID: "bot-1"}, e.engines.Running())
			require.Equal(t, engineID, e.engineOf(t))
		})
	}
}

func TestStopStopsTheRunningEngine(t *testing.T) {
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			e := setup(t, driver, &Engines{})

			started := e.do(t, 0, http.MethodPost, "/bots/bot-1/start")
			require.Equal(t, http.StatusOK, started.code)
			var st botStatus
			require.NoError(t, json.Unmarshal(started.body, &st))
			require.NotNil(t, st.EngineID)
			engineID := *st.EngineID
			require.Equal(t, engineID, e.engineOf(t))
			require.Equal(t, map[string]string{engineID: "bot-1"}, e.engines.Running())

			// B stops what A started: the row, not the instance, knows the engine.
			require.Equal(t, http.StatusOK, e.do(t, 1, http.MethodPost, "/bots/bot-1/stop").code)
			require.Empty(t, e.engines.Running())
			require.Empty(t, e.engineOf(t))
			got := e.do(t, 0, http.MethodGet, "/bots/bot-1")
			require.Equal(t, http.StatusOK, got.code)
			require.JSONEq(t, `{"id":"bot-1","engine_id":null}`, string(got.body))

			require.Equal(t, http.StatusConflict, e.do(t, 1, http.MethodPost, "/bots/bot-1/stop").code, "nothing to stop")

			restarted := e.do(t, 1, http.MethodPost, "/bots/bot-1/start")
			require.Equal(t, http.StatusOK, restarted.code)
			require.NotEqual(t, engineID, e.engineOf(t), "a new start, a new engine")
			require.Len(t, e.engines.Running(), 1)
		})
	}
}

func TestFailedSpawnReleasesTheClaim(t *testing.T) {
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			e := setup(t, driver, &Engines{})

			e.engines.FailNext(errors.New("image pull failed"))
			require.Equal(t, http.StatusInternalServerError, e.do(t, 0, http.MethodPost, "/bots/bot-1/start").code)
			require.Empty(t, e.engineOf(t), "the failed start released its claim")
			require.Empty(t, e.engines.Running())

			require.Equal(t, http.StatusOK, e.do(t, 1, http.MethodPost, "/bots/bot-1/start").code)
			require.Equal(t, 2, e.engines.Spawns())
			require.Len(t, e.engines.Running(), 1)
		})
	}
}

// A client that gives up mid-spawn (a closed tab) fails its start, and the
// claim is released all the same: the release does not run on the request's
// context.
func TestAbandonedStartReleasesTheClaim(t *testing.T) {
	t.Parallel()
	gate := newSpawnGate(t)
	e := setup(t, "pgx", &Engines{Hold: gate.hold})

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := call(ctx, e.servers[0].Client(), http.MethodPost, e.servers[0].URL+"/bots/bot-1/start")
		errc <- err
	}()
	gate.next(t)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	e.servers[0].Close() // returns once A's handler, release included, is done
	require.Empty(t, e.engineOf(t))
	require.Empty(t, e.engines.Running())

	gate.open()
	require.Equal(t, http.StatusOK, e.do(t, 1, http.MethodPost, "/bots/bot-1/start").code)
}

// A stop while the start still spawns is refused: releasing the claim then
// would let the engine come up with no row naming it, and nothing could stop it.
func TestStopWhileStartingIsRefused(t *testing.T) {
	t.Parallel()
	gate := newSpawnGate(t)
	e := setup(t, "postgres", &Engines{Hold: gate.hold})

	results := e.startAll(t, 1)
	engineID := gate.next(t)
	require.Equal(t, http.StatusConflict, e.do(t, 1, http.MethodPost, "/bots/bot-1/stop").code)
	gate.open()
	require.Equal(t, http.StatusOK, next(t, results).code)
	require.Equal(t, map[string]string{engineID: "bot-1"}, e.engines.Running())
	require.Equal(t, engineID, e.engineOf(t))
}

func TestUnknownBot(t *testing.T) {
	t.Parallel()
	e := setup(t, "postgres", &Engines{})
	for _, path := range []string{"/bots/ghost/start", "/bots/ghost/stop"} {
		require.Equal(t, http.StatusNotFound, e.do(t, 0, http.MethodPost, path).code, path)
	}
	require.Equal(t, http.StatusNotFound, e.do(t, 0, http.MethodGet, "/bots/ghost").code)
	require.Zero(t, e.engines.Spawns())
	require.Empty(t, e.engineOf(t), "bot-1 untouched")
}

// The -serve mode on a database that has no bots table yet: the double click
// gets one 200 and one 409, a stop then a start work, an unknown bot is 404,
// and every refusal's body is a message for the user, not the library's error
// chain.
func TestServe(t *testing.T) {
	t.Parallel()
	db := testserver.Open(t, "pgx", testserver.Postgres(t))
	svc, err := newServeService(t.Context(), db, []string{"bot-1", " bot-2"}, &Engines{}, log.New(t.Output(), "", 0))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, svc.Close(context.Background())) })
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	post := func(path string) answer {
		t.Helper()
		ans, err := call(t.Context(), srv.Client(), http.MethodPost, srv.URL+path)
		require.NoError(t, err)
		return ans
	}

	answers := make(chan answer, 2)
	var ready, done sync.WaitGroup
	ready.Add(2)
	gate := make(chan struct{})
	for range 2 {
		done.Go(func() {
			ready.Done()
			<-gate
			ans, err := call(t.Context(), srv.Client(), http.MethodPost, srv.URL+"/bots/bot-1/start")
			if err != nil {
				ans.body = []byte(err.Error())
			}
			answers <- ans
		})
	}
	ready.Wait()
	close(gate)
	done.Wait()
	close(answers)
	byCode := map[int]string{}
	for ans := range answers {
		byCode[ans.code] = string(ans.body)
	}
	require.Len(t, byCode, 2, "one start wins, one loses: %v", byCode)
	require.Contains(t, byCode, http.StatusOK)
	require.JSONEq(t, `{"error":"bot bot-1 is already running"}`, byCode[http.StatusConflict])

	stopped := post("/bots/bot-1/stop")
	require.Equal(t, http.StatusOK, stopped.code)
	require.JSONEq(t, `{"id":"bot-1","engine_id":null}`, string(stopped.body))
	again := post("/bots/bot-1/stop")
	require.Equal(t, http.StatusConflict, again.code)
	require.JSONEq(t, `{"error":"bot bot-1 is not running"}`, string(again.body))
	require.Equal(t, http.StatusOK, post("/bots/bot-1/start").code)
	require.Equal(t, http.StatusOK, post("/bots/bot-2/start").code, "the bots given, trimmed, exist")

	for _, path := range []string{"/bots/ghost/start", "/bots/ghost/stop"} {
		ans := post(path)
		require.Equal(t, http.StatusNotFound, ans.code, path)
		require.JSONEq(t, `{"error":"there is no bot ghost"}`, string(ans.body), path)
	}

	// Preparing again, as a restarted -serve does, keeps the bots' state.
	restarted, err := newServeService(t.Context(), db, []string{"bot-1"}, &Engines{}, log.New(t.Output(), "", 0))
	require.NoError(t, err)
	require.NoError(t, restarted.Close(t.Context()))
	require.Len(t, svc.engines.(*Engines).Running(), 2)
	var claimed int
	require.NoError(t, db.Get(&claimed, `SELECT count(*) FROM bots WHERE engine_id IS NOT NULL`))
	require.Equal(t, 2, claimed)
}

// keyedStart sends a start of bot with an Idempotency-Key and a body.
func keyedStart(t *testing.T, srv *httptest.Server, bot, key, body string) (answer, bool) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/bots/"+bot+"/start", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{code: resp.StatusCode, body: b}, resp.Header.Get("Idempotent-Replayed") == "true"
}

// The -serve mode with an Idempotency-Key: a double click that sends one
// key twice, at once, to two instances, spawns one engine and gets the same
// 200 twice; only another request (another key) gets 409, and the key
// reused for another payload 422.
func TestServeDoubleClickWithIdempotencyKey(t *testing.T) {
	t.Parallel()
	url := testserver.Postgres(t)
	engines := &Engines{}
	var servers []*httptest.Server
	for i := range 2 {
		db := testserver.Open(t, "pgx", url)
		svc, err := newServeService(t.Context(), db, []string{"bot-1"}, engines, log.New(t.Output(), "", 0))
		require.NoError(t, err, "instance %d", i)
		t.Cleanup(func() { require.NoError(t, svc.Close(context.Background())) })
		srv := httptest.NewServer(svc.Handler())
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}

	type click struct {
		answer
		replayed bool
	}
	clicks := make(chan click, 2)
	var ready, done sync.WaitGroup
	ready.Add(2)
	gate := make(chan struct{})
	for _, srv := range servers {
		done.Go(func() {
			ready.Done()
			<-gate
			a, replayed := keyedStart(t, srv, "bot-1", "click-7c1e", `{}`)
			clicks <- click{a, replayed}
		})
	}
	ready.Wait()
	close(gate)
	done.Wait()
	close(clicks)
	var got []click
	for c := range clicks {
		got = append(got, c)
	}
	require.Equal(t, http.StatusOK, got[0].code, "%s", got[0].body)
	require.Equal(t, http.StatusOK, got[1].code, "%s", got[1].body)
	require.Equal(t, string(got[0].body), string(got[1].body), "the same answer twice")
	require.True(t, got[0].replayed != got[1].replayed, "one ran, one was replayed")
	require.Equal(t, 1, engines.Spawns())

	other, _ := keyedStart(t, servers[0], "bot-1", "click-9d0a", `{}`)
	require.Equal(t, http.StatusConflict, other.code)
	require.JSONEq(t, `{"error":"bot bot-1 is already running"}`, string(other.body))
	reused, _ := keyedStart(t, servers[1], "bot-1", "click-7c1e", `{"strategy":"grid"}`)
	require.Equal(t, http.StatusUnprocessableEntity, reused.code)
	require.Equal(t, 1, engines.Spawns())
}
