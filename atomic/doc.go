// Package atomic makes "read, check, write" on one row a single conditional
// statement, so the database decides the race and no lock is ever taken.
//
// Three servers each see "1 left in stock" and each sell it: the read and the
// write are two steps, and the others' writes land between them. Put the check
// into the write instead,
//
//	UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1
//
// and the row's own write lock orders the statements: each one re-checks the
// condition against the row as the previous one left it, so the stock never
// goes negative, whatever the number of servers. The affected-row count says
// who won. [Update] runs such a statement and reports whether it applied.
//
// The same trick claims work: "fill the owner column where it is empty" lets
// exactly one of any number of concurrent "start" requests through. A
// [Claimer] does that with an owner token made before the claim, and releases
// only with that token, so a late release never clears a newer claim. It is a
// [contend.Guard].
//
// The claims of a key that keep losing, made by one Claimer at once, share
// one statement, one in flight at a time, each taking only the answer of a
// statement that began after it did: the others sleep, holding no
// connection, for at most the statement in flight and their own, never past
// their ctx. On PostgreSQL it is the claim itself: one of them wins or all
// lose, as if each had sent it, for one statement instead of many. On MySQL
// and MariaDB, where a losing UPDATE locks the row, it is a plain read. Keys
// claimed one at a time keep their single statement.
//
// Limits: the rule must fit in one row (or one statement). A decision that
// reads several rows or tables needs a transaction (package pessimistic or
// optimistic); work outside the database needs a lease (package distlock). A
// claim, unlike a lock, is not undone by time: if its release is lost, it stays
// until a lease column lets it expire (see [ClaimerConfig.LeaseColumn]).
//
// Inside a transaction (fn of a SQL guard, found in ctx), a Claimer's
// statements join it, so a claim nested in a row lock's fn never waits for
// a lock of its own goroutine. A call returns within ctx's deadline plus
// 250ms for a statement ctx cut short (plus [ClaimerConfig.FinishTimeout] for
// the release [Claimer.Do] makes after fn, and 5s for the rollback of a
// transaction [UpdateSelect] began, which it waits for only when its
// statements were answered: one given up on is rolled back in the
// background, on a connection the pool then closes), under both drivers, also when
// the network goes silent; a statement given up on may still have been
// applied; [UpdateReturning] and [UpdateSelect] write nothing into the
// caller's variables once they have returned.
//
// [NewClaimer] does no I/O: a Claimer prepares its statements at its first
// call, under that call's ctx, and owns them, and the goroutines that
// release claims whose outcome was unknown, until [Claimer.Close]. [Update]
// and its kin hold nothing.
//
// [ClaimerConfig.Observer] hears, as a [contend.Event] of strategy "atomic",
// every claim made (with how long it took) or found held, and the end of
// every claim, released or lost, with how long it was held; [Update] has no
// configuration and reports nothing.
//
// Statements use PostgreSQL's $n placeholders and work with lib/pq, pgx's
// stdlib driver, and pgx's native pool, connection or transaction wrapped by
// pgxdb.Wrap, through one code path.
//
// On MySQL and MariaDB (a handle wrapped by mysqldb.Wrap) the Claimer runs
// MySQL's statements and [Update] runs yours, written with ? placeholders.
// The Claimer's lease column is a DATETIME(6) holding UTC, compared with the
// server's UTC_TIMESTAMP(6). MySQL has no UPDATE ... RETURNING: use
// [UpdateSelect].
package atomic
