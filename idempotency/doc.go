// Package idempotency makes a retried request have its effect once and get
// the first call's answer: the client that timed out and retries, the user
// who presses "pay" twice, the job delivered twice. A lock or a claim keeps
// two copies of a call from running at once; a [Store] also keeps the retry
// from running again after the first finished, and hands it the first
// call's answer.
//
// Every call names a key (the request's Idempotency-Key, a job's id) and a
// fingerprint of the request (a hash of its payload): a key reused for
// another request gets [ErrMismatch], and nothing runs.
//
// # Two modes
//
// [Store.Do] is for effects in the database. fn runs in a transaction,
// reaches it with [contend.Querier] (pgxdb.Querier on pgx), and the key's
// record, with fn's answer, commits in that same transaction: a crash
// anywhere leaves both fn's writes and "this key is done", or neither. A
// duplicate in flight, in any process, waits on the key's unique index for
// the first transaction to end, then replays the committed answer, or runs
// fn itself if the first rolled back.
//
// [Store.DoExternal] is for effects outside the database (a payment
// provider, an email). The key is taken first, in a short transaction of
// its own, under a lease ([Config.Lease]) and a fencing token that fn
// receives; fn runs outside any transaction; its answer is recorded only if
// the token still holds. What each mode promises:
//
//	                             Do (local)                 DoExternal
//	fn's effect                  exactly once per key       at most once while the lease holds
//	crash before the commit      nothing happened; a retry  the key is held until its lease
//	                             runs fn                    ends; then a retry runs fn again,
//	                                                        and the effect may happen twice
//	duplicate in flight          waits, then replays        waits (polls), then replays
//	stalled past its lease       -                          fn's ctx ends; its late answer is
//	                                                        refused (ErrFenced)
//	answer stored with effect    same transaction           after the effect, fenced
//
// DoExternal cannot know whether an external call that crashed or stalled
// had its effect: that is the service's to say. Pass it the fence (or the
// key) so that it can refuse a stale or repeated request, and the effect is
// once; without that, the promise is at most once while the lease holds.
//
// # Errors
//
// fn's errors are final unless marked with [Transient]: the IETF
// Idempotency-Key draft has a retry get "the result of the previously
// completed operation, success or an error". A final error's writes roll
// back and its message is stored and replayed ([ErrFailed]); a transient
// one stores nothing, and a retry runs fn again. See [Store.Do] for the
// errors that are transient without a mark.
//
// # The table
//
// The table is the caller's to create. With the default names, on
// PostgreSQL:
//
//	CREATE TABLE idempotency_keys (
//		id          text PRIMARY KEY,
//		fingerprint text NOT NULL,
//		state       smallint NOT NULL,
//		answer      bytea,
//		fence       bigint NOT NULL,
//		expires_at  timestamptz NOT NULL
//	);
//	CREATE INDEX ON idempotency_keys (expires_at);
//
// On MySQL and MariaDB:
//
//	CREATE TABLE idempotency_keys (
//		id          VARCHAR(255) PRIMARY KEY,
//		fingerprint VARCHAR(255) NOT NULL,
//		state       SMALLINT NOT NULL,
//		answer      LONGBLOB,
//		fence       BIGINT NOT NULL,
//		expires_at  DATETIME(6) NOT NULL,
//		INDEX (expires_at)
//	);
//
// Records expire after [Config.Retention] (24h by default), on the
// server's clock; [Store.Expire] removes expired records in short batches.
//
// # Cleanup bounds
//
// A Store holds nothing between calls and has no Close. A rollback after
// ctx ended, and every COMMIT, is bounded by [Config.FinishTimeout].
package idempotency
