package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
)

// The peers: the two Redis lock libraries most Go services use, doing
// distlock's job in the same cells, each configured to wait for a held key
// (as distlock.Client.Do does) rather than fail at once.

// peerTTL is every peer lock's lease, distlock's default.
const peerTTL = 10 * time.Second

// redislockGuard runs fn under a bsm/redislock lock, polling a held key
// with the exponential backoff the library provides.
type redislockGuard struct {
	c      *redislock.Client
	prefix string
}

func newRedislockGuard(rdb *redis.Client, prefix string) *redislockGuard {
	return &redislockGuard{c: redislock.New(rdb), prefix: prefix}
}

func (g *redislockGuard) Do(ctx context.Context, key string, fn func(context.Context) error) (err error) {
	// Without a deadline of ctx's, Obtain gives up after one TTL.
	lock, err := g.c.Obtain(ctx, g.prefix+key, peerTTL, &redislock.Options{
		RetryStrategy: redislock.ExponentialBackoff(time.Millisecond, 64*time.Millisecond),
	})
	if errors.Is(err, redislock.ErrNotObtained) {
		return fmt.Errorf("redislock %s: %w", key, contend.ErrConflict)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, lock.Release(context.WithoutCancel(ctx))) }()
	return fn(ctx)
}

// pollGuard is the lock the popular libraries reduce to on a held key, with
// nothing else: SET NX PX retried every millisecond, released by the
// compare-and-delete script. The floor for distlock's waits.
type pollGuard struct {
	rdb    *redis.Client
	prefix string
}

var pollRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func (g *pollGuard) Do(ctx context.Context, key string, fn func(context.Context) error) (err error) {
	key, tok := g.prefix+key, newToken()
	for {
		ok, err := g.rdb.SetNX(ctx, key, tok, peerTTL).Result()
		if err != nil {
			return err
		}
		if ok {
			break
		}
		t := time.NewTimer(time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("poll %s: %w (%w)", key, contend.ErrConflict, context.Cause(ctx))
		}
	}
	defer func() {
		err = errors.Join(err, pollRelease.Run(context.WithoutCancel(ctx), g.rdb, []string{key}, tok).Err())
	}()
	return fn(ctx)
}

// redsyncGuard runs fn under a go-redsync/redsync mutex on one Redis node.
type redsyncGuard struct {
	rs     *redsync.Redsync
	prefix string
}

func newRedsyncGuard(rdb *redis.Client, prefix string) *redsyncGuard {
	return &redsyncGuard{rs: redsync.New(goredis.NewPool(rdb)), prefix: prefix}
}

func (g *redsyncGuard) Do(ctx context.Context, key string, fn func(context.Context) error) (err error) {
	// redsync's defaults (32 tries, 50–250 ms apart) give up on a hot key
	// at 64 workers; these keep it waiting, with a short jittered delay like
	// the other waiting locks.
	m := g.rs.NewMutex(g.prefix+key, redsync.WithExpiry(peerTTL), redsync.WithTries(100_000),
		redsync.WithRetryDelayFunc(func(int) time.Duration { return time.Millisecond + rand.N(10*time.Millisecond) }))
	if err := m.LockContext(ctx); err != nil {
		if errors.Is(err, redsync.ErrFailed) {
			return fmt.Errorf("redsync %s: %w", key, contend.ErrConflict)
		}
		return err
	}
	defer func() {
		if _, uerr := m.UnlockContext(context.WithoutCancel(ctx)); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return fn(ctx)
}
