// Package queue removes the race instead of managing it: every job carries a
// key, all jobs of one key go to one partition, and exactly one worker
// consumes a partition, in order. The handler then needs no lock at all,
// because nothing else touches the key while it runs.
//
// The other strategies of contend make concurrent writers take turns on a
// shared row or lease; when one key takes more traffic than a lock on it can
// serve (a flash sale on one product), the turns themselves are the
// bottleneck. A queue turns the many writers into one, and a [BatchHandler]
// turns a hot key's pending jobs into one write: 100 pending "buy one" jobs
// become one
//
//	UPDATE products SET stock = stock - 100 WHERE id = $1 AND stock >= 100
//
// instead of 100 round trips that each wait for the row lock. This is the
// application-level form of the "group update" that databases sell for hot
// rows; on one hot row it serves many times the single-row UPDATE's rate (see
// BenchmarkHotKey).
//
// # Guarantee
//
// [Queue] is the in-memory backend. hash(key) % Partitions (FNV-1a 64, see
// [Queue.Partition]) picks a bounded buffer, and one goroutine per partition
// runs its jobs:
//   - jobs of one key run one at a time, in the order they were accepted;
//     jobs of different partitions run in parallel;
//   - [Queue.Submit] waits for the job's result (request/reply), so an HTTP
//     handler can answer "sold" or "sold out" at once; [Queue.Enqueue]
//     returns as soon as the job is in the buffer (fire and forget);
//   - a full buffer makes producers wait until their ctx ends, or answer
//     [ErrFull] at once with [Config.RefuseWhenFull]: memory stays bounded;
//   - a handler error is retried under [Config.Retry], the partition waiting
//     (a later job of the key must not overtake); after the last delivery the
//     job goes to [Config.DeadLetter] with its error, its submitter gets
//     [ErrDeadLettered], and the partition moves on, so no poison job blocks
//     a key forever. A handler panic is an error, not a crash;
//   - [Queue.Close] drains: it stops taking jobs, runs every accepted one, and
//     waits for the workers, until its ctx ends;
//   - a failed batch costs a bounded number of deliveries: see
//     [BatchHandler].
//
// Queue is also a [contend.Guard]: [Queue.Do] runs fn on the key's partition
// worker, so no two fns (or jobs) of one key overlap — within this process
// only.
//
// # Limits
//
//   - One process only. Two instances with a Queue each run one key's jobs at
//     the same time; the tests show the read-modify-write losing updates
//     across three processes. Jobs in the buffers die with the process. For
//     many instances use package redisq, which offers the same [Backend] API
//     over Redis Streams, with partition leases and at-least-once delivery.
//   - Eventual consistency: a job enqueued is done later. Only a caller that
//     waits with Submit knows the outcome; one that Enqueues must not read the
//     state back and expect the job's effect.
//   - Handlers should be idempotent: see below.
//   - A slow job delays every later job of its partition, not only of its
//     key: pick enough partitions, and keep handlers short.
//   - A handler must not Submit to, or Do on, its own partition and wait: the
//     worker would wait for itself.
//
// # Idempotent handlers
//
// In memory a job runs once per delivery, but a failed delivery may have
// written before it failed, and the backend across instances (package redisq,
// Redis Streams) delivers at least once. Make the write itself refuse a
// repeat, keyed on a job id carried in the payload, with one atomic
// conditional statement (see Example_idempotent):
//
//	WITH first AS (INSERT INTO processed_jobs (job_id) VALUES ($2) ON CONFLICT DO NOTHING RETURNING 1)
//	UPDATE products SET stock = stock - 1
//	WHERE id = $1 AND stock >= 1 AND EXISTS (SELECT 1 FROM first)
//
// or record the id with INSERT ... ON CONFLICT DO NOTHING in the transaction
// of the effect, and skip the effect when it inserted nothing.
//
// # Observing
//
// [Queue.Stats] counts what the partitions hold and did. [Config.Observer]
// (and package redisq's) hears, as a [contend.Event] of strategy "queue",
// each failed delivery of a job (failed, Attempts its delivery), each job
// dead-lettered, and each caller whose ctx ended while it waited for room
// or for its job to start (gave-up); those callers get an error matching
// both [contend.ErrConflict] and ctx's error, as a distlock waiter does.
// [Queue.Do], the guard, reports as a lock does: obtained when fn starts,
// released when it returns, with how long it waited and ran.
// [contend.SlogObserver] logs the events.
//
// # When not to use it
//
// When the rule fits in one conditional UPDATE and the key is not hot, use
// package atomic: it is simpler and immediately consistent. When the caller
// needs the decision and the database row locked together (several rows, a
// read then a write in one transaction), use package pessimistic. Use the
// queue when one key's traffic exceeds what a row lock serves, or when the
// work per key must run in order.
package queue
