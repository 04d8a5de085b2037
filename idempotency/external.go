package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/txn"
)

// errLeaseEnded is the cause of an external fn's ctx when its lease ends.
var errLeaseEnded = fmt.Errorf("idempotency: the lease ended: %w", contend.ErrLockLost)

// Polling for an external call in flight: from the first wait to the
// longest.
const (
	pollFirst = 10 * time.Millisecond
	pollMax   = 500 * time.Millisecond
)

// DoExternal is [Store.Do] for an fn whose effect is outside the database
// (a payment provider, an email). It takes the key first, in a short
// transaction of its own, under a lease of [Config.Lease] and a fencing
// token, fence, that grows with every call that takes the key; then it
// runs fn outside any transaction, and records fn's answer only if the
// token still holds.
//
// What it promises: while the lease holds, no other call runs fn for the
// key; a call that finds the key in flight waits (polling, bounded by its
// ctx) and replays the answer, or returns [ErrInFlight] under NoWait. fn's
// ctx ends when the lease does (its cause matches [contend.ErrLockLost]);
// once it has, another call may take the key, with a larger fence, and an
// answer of the first call's that comes later is refused: DoExternal then
// returns fn's answer with an error matching [ErrFenced]. A call that
// crashed holds its key until its lease ends.
//
// What it cannot promise: that fn's effect happened once. A call that
// crashed or stalled after its external call and before the record leaves
// the effect done and unrecorded, and the next call after the lease runs fn
// again. Pass the fence (or the key) to the external service, so that it
// refuses a stale or repeated request, and the effect is once.
//
// fn's errors: one marked [Transient] releases the key at once, so that a
// retry runs fn again; one that comes with fn's ctx ended (the caller's
// ctx, or the lease) leaves the key to its lease, since the effect may
// have happened; any other is final, recorded and replayed, as in Do. The
// record and the release run after ctx ended too, bounded by
// [Config.FinishTimeout], so that an effect that happened is not left
// unrecorded for want of a ctx.
//
// A panic in fn propagates and, like a crash, leaves the key taken until
// its lease ends.
//
// DoExternal commits transactions of its own: db must be a pool, and ctx
// must not carry a transaction; both give an error matching
// [contend.ErrInvalid].
func (s *Store) DoExternal(ctx context.Context, key, fingerprint string, fn func(ctx context.Context, fence int64) ([]byte, error)) (answer []byte, replayed bool, err error) {
	if err := checkArgs("do external", key, fn == nil); err != nil {
		return nil, false, err
	}
	h, err := txn.Resolve(ctx, s.db)
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: do external %q: %w", key, err)
	}
	if !h.Owned() {
		return nil, false, fmt.Errorf("idempotency: do external %q: a transaction of the caller's (db is one, or ctx carries one): "+
			"the key must be taken in a transaction that commits before fn runs: %w", key, contend.ErrInvalid)
	}
	rep := s.newReport(key)
	fence, began, err := s.takeExternal(ctx, rep, key, fingerprint)
	if err != nil || fence == 0 {
		return fenceAnswer(err)
	}
	if rep != nil {
		rep.fence = fence
	}
	fctx, cancel := context.WithDeadlineCause(ctx, began.Add(s.lease), errLeaseEnded)
	answer, ferr := fn(fctx, fence)
	ended := context.Cause(fctx)
	cancel()

	bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.FinishTimeout)
	defer bcancel()
	state := int64(stateDone)
	if ferr != nil {
		switch {
		case marked(ferr):
			if _, err := exec(bctx, s.db, s.releaseSQL, key, fence); err != nil {
				ferr = errors.Join(ferr, fmt.Errorf("idempotency: do external %q: release the key (it stays taken until its lease ends): %w", key, err))
			}
			rep.ended(ctx, ferr)
			return nil, false, ferr
		case ended != nil:
			ferr = fmt.Errorf("idempotency: do external %q: fn's ctx ended (%w), the key stays taken until its lease ends: %w", key, ended, ferr)
			rep.ended(ctx, ferr)
			return nil, false, ferr
		}
		state, answer = stateFailed, []byte(ferr.Error())
	}
	n, err := exec(bctx, s.db, s.fencedSQL, state, answer, micros(s.retention), key, fence)
	if err != nil {
		err = fmt.Errorf("idempotency: do external %q: record the answer (it may or may not be recorded): %w", key, err)
		rep.ended(ctx, err)
		return answer, false, err
	}
	if n != 1 {
		err = fmt.Errorf("idempotency: do external %q: fence %d: %w", key, fence, ErrFenced)
		rep.ended(ctx, err)
		return answer, false, err
	}
	if ferr != nil {
		rep.released(ctx, ferr)
		return nil, false, &failedError{msg: ferr.Error(), err: ferr}
	}
	rep.released(ctx, nil)
	return answer, false, nil
}

// fenceAnswer is DoExternal's return when the key was not taken: err
// carries the answer of a record found (see errAnswer), or is the call's
// error.
func fenceAnswer(err error) ([]byte, bool, error) {
	var a *errAnswer
	if errors.As(err, &a) {
		return a.answer, a.replayed, a.err
	}
	return nil, false, err
}

// errAnswer carries, out of takeExternal, the answer of a live record.
type errAnswer struct {
	answer   []byte
	replayed bool
	err      error
}

func (e *errAnswer) Error() string { return "idempotency: answered from the record" }

// takeExternal takes key for an external call: in a transaction of its
// own, committed before fn runs. It returns the fence and when the take
// began, which the lease counts from on this side (the server counts from
// later: the lease never ends here after it ended there). A live record of
// a call in flight is polled until it is answered or its lease ends; any
// other live record answers the call, through an *errAnswer.
func (s *Store) takeExternal(ctx context.Context, rep *report, key, fingerprint string) (fence int64, began time.Time, err error) {
	wait := pollFirst
	for {
		rec, found, err := read(ctx, s.db, s.lookupSQL, key)
		if err != nil {
			err = fmt.Errorf("idempotency: do external %q: read the record: %w", key, err)
			rep.failed(ctx, err)
			return 0, time.Time{}, err
		}
		if !found || rec.live == 0 {
			began = time.Now()
			_, err = txn.RunTx(ctx, s.db, s.opts, func(ctx context.Context, tx sqldb.Tx) error {
				fence, rec = 0, nil
				var err error
				if rec, err = s.take(ctx, tx, key, fingerprint, s.lease); err != nil {
					return err
				}
				return scanRow(ctx, tx, s.fenceSQL, []any{key}, &fence)
			})
			switch {
			case err == nil:
				rep.obtained(ctx, fence)
				return fence, began, nil
			case !errors.Is(err, errNotTaken) || rec == nil:
				if !errors.Is(err, ErrInFlight) && context.Cause(ctx) == nil {
					err = fmt.Errorf("idempotency: do external %q: take the key: %w", key, err)
				}
				rep.ended(ctx, err)
				return 0, time.Time{}, err
			}
		}
		if rec.fingerprint != fingerprint || rec.state != stateInFlight || s.noWait {
			a, replayed, err := s.answerOf(key, fingerprint, rec)
			rep.answered(ctx, replayed, err)
			return 0, time.Time{}, &errAnswer{a, replayed, err}
		}
		// In flight under another call's lease: wait for its answer, or
		// for its lease to end.
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			err := fmt.Errorf("idempotency: do external %q: waited for the call in flight until ctx ended: %w (%w)", key, ErrInFlight, context.Cause(ctx))
			rep.ended(ctx, err)
			return 0, time.Time{}, err
		case <-t.C:
		}
		wait = min(2*wait, pollMax)
	}
}
