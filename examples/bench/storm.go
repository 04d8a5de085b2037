package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	stdatomic "sync/atomic"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
	"github.com/contend/contend/internal/harness"
)

// The retry storm: every operation is a request of its own, sent three
// times, as a double click and a client's retry send it: two copies at
// once, then a third after both answered. Its effect is a row in
// storm_effects; exactly one row per request is the invariant, and the
// three copies must get the same answer.
//
//	idempotency        idempotency.Store.Do around the effect's INSERT
//	check-then-insert  SELECT the request's effect, INSERT it if none: the
//	                   negative control, whose two concurrent copies both
//	                   find none and both insert
//	unique-insert      the INSERT under a unique index on the request, ON
//	                   CONFLICT DO NOTHING, and a SELECT of the first
//	                   copy's answer when it inserted nothing: the floor
//	                   of the others (×raw is over its ops/s)
//
// It runs on PostgreSQL only, in one cell per worker count (the keys are
// the requests, fresh for each operation: the run's key counts do not
// apply).
const stormWorkload = "retry-storm"

// stormStrategies are the strategies of the retry storm, and only of it.
var stormStrategies = []string{"unique-insert", "idempotency", "check-then-insert"}

// stormCopies is how often each request is sent, stormAtOnce of them at
// once.
const (
	stormCopies = 3
	stormAtOnce = 2
)

// createStormTables makes the retry storm's tables afresh: the effects,
// with a unique index on the request for unique-insert only (the others
// must show a second effect if they make one), and the store's records.
func createStormTables(ctx context.Context, db *sqlx.DB, strategy string) error {
	stmts := []string{
		`DROP TABLE IF EXISTS storm_effects, storm_keys`,
		`CREATE TABLE storm_effects (n bigserial PRIMARY KEY, request text NOT NULL, answer text NOT NULL)`,
		`CREATE TABLE storm_keys (id text PRIMARY KEY, fingerprint text NOT NULL, state smallint NOT NULL,
			answer bytea, fence bigint NOT NULL, expires_at timestamptz NOT NULL)`,
		`CREATE INDEX ON storm_keys (expires_at)`,
	}
	if strategy == "unique-insert" {
		stmts = append(stmts, `CREATE UNIQUE INDEX ON storm_effects (request)`)
	}
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("create the retry storm's tables: %w", err)
		}
	}
	return nil
}

// A send sends one copy of request and returns its answer.
type send func(ctx context.Context, request string) (string, error)

// stormOp returns strategy's operation for the retry storm: a new request,
// sent stormCopies times. A request whose copies answered differently is
// counted in c.split, not failed: the control is there to show them.
func stormOp(db *sqlx.DB, h contend.DB, strategy string, c *counters) (harness.Op, error) {
	var s send
	switch strategy {
	case "idempotency":
		store, err := idempotency.New(h, idempotency.Config{Table: "storm_keys"})
		if err != nil {
			return nil, err
		}
		s = func(ctx context.Context, request string) (string, error) {
			answer, _, err := store.Do(ctx, request, "fp", func(ctx context.Context) ([]byte, error) {
				a := newToken()
				_, err := contend.Querier(ctx, db).ExecContext(ctx, `INSERT INTO storm_effects (request, answer) VALUES ($1, $2)`, request, a)
				return []byte(a), err
			})
			return string(answer), err
		}
	case "check-then-insert":
		s = func(ctx context.Context, request string) (string, error) {
			var answer string
			err := db.QueryRowContext(ctx, `SELECT answer FROM storm_effects WHERE request = $1 LIMIT 1`, request).Scan(&answer)
			if !errors.Is(err, sql.ErrNoRows) {
				return answer, err
			}
			answer = newToken()
			_, err = db.ExecContext(ctx, `INSERT INTO storm_effects (request, answer) VALUES ($1, $2)`, request, answer)
			return answer, err
		}
	case "unique-insert":
		s = func(ctx context.Context, request string) (string, error) {
			var answer string
			err := db.QueryRowContext(ctx, `INSERT INTO storm_effects (request, answer) VALUES ($1, $2)
				ON CONFLICT (request) DO NOTHING RETURNING answer`, request, newToken()).Scan(&answer)
			if errors.Is(err, sql.ErrNoRows) {
				err = db.QueryRowContext(ctx, `SELECT answer FROM storm_effects WHERE request = $1`, request).Scan(&answer)
			}
			return answer, err
		}
	default:
		return nil, fmt.Errorf("strategy %q does not run the retry storm", strategy)
	}
	// Requests are named by this process and a count, so that processes
	// and cells never share one.
	prefix := newToken() + "-"
	var next stdatomic.Int64
	return func(ctx context.Context, _ string) error {
		request := prefix + fmt.Sprint(next.Add(1))
		var answers [stormCopies]string
		var errs [stormCopies]error
		var wg sync.WaitGroup
		for i := range stormAtOnce {
			wg.Go(func() { answers[i], errs[i] = s(ctx, request) })
		}
		wg.Wait()
		for i := stormAtOnce; i < stormCopies; i++ {
			answers[i], errs[i] = s(ctx, request)
		}
		if err := errors.Join(errs[:]...); err != nil {
			return err
		}
		for _, a := range answers[1:] {
			if a != answers[0] {
				c.split.Add(1)
				break
			}
		}
		return nil
	}, nil
}

// checkStorm compares the requests answered with the effects the table
// shows: one effect per request, and the three copies of each answered
// alike.
func checkStorm(ctx context.Context, admin *sqlx.DB, out outcome) ([]string, error) {
	var n struct {
		Effects  int `db:"effects"`
		Requests int `db:"requests"`
	}
	if err := admin.GetContext(ctx, &n, `SELECT count(*) AS effects, count(DISTINCT request) AS requests FROM storm_effects`); err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	var broken []string
	if d := n.Effects - n.Requests; d > 0 {
		broken = append(broken, fmt.Sprintf("%d duplicate effects", d))
	}
	if out.Split > 0 {
		broken = append(broken, fmt.Sprintf("%d requests answered two ways", out.Split))
	}
	if d := out.Successes - n.Requests; d > 0 {
		broken = append(broken, fmt.Sprintf("%d requests answered without an effect", d))
	}
	if d := n.Requests - out.Successes - out.Errors; d > 0 {
		broken = append(broken, fmt.Sprintf("%d effects no request saw", d))
	}
	return broken, nil
}
