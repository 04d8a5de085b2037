// Package pessimistic locks first, then decides: it runs a function inside a
// transaction after locking the rows (or advisory keys) the decision depends
// on, so no other transaction, in any process, can change them between the
// read and the write.
//
// Three servers each read "1 left in stock" and each sell it: the read and
// the write are two statements, and the others' writes land between them.
// When the rule fits in one statement, package atomic is cheaper. When the
// decision reads several rows or tables (a transfer checks one balance and
// writes two; an order checks stock, a customer's limit and a coupon), lock
// them first:
//
//	BEGIN;
//	SELECT 1 FROM products WHERE id = $1 FOR NO KEY UPDATE;  -- others wait here
//	-- read, check, write: nobody else can change the row meanwhile
//	COMMIT;                                                  -- the next one goes
//
// A [Locker] does this for a configured table and key column: [Locker.Do] is
// the [contend.Guard], [Locker.LockMany] locks several rows in one stable order (so two callers
// locking the same rows cannot deadlock each other), and [Locker.Claim] takes
// free rows for work-queue style processing (SKIP LOCKED). An [Advisory]
// guard locks keys that have no row, with pg_advisory_xact_lock on a hash of
// the key computed by the server (GET_LOCK on MySQL).
//
// # Guarantee
//
// For as long as the transaction lives, the holder is alone with the locked
// rows or keys, across every process that uses the same database: others
// wait (or, by [OnHeld], give up with [contend.ErrConflict]). The lock is the
// database's, and it dies with the transaction: at commit, at rollback (on
// fn's error or panic), and when the connection dies. A crashed or killed
// holder releases it at once (its socket closes), with its uncommitted
// writes undone: nothing is left locked for a lease to run out, and a slow
// holder never loses its lock while still working (a lease can expire under
// it). The tests kill a holder's connection mid-transaction and watch the
// waiter proceed within milliseconds. One case is slower: a network that
// fails silently, closing no socket, keeps the lock until the server notices
// the connection is gone (its tcp_keepalives_* settings, or
// idle_in_transaction_session_timeout).
//
// Deadlocks (two transactions each waiting for a row the other holds) are
// detected by the server, which fails one of them (SQLSTATE 40P01); a
// serialization failure (40001) is the same under REPEATABLE READ. Where the
// locker owns the transaction it rolls back and runs the whole transaction
// again under [contend.Retry], so fn may run more than once: keep effects
// outside the database out of it, or make them idempotent. Inside a
// transaction the caller owns, the error is returned, matching
// [contend.ErrConflict], for the caller to run its transaction again.
//
// # Whose transaction
//
// Built on a pool (a [*sql.DB], sqlx's DB, or anything with BeginTx(ctx,
// *sql.TxOptions) (*sql.Tx, error), but not a single connection: see
// [NewLocker]), a locker begins, commits
// and rolls back a transaction per call, unless ctx already carries one (fn
// of another SQL guard, or of an outer call): then it joins it, so nested
// locks share one transaction and the server sees, and can break, any
// deadlock between them. Built on a caller's [*sql.Tx] (or sqlx's Tx, or a
// wrapped pgx.Tx), it only locks and runs fn there; the caller commits. Any other handle is
// refused with [contend.ErrInvalid]: a wrapper with only
// [contend.DBTX]'s methods could be either, and taken for a transaction
// its statements would run in autocommit, each lock ending with the
// statement that took it.
//
// # Time
//
// A call returns within ctx's deadline plus a grace of 250ms for a
// statement cut short plus [LockerConfig.FinishTimeout] (default 5s), whatever the
// network does, under lib/pq and pgx alike, as long as fn's own statements
// return when ctx ends (pgx's do; lib/pq's wait for the server's answer to
// its cancel request, which a silent network never brings). The COMMIT or
// ROLLBACK is waited for as long as the server takes, up to
// FinishTimeout, so on a working network a call never returns while the
// server still holds its locks. When the bound passes, the call returns an
// error matching [context.DeadlineExceeded] (after a COMMIT it may or may
// not have been applied) and abandons the connection; the server rolls back
// a transaction whose COMMIT it never got, and lets go of its locks, once
// it notices the session is gone: set idle_in_transaction_session_timeout
// and tcp_keepalives_* on the server to bound that too.
//
// A Locker and an Advisory hold nothing between calls (no goroutine, no
// connection, no prepared statement), so they have no Close: what a call
// does after its ctx ended, its ROLLBACK, is bounded by FinishTimeout.
// Their constructors do no I/O: a table that does not exist shows in the
// first call's error.
//
// # Why FOR NO KEY UPDATE
//
// The default lock, [ForNoKeyUpdate], keeps out every other writer and
// locker of the row, but not an insert elsewhere of a row that references
// it by foreign key. Plain FOR UPDATE also blocks those inserts (they take a
// FOR KEY SHARE lock on the referenced row), so locking a product would stop
// every order line for it. Use [ForUpdate] when fn deletes the row or changes
// its key.
//
// # Errors
//
// A lock that was not had is an error matching [contend.ErrConflict]: the row
// is held under NoWait or SkipLocked, or the wait outlasted
// [LockerConfig.LockTimeout], or a deadlock could not be retried. A key without a
// row is [contend.ErrNotFound], never a lost race: "no such product" is not
// "sold out". PostgreSQL reports NOWAIT and lock_timeout with one code
// (55P03), and a client's cancel and statement_timeout with another (57014),
// so they are told apart by what was sent and by checking ctx first: a wait
// that ctx ended gives an error matching both [contend.ErrConflict] (the lock
// was not had) and ctx's error, whatever the server said, as distlock's waits
// do; a statement_timeout is a backend error. The server's own error stays reachable with [errors.As].
//
// # Observing
//
// [LockerConfig.Observer] (and [AdvisoryConfig.Observer]) hears, as a
// [contend.Event] of strategy "pessimistic", every lock had, with its wait
// and attempt, and the end of its transaction, with how long it was held;
// every key found held (NoWait, SkipLocked), wait given up and retry. Without
// an Observer nothing is measured for it.
//
// # Limits
//
//   - The holder keeps a database connection for fn's whole run, and a
//     waiter at the server holds one while it waits. A Locker queues the
//     waiters of one key in the process (see [LockerConfig.NoLocalQueue]), so
//     that a hot row holds two of its pool's connections per process, not
//     all of them; waiters of other processes, of LockMany, of Claim, of an
//     [Advisory], and every waiter under a LockTimeout, wait at the server,
//     each with its connection. Size the pool, bound waits with ctx or
//     [LockerConfig.LockTimeout], or fail fast with [NoWait].
//   - fn must use the transaction it is given, never the pool: a statement
//     on the pool runs outside the transaction (committing even when the
//     transaction rolls back), and if it touches a row the transaction
//     locked, it waits for its own goroutine's lock forever. The server sees
//     two unrelated sessions, not a deadlock; once every pooled connection is
//     stuck like this, the service stops.
//   - A hot row serialises its writers: throughput is one transaction at a
//     time, each as long as fn. When one key takes more traffic than that,
//     put the rule in one statement (package atomic) or stop contending
//     (package queue). Keep fn short, and never wait for a user or a remote
//     call while holding the lock.
//   - Lock order across calls is the caller's business: LockMany orders the
//     rows of one call, but nested Lock calls take rows in the order they
//     run. The server breaks the resulting deadlocks (after its
//     deadlock_timeout, 1s by default) and the locker retries, but each costs
//     that wait.
//
// Do not use it when the rule fits in one conditional statement (package
// atomic: no lock held across round trips at all), when conflicts are rare
// and reads dominate (package optimistic: nothing is held while fn thinks),
// or when the work is outside the database and cannot be inside a
// transaction (package distlock).
//
// Statements use PostgreSQL's syntax and work with lib/pq, pgx's stdlib
// driver, and pgx's native pool, connection or transaction wrapped by
// pgxdb.Wrap, through one code path; under pgx, fn reaches the guard's
// pgx.Tx with pgxdb.Querier. [InTx] runs a plain transaction with the same
// retries, for work that needs no lock of its own, or that nests guards.
//
// # MySQL and MariaDB
//
// The [Locker] and the [Advisory] guard also run on MySQL 8 and MariaDB 10.6
// or later, on a handle wrapped by mysqldb.Wrap. Both strengths lock FOR
// UPDATE: MySQL has no weaker one. The locker begins its transactions at
// READ COMMITTED unless [LockerConfig.Isolation] says otherwise: under InnoDB's
// default, REPEATABLE READ, a plain read sees the snapshot taken at the
// transaction's first read, so a lock nested in another guard's fn, after
// that fn read anything, would let fn read its row as it was before the lock
// and write back a lost update. In a transaction of yours the isolation is
// yours: read the locked rows with a locking read, or use READ COMMITTED.
//
// [LockerConfig.LockTimeout] is innodb_lock_wait_timeout, which counts whole
// seconds: the timeout is rounded up to the next second. The setting belongs
// to the session, which outlives the transaction and goes back to the pool
// with its connection, so the locker sets it for the lock statement alone and
// puts the session's own value back right after it, in its transactions and
// in yours alike: no pooled connection keeps the locker's setting. A lock
// wait timeout (1205) is [contend.ErrConflict], as PostgreSQL's
// lock_timeout is, and so is NOWAIT's failure (1205 on MariaDB, 3572 on
// MySQL); deadlocks (1213) are retried as on PostgreSQL.
//
// The [Advisory] guard takes the server's named lock, GET_LOCK, on
// CONCAT('contend:', SHA2(key, 224)): 64 characters, MySQL's limit on names,
// whatever the key's length. The same key always gives the same name, so
// callers of one key always meet on one lock; two keys whose hashes
// collided would only wait for each other, never both get in. The name is
// computed by the server, so a program in any language using the same
// expression (on a utf8mb4 connection) excludes and is excluded by the
// guard. What differs from pg_advisory_xact_lock:
//
//   - The lock belongs to the session, not to the transaction: commit and
//     rollback leave it held, and a connection given back to the pool while
//     it holds the lock keeps it: its next user would hold the key without
//     asking, and nobody else could get it. So each call holds one
//     connection of the pool: it takes the lock there, runs fn's
//     transaction on the same connection, releases the lock once that
//     transaction has committed or rolled back (with RELEASE_ALL_LOCKS:
//     any named lock fn took on the call's connection and kept is released
//     with it), and gives the connection back only on the server's word
//     that the session holds no lock. Otherwise
//     (the connection broke, the release got no
//     answer within [AdvisoryConfig.FinishTimeout]) it closes the connection
//     instead, and the server lets go of the lock as it ends the session.
//     This gives what pg_advisory_xact_lock gives: fn's transaction commits
//     or rolls back entirely while the lock is held, and a deadlock in it
//     runs it again under the same lock.
//   - It needs a pool (a [*sql.DB] or sqlx's DB): on a transaction of yours
//     or a single connection it is refused with [contend.ErrInvalid]; calls
//     sharing one session would all hold the one lock at once. A call in
//     another guard's fn (ctx carrying its transaction) is refused too: the
//     lock could not join that transaction, and released when fn returns
//     it would not cover the transaction's commit. Take the advisory lock
//     first, and do the work in its fn.
//   - Names are one space per server, shared by every database on it
//     (PostgreSQL's advisory locks are per database).
//   - The wait ends when ctx ends: go-sql-driver/mysql closes the
//     connection, and the server ends the wait of a closed connection (on
//     MariaDB within about a second, without handing the lock to it). The
//     server's own wait is also bounded by ctx's deadline, plus a second,
//     so that a wait the network cut off ends there too.
//   - Like a row lock, the named lock dies with its session: a crashed
//     holder releases it at once. A network that fails silently keeps it
//     until the server ends the session: MariaDB's idle_transaction_timeout
//     while fn's transaction is open, wait_timeout otherwise.
package pessimistic
