// Package contend keeps "read, check, write" on shared state correct when a
// service runs as many instances against one PostgreSQL or Redis.
//
// Two requests arrive almost together: a double-clicked "start bot" spawns two
// trading engines; three servers each see "1 left in stock" and all three sell
// it. A [sync.Mutex] cannot stop this, because the servers do not share memory.
// Every fix coordinates at a point all instances share, the database or Redis,
// and they differ in whether and how they lock. contend offers them as small
// packages (atomic, pessimistic, optimistic, adaptive, distlock, queue) behind
// one contract, [Guard], so a call site can move from one to another as
// traffic changes.
//
// # Which strategy
//
// Ask first whether a lock is needed at all:
//
//   - Does the rule fit in one row ("stock ≥ 1", "engine id is empty")? Use
//     one conditional UPDATE and read the affected-row count: package atomic.
//     The database orders the writers; nothing is locked, nothing can leak.
//     Most cases end here: stock, counters, balances, "start once".
//   - Does the decision read several rows or tables? Lock them first and
//     decide inside a transaction (SELECT ... FOR UPDATE) when conflicts are
//     frequent: package pessimistic. Read freely and let a version column
//     detect a conflicting write when conflicts are rare: package optimistic,
//     which retries the loser. Frequent conflicts make optimistic retries cost
//     more than waiting for a lock; rare ones make the lock pure overhead.
//   - Is the work outside the database (a cron job that must run on one
//     instance, an external API that must not be called twice)? Use a Redis
//     lease with an owner token and fencing: package distlock. It is the most
//     delicate of them; use it only when the database cannot hold the rule.
//   - Does one hot key take more traffic than a lock on it can serve? Stop
//     contending: send every job of a key to one partition consumed by one
//     worker, in order, and batch them: package queue. The price is eventual
//     consistency, unless the caller waits for the result.
//
// # The guards
//
// Every strategy package offers a [Guard] beside its own, more direct API.
// They differ as follows.
//
//	guard                 waits or fails fast        fn may run twice    holds across processes  when the holder dies
//	atomic.Claimer        fails fast                 no                  yes (a row)             claim stays; with a lease column it expires
//	pessimistic.Locker    waits, or NOWAIT fails     on deadlock retry   yes (a row lock)        lock ends with its connection, at once
//	pessimistic.Advisory  waits, or try fails        on deadlock retry   yes (an advisory lock)  lock ends with its connection, at once
//	optimistic.Guard      takes no lock, retries     yes (losers rerun)  yes (a version)         nothing is held
//	adaptive.Guard        retries, or waits          yes (losers rerun)  yes (a version)         a lock ends with its connection
//	distlock              fails fast or waits        no                  yes (a Redis lease)     lease expires after its TTL
//	queue.Queue           queues (backpressure)      no                  no, one process only    jobs die with the process
//	queue/redisq          queues in a Redis stream   at least once       yes (a partition lease) lease expires, another instance redelivers
//
// Each guard says so in code too: its Promises method returns the
// [Promises] above as values, and [Promises.Check] names what a switch from
// one guard to another would lose, so a call site (or its test) can check
// the guard it was given.
//
// The optimistic guard takes no lock before fn, but its final version check
// still waits briefly for a concurrent attempt that is committing the same row.
//
// Lock-based guards (the claimer, pessimistic, distlock, the in-memory queue)
// keep fn exclusive: no two fns for one key overlap. The optimistic guard lets
// fns overlap and commits one per version, running the losers again, so its
// promise covers what fn does through the guard's transaction only.
//
// SQL guards that run fn inside a transaction hand it over through the
// context: fn calls [Querier] to get the guard's transaction, or its own db
// outside one, so one fn body works under every guard.
//
// # Drivers
//
// The SQL strategies take a [DB]: a database/sql handle (lib/pq, pgx's
// stdlib driver, sqlx), or a pgx handle (*pgxpool.Pool, pgx.Tx) wrapped by
// pgxdb.Wrap. Both run the same statements through one code
// path. Under a pgx handle fn reaches the guard's pgx.Tx with
// pgxdb.Querier, the twin of [Querier]. This module links no driver its
// user did not import: only package pgxdb imports pgx, and no library
// package imports lib/pq.
//
// # Nesting
//
// The SQL guards (atomic.Claimer, pessimistic.Locker and Advisory,
// optimistic.Guard and Store) nest the same way. A guard built on a pool
// that is called inside another SQL guard's fn joins that guard's
// transaction, found in ctx: a row lock, a claim and a version check inside
// a lock's fn are all statements of the one transaction. It never takes a
// connection of its own there, which would wait for a row its own goroutine
// locked: two sessions waiting on each other, invisible to the server's
// deadlock detector, until ctx ends. Locks taken by nested guards are held
// until the outer transaction ends.
//
// Inside a transaction it does not own, a guard runs once and never
// retries: a lost race, a deadlock or a serialization failure is returned
// (matching [ErrConflict], or as the server's error) for the owner of the
// transaction to run it again from the start, since an aborted transaction
// cannot go on and sleeping between retries would hold the owner's locks.
// The outermost guard that owns the transaction retries what it would retry
// on its own. A guard built on a caller's *sql.Tx behaves the same way.
//
// Which handle means which is decided from its type, never guessed: a
// *sql.DB, sqlx's DB, or anything with BeginTx(ctx, *sql.TxOptions)
// (*sql.Tx, error) is a pool on which the guard begins its own
// transactions; a *sql.Tx or sqlx's Tx is a transaction the caller owns.
// Wrapped pgx handles likewise: a *pgxpool.Pool is a pool, a pgx.Tx the
// caller's transaction. Anything else (a wrapper with only [DBTX]'s
// methods, which could be either) is refused with [ErrInvalid] at
// construction, as are nil and typed nil handles.
//
// A single connection (a *sql.Conn or sqlx's Conn, a *pgx.Conn or
// *pgxpool.Conn wrapped by pgxdb.Wrap) is one server session, not a pool:
// two calls on it would begin their transactions on one session, where a
// row lock keeps nobody out and one call's BEGIN or COMMIT is the other's.
// Guards refuse one with [ErrInvalid]; pass the pool it came from. A
// wrapper of the caller's around a connection does not say what it holds,
// and is taken for a pool.
//
// A guard refuses, with [ErrInvalid], to nest in a transaction it cannot
// join: one of another driver, or one a guard began on another database
// (another *sql.DB or *pgxpool.Pool than the nested guard's). A
// transaction the caller put in ctx ([WithQuerier], pgxdb.WithQuerier), and
// a guard built on a wrapper of the caller's, do not say which database
// they belong to: there the inner guard joins whatever transaction it
// finds, so guards on different databases must not be nested.
//
// # A transaction the server rolled back
//
// The server may end a guard's transaction on its own: MySQL and MariaDB
// roll the whole of it back for a deadlock victim (and for a lock wait
// timeout with innodb_rollback_on_timeout), and PostgreSQL aborts it on any
// error. A nested guard then answers its own lost race as usual, matching
// [ErrConflict], but the transaction stays dead: every later statement
// through [Querier] fails with an error that says so (PostgreSQL refuses
// them itself), and the guard that owns the transaction never commits it
// and never answers nil for it. It runs fn again when the cause is one it
// retries (a deadlock is), or returns the error. A caller that took the
// nested ErrConflict for a busy key and went on writing therefore loses
// nothing silently. On MySQL, the guards' transaction that fn's ctx
// carries is watched; a *sql.Tx of the caller's is rolled back by the guard
// that finds it dead, so that its Commit fails too. On MySQL 8, which has
// no @@in_transaction, only a deadlock is recognised this way.
//
// # Errors
//
// Do returns fn's error unchanged; [ErrConflict] (wrapped with the key) when the
// race was lost; [ErrNotFound] when the key has no row; [ErrLockLost] when a
// hold ended before fn returned; [ErrInvalid] for bad input; ctx's error when
// the caller gave up; or the backend's error, which stays reachable with
// [errors.As]. Match them with [errors.Is].
//
// # Observing
//
// Every strategy reports what it does (obtained, conflict, retry, gave up,
// released, lost, failed) through one [Observer] set in its config, as one
// [Event] shape: key, strategy, wait and hold times, attempts, fencing
// token, error. [SlogObserver] logs them; the OpenTelemetry adapter (metrics
// and a span per guarded call) is package otelcontend, in module
// github.com/contend/contend/otelcontend, a module of its own so that
// OpenTelemetry stays out of this module's dependencies. With no Observer
// set, nothing is built and no clock is read.
//
// # Retries
//
// [Retry] is the one retry policy of the module (attempts, exponential
// backoff with full jitter, honouring ctx): optimistic retries, deadlock
// retries and lock waits all use it.
//
// # Testing code that uses a guard
//
// Package contendtest scripts a guard's outcomes (a lost race, a lost lock,
// a slow wait, ctx's end), so a test can check how its caller answers each,
// and releases a function from many goroutines at once, to check the
// caller's own invariant under contention.
//
// # Compatibility
//
// Until v1.0.0, a minor version (v0.2.0 after v0.1.x) may break callers; a
// patch version does not. Every breaking change is listed in the repository's
// CHANGELOG.md with what replaces it. The promises a guard states (see
// [Promises]) count as API: weakening one is a breaking change.
package contend
