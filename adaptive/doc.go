// Package adaptive runs fn for a key optimistically while the key's races are
// rare and under its row lock while they are frequent, choosing per key from
// the conflicts it measures.
//
// Traffic does not keep to the guess made when the code was written: a key
// that is cold all day is hot during a sale. On a cold key the optimistic
// guard (package optimistic) holds nothing while fn runs and serves more
// writers than a row lock; on a hot key most of its attempts lose, and the
// losers' retries cost more than the wait for a lock (package pessimistic)
// would have. A [Guard] starts every key optimistic, moves a key under the
// lock when a fifth of its recent calls lose a race, and moves it back when
// a twentieth do.
//
// # Guarantee
//
// The optimistic guard's: no update fn writes through the guard's transaction
// ([contend.Querier], or pgxdb.Querier under pgx) is lost, across goroutines
// and processes, whichever mode each call runs in. Each process decides from
// what it sees itself, with no coordination, so one key may be optimistic in
// one process and locked in another at the same moment; that is safe (below).
// fns for one key may overlap (a call in optimistic mode takes no lock), and
// fn may run more than once per Do (a lost race, a deadlock): keep effects
// outside the transaction out of fn, or make them idempotent. Every writer of
// the state a key stands for must go through a Guard of this package, an
// optimistic Guard or Store, or otherwise bump the version column.
//
// # Why mixing the modes is safe
//
// Each mode keeps the invariant by itself: the optimistic path commits fn's
// writes only together with a version check that no other write for the key
// committed since its read (UPDATE ... SET version = version + 1 WHERE key =
// $1 AND version = $2), and the locked path makes writers of the key take
// turns. Mixed on one key, a locked writer would be invisible to an optimistic
// one if it left the version alone: the optimistic writer reads, the locked
// one commits its change, and the optimistic check still finds the version it
// read and commits a write based on a stale read. So the locked path takes its
// lock by moving the version (UPDATE ... SET version = version + 1 WHERE key =
// $1), in the transaction fn writes in: the bump commits exactly when fn's
// writes do. An optimistic writer whose read came before that commit then
// fails its check, either at once or after waiting for the lock, since
// PostgreSQL re-evaluates the check against the row as committed; and one
// whose read came after it saw the locked writer's writes. Conversely a
// locked writer's statements run after its lock, which waits for any
// optimistic writer that has reached the row, so they read what that writer
// committed. The tests run both modes on one key at once, and show that
// without the bump updates are lost.
//
// # How it decides
//
// Per key, a process keeps a conflict rate: an exponentially weighted average
// over about the last 32 samples. In optimistic mode each attempt is a
// sample, a conflict if it lost its race (its version moved, or it hit a
// deadlock). In locked mode each call is one, a conflict if it came behind
// another call of its process in the key's queue, or else (a caller of
// another process ahead of it, or no queue) waited for the lock more than
// twice as long as it then held it: the race it would have lost without
// the lock. So a key with two or three callers of one process at once
// measures alike in both modes. A key goes locked when the rate reaches 0.2
// and back when it falls to 0.05, and once it has moved stays at least half
// a window in its new mode before it moves again: the gap between the
// thresholds and that stay keep a key whose rate hovers near one of them
// from flapping. A key new to the Guard moves as soon as its rate reaches
// 0.2, its rate being the plain mean of its samples until it has 32: at its
// first lost race, unless more than four wins came before it. These are
// fixed, not settings. A call whose key went under the lock while it
// waited for a connection, or while it retried, goes on locked.
// [Guard.Mode] says what a key's next call will do.
//
// Memory is bounded: the rates live in a fixed table of [Config.Keys] slots,
// in pairs found by a hash of the key. A key whose pair is full takes the
// slot of a key that is optimistic rather than a locked one's, and of two
// alike the one used less recently; the key it displaced starts over,
// optimistic, when it comes back. So a hot key keeps its place against the
// cold keys that share its pair, and loses it only while the other slot of
// its pair holds a locked key too, used more recently.
//
// # Limits
//
// The table is per Guard and per process: a process that sees few calls on a
// key learns slowly that the key is hot, while its optimistic attempts lose to
// the other processes' locked ones. A key in locked mode has its waiters
// of one process queue in that process, as package pessimistic's do, and
// two of them hold a connection: the holder and the next. A burst shorter
// than a window is served in the mode the key was in. Transactions the Guard
// does not own (a caller's *sql.Tx, another guard's fn) run once, and a lost
// race in them returns [contend.ErrConflict] for their owner to retry.
//
// # When to choose it
//
// Choose it over package optimistic's guard when fn must not hold a row
// lock while keys are cold, and a key that turns hot must not retry
// without end: on a cold key it is that guard, and on a hot key its
// waiters queue for the lock instead of running fn again and again, each
// rerun holding a pooled connection for as long as fn takes.
//
// Choose package pessimistic's Locker instead when holding the row lock
// while fn runs is acceptable, whatever the key's heat: neither of this
// guard's modes sends less than the Locker does. On a cold key,
// optimistic mode sends one statement more than a lock nobody waits for
// (it reads the version, then checks and bumps it, where the Locker only
// takes the lock); on a hot key, locked mode is that lock with the version
// moved as well, a second row version per transaction that the Locker does
// not write. Nor can choosing per key serve more calls than the Locker where
// one hot key takes a share of every caller's calls: its row lock serves one
// call per hold whichever guard took it, and the callers wait there, so the
// total follows the hot key's turns and the cold keys' mode changes only
// their latency. In this module's benchmark suite (go run ./examples/bench:
// fn waiting 2 ms between its read and its write, 64 workers per process,
// each process on a pool of 10 connections, 2 cores), with 30% of the calls
// on one hot key and the rest on 1000 cold ones, this guard served 1.00× the
// calls of the better fixed guard (the Locker) from one process and 0.99×
// from three, with a cold p99 1.0× the Locker's from one process and 1.6×
// from three; on keys that turn hot halfway, 0.92×. A reference that knows
// the hot key in advance and runs it under the Locker, the others
// optimistic, served 1.02×, 0.96× and 0.94× in the same runs, with a cold
// p99 of 1.0× and 1.55× the Locker's: a choice per key gains nothing there,
// and what this guard loses on top is the time it takes to learn that a key
// turned hot (11–20 ms in one process, 50–115 ms in the slowest of three),
// while that key's calls retry holding pooled connections.
// BenchmarkDecrement and BenchmarkThink set this guard beside both fixed
// guards, and BenchmarkDecrement its locked path beside raw-bump, the same
// transaction written by hand (bump, read, write, commit).
//
// What this guard spares its callers on cold keys is the row lock held
// while fn runs: a fn that calls another service holds the row that long,
// and under a lock every other writer of it, in any process, waits that
// long, a caller in another process holding a connection as it waits.
//
// Statements work with lib/pq, pgx's stdlib driver and pgx's native pool
// wrapped by pgxdb.Wrap, and with MySQL 8 and MariaDB through
// go-sql-driver/mysql on a pool wrapped by mysqldb.Wrap. There the
// optimistic path is package optimistic's (see its doc for what differs),
// and the locked path's UPDATE reads the latest committed row as
// PostgreSQL's does; both begin their transactions at READ COMMITTED, so
// that a row lock taken in fn reads its row's latest commit rather than
// the snapshot of InnoDB's default REPEATABLE READ. Tested on MariaDB 10.11
// (the conformance suite adapting and locked, both modes racing on one key
// from three processes beside a control that locks without the bump, and a
// lock nested in the locked path beside a REPEATABLE READ control); MySQL 8
// by design, not by test.
package adaptive
