// Package distlock keeps work outside the database exclusive across
// processes with a Redis lease: a cron job that must run on one instance,
// an external API that must not be called twice for one order.
//
// A lock is the key set to a random token with an expiry,
//
//	SET key token NX PX ttl
//
// and is released and refreshed by Lua scripts that act only while the
// stored token is exactly the caller's, so a holder whose lease ran out can
// never delete or extend the next holder's lock. [Client.Do] obtains a lock,
// refreshes it while fn runs, and releases it on every path; [Client.Obtain],
// [Client.TryObtain] and [Lock] are the same steps by hand.
//
// # The guarantee, and its limits
//
// Mutual exclusion holds only as long as the lease. A holder that stalls
// past its TTL (a GC pause, a frozen VM, a slow network) can still be working
// when Redis lets the next one in; no lock that expires can prevent that.
// Two things narrow it:
//
//   - The watchdog of [Client.Do] (and [Lock.Hold]) refreshes every TTL/3 and
//     cancels fn's ctx with cause [contend.ErrLockLost] the moment a refresh
//     finds the token gone or the lock's validity ([Lock.ValidUntil]) passes
//     without a successful refresh. The validity is counted on this
//     process's clock from when the call that obtained or last refreshed the
//     lock was sent, less 1% of the TTL and 2ms for clocks that run at
//     different rates, and a timer keeps it, whatever the network does: a
//     partition that leaves the connections open and silent, where the Redis
//     client would wait out its read timeouts and send again, ends fn's ctx
//     at the validity, before Redis lets anyone else in. Work that checks its
//     ctx stops; Do reports the loss.
//
//   - Fencing tokens close the gap for resources that can check them. Every
//     acquisition of a key gets a larger [Lock.Fence] than every earlier one;
//     the resource records the largest it has seen and refuses smaller ones.
//
// For a database, the check is one conditional UPDATE,
//
//	UPDATE jobs SET last_fence = $2, ... WHERE name = $1 AND last_fence < $2
//
// and a stalled holder's late write changes nothing (examples/settlement
// shows it). Work whose effects cannot carry a token must finish well within
// the TTL, or be idempotent.
//
// The fencing counter is as durable as Redis is: a restart without
// persistence loses it, one from an older snapshot sets it back, a
// failover to a replica that missed the last increments too. So every
// token is also at least the server's clock in microseconds, in the same
// script that takes the lock: tokens keep increasing across all of these
// as long as that clock does not go back and the key averages fewer than
// a million acquisitions a second. For the same reason a counter may
// expire: it lives a day after its lock was last obtained or refreshed.
//
// One Redis gives no fault tolerance: when it restarts without persistence,
// or fails over to a replica that missed the lock, the lock is forgotten and
// the next caller gets it while the old holder still works (its next refresh
// tells it, up to TTL/3 later). [Quorum] takes locks over several independent
// masters (Redlock), surviving the loss of a minority of them, at the price
// of fencing tokens (see [Quorum] for why).
//
// # Waiting
//
// [Client.TryObtain] (and Do with Config.NoWait) answers a held key with
// [contend.ErrConflict] at once. [Client.Obtain] (and Do by default) waits
// in line: a failed attempt enqueues the waiter in the same script, and the
// release hands the lock straight to the oldest live waiter, so hot keys are
// handed over in order (below), instead of being polled for (polling lets
// the releaser take the lock back and starves others).
//
// A Client queues at most one waiter per key in Redis. Its other waiters
// for that key wait behind that one, or behind the Client's own lock on the
// key, in arrival order, and ask Redis nothing. When the lock comes to the
// Client, its turn begins: the waiters it has at that moment get the lock
// one after another, each handed it by the release before it, in one short
// script, without a message, and for the waiter's full TTL at once. Then
// the next release looks at the queue: if another process's waiter is
// there, the lock goes to it and the Client's next waiter is queued behind
// it. So processes take turns in the order they queued, each serving the
// waiters it had when its turn began, and every waiter gets the key once
// per round; a waiter that comes during its process's turn waits for the
// next one. A hot key costs one round trip per hand-over within a process.
//
// A release that hands the lock to another process's waiter reserves it
// for that waiter for a short lease (Config.GrantLease) and tells its
// process; the waiter's next attempt, sent at once, turns the reservation
// into a hold for its TTL. The message is only a hint to look: a waiter
// holds the lock when Redis says so, in the reply to its own attempt or to
// its own process's release, so that nobody who may PUBLISH on a shared
// Redis can hand it a lock. A waiter whose process died blocks the key for
// the grant lease only. A waiter that gives up leaves the queue and passes
// on a reservation or lock it got meanwhile, in one script, after its ctx
// ended; a timed re-check (Config.Recheck) covers lost messages and dead
// holders; while the subscription is down, waiters poll with jittered
// backoff. Every wait ends with ctx or Config.MaxWait; the error then
// matches both [contend.ErrConflict] and ctx's error.
//
// # Lost replies and stuck calls
//
// A Redis client may send a command again when it did not hear the reply
// (go-redis does, after a read timeout), so every script gives the same
// answer when it runs twice: an obtain that finds its own token returns the
// lock with the same fencing token; a release that finds the lock gone,
// with nobody having taken the key since, reports no loss.
//
// Every call a Client makes returns when its ctx ends, whatever the network
// does: [Client.Obtain] and [Client.TryObtain] by their ctx's deadline,
// [Lock.Release] within 5s, [Client.Close] by its ctx's deadline. A call
// cut short may still have run: it is treated as one whose reply was lost.
//
// go-redis ignores ctx deadlines by default, so a call that may have to be
// cut short runs on a goroutine of the Client's, which Close waits for,
// while the caller waits for its reply or its ctx. The fast path skips that
// hand-over: a call whose ctx has a deadline (a release's always has) runs
// on the caller's goroutine when the Redis client ends calls by their
// ctx's deadline itself. That is a *redis.Client (also one from
// NewFailoverClient or NewUniversalClient) or *redis.Ring built with
// ContextTimeoutEnabled, its ReadTimeout and WriteTimeout not -2; or a
// *redis.ClusterClient with ContextTimeoutEnabled and also
// DisableRoutingPolicies, and not ReadOnly (else go-redis looks up the
// server's command table on a 5s clock of its own, until that first
// succeeds). A wrapper of a client, or a ctx that is only cancelled, with
// no deadline, takes the goroutine: go-redis sees deadlines, not
// cancellation. Scripts sent together in one pipeline also run on the
// Client's goroutines, on either kind of client.
//
// # Round trips
//
// Taking a free key is one script (SET NX PX and the fencing increment),
// and releasing a lock nobody waits for is a bare compare-and-delete: a
// waiter that queues marks the holder's lock, so only a marked lock needs
// the release script. The scripts of a Client's goroutines that run at the
// same time go to Redis together: while every connection of the Redis
// client's pool carries a call, later ones queue and go out as one
// pipeline, so that under load one round trip, and one read and write on
// each end, serves many. While a connection is free, a script goes out at
// once, on its own.
//
// # Errors
//
// Errors match, with [errors.Is]: [contend.ErrConflict] when the key is held
// (joined with ctx's error when a wait was cut short);
// [contend.ErrLockLost] when a hold ended early or a release found the lock
// gone; [contend.ErrInvalid] for bad input; [contend.ErrClosed] after
// [Client.Close]; [ErrNoQuorum] when too few quorum nodes answered. A Redis
// failure is returned as it is: "Redis is down" is never reported as
// "busy".
//
// # Keys
//
// The lock of key lives at Prefix + "{" + key + "}", and its fencing
// counter, queue and waiter list beside it with suffixes: the hash tag keeps
// them on one Cluster slot, so one script can touch them all. So a key may
// not contain '}' (it would end the tag early), nor a Prefix a brace (it
// would be every lock's tag, and put them all on one slot). A Client
// accepts any [redis.UniversalClient]: one node, Sentinel or Cluster, of
// Redis 6.2 or later. Every key expires by itself: the lock with its lease,
// the queue with its waiters', the fencing counter a day after its last use
// (see above).
//
// When a Cluster master fails over to its replica, the locks the replica
// had received stay held and their holders keep them; a lock whose lease
// ends during the failover is lost at its validity, on its holder's timer.
// Replication is asynchronous: a lock or fencing increment the replica had
// not received is forgotten, as on a restart. A Cluster client of go-redis
// learns of a failover only from a MOVED reply, which a dead master never
// sends, or when its slot map is a minute old; so after a failed call the
// Client asks it to read the map again.
//
// # Observing
//
// [Config.Observer] (and [QuorumConfig.Observer]) hears, as a
// [contend.Event] of strategy "distlock", every lock obtained, with its
// wait, attempts and fencing token; every key found held by a single
// attempt (conflict); every wait given up; every refresh or release that
// did not reach Redis (failed); and the end of every hold, released or lost,
// with how long it lasted: once, unless its release failed and was not
// tried again. [contend.SlogObserver] logs them; package otelcontend (module
// github.com/contend/contend/otelcontend) turns them
// into OpenTelemetry metrics and spans. Without an Observer nothing is
// measured for it.
//
// # When not to use it
//
// When the rule fits the database, use the database: a conditional UPDATE
// (package atomic) or a row lock (package pessimistic) is exclusive for
// exactly as long as it must be and needs no lease. Use distlock when the
// work is outside the database, and give its effects a fencing check where
// they can take one.
package distlock
