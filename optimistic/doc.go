// Package optimistic keeps "read, decide, write" correct without locking:
// every write checks that the row's version is still the one read, and a
// writer that lost the race reads again and retries.
//
// Two requests read an account with balance 100, each withdraws 80, and both
// write back 20: one withdrawal is lost, and 160 left an account that had 100.
// Locking the row for the whole read-decide-write (package pessimistic)
// prevents it at the price of making every other writer wait its turn. This
// package lets everyone read freely and detects the conflict at the write
// instead:
//
//	UPDATE accounts SET balance = $3, version = version + 1
//	WHERE id = $1 AND version = $2
//
// Of writers that read the same version, the database lets exactly one
// through: the others match no row, because the first bumped the version, and
// they start over from a fresh read. [Store] does this for a struct type
// mapped to a table ([Store.Update]: read, let fn change the value, write,
// retry), plus compare-and-set on a value read in an earlier request
// ([Store.Save], [Store.Delete]) and a force-increment for a row a decision
// depended on but did not change ([Store.Touch]). [Guard] is the
// [contend.Guard]: fn runs in a transaction that commits only if the key's
// version did not move.
//
// # Guarantee
//
// No update written through a Store or a Guard is lost, however many
// goroutines and processes write: a write based on a stale read never
// commits. The promise covers writers that check and bump the version: a
// plain UPDATE elsewhere that leaves the version alone is invisible to it.
// Nothing is held, so nothing is left behind by a crash: a writer that dies
// mid-way simply never writes. The Guard's fns for one key overlap (it is not
// a lock), and a loser's fn runs again: only what fn does through the guard's
// transaction ([contend.Querier]) is undone and retried, not its other side
// effects. Store.Update's fn may run several times too, but it only changes
// the value it is given.
//
// [Config.Observer] hears, as a [contend.Event] of strategy "optimistic",
// every attempt lost and retried and how each Update and Do ended, with its
// attempts and the time its last attempt took, so callers can see how
// contended their keys are and tune [Config.Retry].
//
// # Transactions and time
//
// A Guard built on a pool begins a transaction per attempt, unless ctx
// carries one (fn of another SQL guard): then it joins it, as it does on a
// caller's [*sql.Tx]. Inside a transaction it does not own, a Guard and
// [Store.Update] make one attempt and return a lost race at once, for the
// transaction's owner to run it again: a retry there would sleep while
// holding the owner's locks. A handle that is neither a known pool nor a
// known transaction is refused with [contend.ErrInvalid].
//
// A call returns within ctx's deadline plus 250ms for a statement of the
// package's that ctx cut short, plus, for a Guard, [Config.FinishTimeout]
// for its COMMIT or ROLLBACK: under both drivers, also when the network
// goes silent, as long as fn's own statements return when ctx ends (lib/pq
// waits for the server's answer to its cancel request, which a silent
// network never brings). A commit given up on returns an error matching
// [context.DeadlineExceeded]: it may or may not have been applied.
//
// A Store and a Guard hold nothing between calls (no goroutine, no
// connection, no prepared statement), so they have no Close: what a
// Guard's call does after its ctx ended, its ROLLBACK, is bounded by
// [Config.FinishTimeout]. Their constructors do no I/O: a table that does
// not exist shows in the first call's error.
//
// # Limits
//
// Retries are the price, and they grow with contention: of n writers that
// read one version, one wins and n-1 go again. On a hot key the losers spend
// their time reading, writing nothing and backing off, and with a small retry
// budget callers see [contend.ErrConflict]. The benchmarks measure it: with 64
// workers on one row, each Store.Update took about 3 attempts and 5 times as
// long as on 1000 rows, and each Guard.Do (whose transaction holds the rows fn
// wrote until the version check) about 3.5 attempts and 10 times as long.
// Switch when conflicts are the rule rather than the exception:
//
//   - the rule fits in one statement (a counter, "stock ≥ 1"): package
//     atomic, one conditional UPDATE, no read, no retry;
//   - the decision needs several rows and conflicts are frequent: package
//     pessimistic, which locks the rows and makes writers wait their turn
//     instead of redoing their work;
//   - one key takes more writes than any of these can serve: package queue.
//
// Do not use it either when the decision has effects that cannot be undone or
// repeated (charge a card, send a message) inside the retried part, when
// writers outside the package update the same rows without bumping the
// version, or when a read-only decision over many rows must be consistent
// (touch each row it depended on, or use a REPEATABLE READ transaction).
//
// Statements work with lib/pq, pgx's stdlib driver, and pgx's native pool,
// connection or transaction wrapped by pgxdb.Wrap, through one code path;
// under pgx, fn reaches the guard's pgx.Tx with pgxdb.Querier. They are sent
// as text, not prepared: pgx caches their preparation per connection by
// itself, while lib/pq spends a round trip preparing each one unless
// binary_parameters=yes is set.
//
// # MySQL and MariaDB
//
// A Store and a Guard run on MySQL 8 and MariaDB through
// go-sql-driver/mysql, on a pool wrapped by mysqldb.Wrap (whose DSN sets
// clientFoundRows, which it checks), with the same guarantee and through the
// same code path: names are quoted with backquotes, parameters are ?, and fn
// reaches the guard's transaction with [contend.Querier]. What differs:
//
//   - A Guard begins its transactions at READ COMMITTED unless
//     [Config.Isolation] says otherwise. Its own check holds at InnoDB's
//     default, REPEATABLE READ, too, since an UPDATE reads the latest
//     committed row, not the transaction's snapshot; but there a row lock
//     taken in fn (package pessimistic's, which joins the guard's
//     transaction) would let fn read the locked row as it was at the guard's
//     first read and write back a lost update. Store.Update runs no
//     transaction of its own: each statement reads the latest commit.
//   - Deadlocks (1213) run the attempt again, as on PostgreSQL, and so do
//     lock wait timeouts (1205: innodb_lock_wait_timeout, and MariaDB's
//     NOWAIT), where the package owns the attempt.
//   - [Store.Insert] is a plain INSERT: a duplicate key fails the statement,
//     not the transaction, and counts as [contend.ErrConflict] only when the
//     row it ran into is key's (another unique index's is the server's
//     error).
//   - No statement returns values (MySQL has no UPDATE ... RETURNING): the
//     version a write leaves is the one it checked, plus one.
//
// Tested on MariaDB 10.11: the Guard conformance suite, faults included, at
// READ COMMITTED; the read-pause-write of a counter from three processes,
// through a Guard at REPEATABLE READ and under a row lock nested in a
// Guard's fn, each beside a control that loses updates; Store.Update from
// three processes; deadlocks and lock wait timeouts. MySQL 8 is supported by
// design, not by test: the statements are common to both, MySQL 8 has
// InnoDB's isolation semantics, and its NOWAIT error (3572) is not retried.
package optimistic
