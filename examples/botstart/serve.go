package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// serve runs one instance of the service on addr until ctx ends, on the bots
// table of the database at dbURL, creating the table and bots when missing.
func serve(ctx context.Context, addr, dbURL string, bots []string, spawnDelay time.Duration) (err error) {
	if spawnDelay < 0 {
		return fmt.Errorf("-spawn %v is negative", spawnDelay)
	}
	db, err := sqlx.Open("pgx", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	svc, err := newServeService(ctx, db, bots, &Engines{SpawnDelay: spawnDelay}, log.New(os.Stderr, "botstart: ", log.LstdFlags))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, svc.Close(context.WithoutCancel(ctx))) }()

	srv := &http.Server{Addr: addr, Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	fmt.Fprintf(os.Stderr, "botstart: serving on %s: POST /bots/{id}/start, POST /bots/{id}/stop, GET /bots/{id}\n", addr)
	select {
	case err := <-served:
		return err // could not listen
	case <-ctx.Done():
	}
	// Let the requests in flight finish: a start cut off mid-spawn still
	// releases its claim, but only if its handler gets to run to the end.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), spawnDelay+5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// newServeService prepares the service -serve runs: the bots table and bots
// on db when missing, and a Service on them.
func newServeService(ctx context.Context, db *sqlx.DB, bots []string, engines Spawner, logger *log.Logger) (*Service, error) {
	if err := prepare(ctx, db, bots...); err != nil {
		return nil, err
	}
	return NewService(db, engines, logger)
}

// prepare creates the bots table on db, and a stopped bot for each id, unless
// they exist.
func prepare(ctx context.Context, db *sqlx.DB, ids ...string) error {
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create bots table: %w", err)
	}
	for _, id := range ids {
		if id = strings.TrimSpace(id); id == "" {
			continue
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO bots (id) VALUES ($1) ON CONFLICT (id) DO NOTHING`, id); err != nil {
			return fmt.Errorf("create bot %s: %w", id, err)
		}
	}
	return nil
}
