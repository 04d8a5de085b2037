package redisq

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/queue"
)

// maxDeadLetters bounds the dead letters one call lists, requeues or
// deletes, so that no call holds Redis for long.
const maxDeadLetters = 1000

// DeadLetters returns up to count of partition p's dead letters, oldest
// first, starting after the one whose ID is after, or at the oldest when
// after is "". To page through them, pass the last ID of a page as the next
// page's after; a page shorter than count was the last, when it was read.
// count 0 means 100, and it may be at most 1000. Jobs are dead-lettered on
// the partition of their key, [Queue.Partition].
//
// Each dead letter has every field of [queue.DeadLetter] set: its ID, for
// [Queue.RequeueDeadLetters] and [Queue.DeleteDeadLetters]; its Job, with
// in Attempt the deliveries it had across instances; its Err, matching
// [ErrRemote] with the handler's message; and At, when it was
// dead-lettered, by Redis's clock. A dead letter stays until it is
// requeued or deleted, or dropped past [Config.DeadLetterLimit].
//
// A p outside the partitions, a count out of range, or an after that is
// not a dead letter's ID is an error matching [contend.ErrInvalid].
func (q *Queue) DeadLetters(ctx context.Context, p int, after string, count int) ([]queue.DeadLetter, error) {
	if err := q.validPartition(p); err != nil {
		return nil, err
	}
	if count < 0 || count > maxDeadLetters {
		return nil, fmt.Errorf("redisq: dead letters: count %d, want 0 to %d: %w", count, maxDeadLetters, contend.ErrInvalid)
	}
	if count == 0 {
		count = 100
	}
	start := "-"
	if after != "" {
		if _, err := idTime(after); err != nil {
			return nil, err
		}
		start = "(" + after // exclusive
	}
	msgs, err := q.rdb.XRangeN(ctx, q.deadLetters(p), start, "+", int64(count)).Result()
	if err != nil {
		return nil, fmt.Errorf("redisq: dead letters of partition %d: %w", p, err)
	}
	letters := make([]queue.DeadLetter, len(msgs))
	for i, m := range msgs {
		at, _ := idTime(m.ID) // Redis made the ID
		attempts, _ := m.Values["attempts"].(string)
		n, _ := strconv.Atoi(attempts)
		msg, _ := m.Values["error"].(string)
		letters[i] = queue.DeadLetter{ID: m.ID, Job: toJob(m, n), Err: remote(msg), At: at}
	}
	return letters, nil
}

// RequeueDeadLetters puts partition p's dead letters ids back on the
// partition as new jobs of their keys, in the order of ids, and returns how
// many it found. Each goes behind the jobs already waiting, with its delivery count starting
// again and nobody waiting for its answer, and leaves the dead letters in
// the same step: a dead letter is requeued once, even when Redis gets the
// call twice. IDs not found (requeued or deleted already, or dropped past
// [Config.DeadLetterLimit]) are skipped. The partition is the key's as
// long as Partitions has not changed since the job was added.
//
// A p outside the partitions, more than 1000 ids, or an id that is not a
// dead letter's ID is an error matching [contend.ErrInvalid], and nothing
// is requeued.
func (q *Queue) RequeueDeadLetters(ctx context.Context, p int, ids ...string) (int, error) {
	if err := q.checkIDs(p, ids); err != nil || len(ids) == 0 {
		return 0, err
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	n, err := requeue.Run(ctx, q.rdb, []string{q.deadLetters(p), q.stream(p)}, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("redisq: requeue dead letters of partition %d: %w", p, err)
	}
	return n, nil
}

// requeue moves dead letters ARGV[1], ARGV[2], ... of stream KEYS[1] to the
// end of stream KEYS[2], as new entries of their key and payload, and
// returns how many it found. An entry moved is gone from KEYS[1], so
// running it twice moves nothing more.
var requeue = redis.NewScript(`
local moved = 0
for _, id in ipairs(ARGV) do
  local found = redis.call('XRANGE', KEYS[1], id, id)
  if #found > 0 then
    local job = {}
    local fields = found[1][2]
    for i = 1, #fields, 2 do
      job[fields[i]] = fields[i + 1]
    end
    redis.call('XADD', KEYS[2], '*', 'key', job.key, 'payload', job.payload or '')
    redis.call('XDEL', KEYS[1], id)
    moved = moved + 1
  end
end
return moved
`)

// DeleteDeadLetters deletes partition p's dead letters ids and returns how
// many it found.
//
// A p outside the partitions, more than 1000 ids, or an id that is not a
// dead letter's ID is an error matching [contend.ErrInvalid], and nothing
// is deleted.
func (q *Queue) DeleteDeadLetters(ctx context.Context, p int, ids ...string) (int, error) {
	if err := q.checkIDs(p, ids); err != nil || len(ids) == 0 {
		return 0, err
	}
	n, err := q.rdb.XDel(ctx, q.deadLetters(p), ids...).Result()
	if err != nil {
		return 0, fmt.Errorf("redisq: delete dead letters of partition %d: %w", p, err)
	}
	return int(n), nil
}

// deadLetters is partition p's dead-letter stream; it shares the
// partition's hash tag, so a script can move entries between the two.
func (q *Queue) deadLetters(p int) string { return q.stream(p) + ":dead" }

func (q *Queue) validPartition(p int) error {
	if p < 0 || p >= q.cfg.Partitions {
		return fmt.Errorf("redisq: partition %d, want 0 to %d: %w", p, q.cfg.Partitions-1, contend.ErrInvalid)
	}
	return nil
}

// checkIDs checks p, and ids given at once to a script or a command.
func (q *Queue) checkIDs(p int, ids []string) error {
	if err := q.validPartition(p); err != nil {
		return err
	}
	if len(ids) > maxDeadLetters {
		return fmt.Errorf("redisq: %d dead letters at once, want at most %d: %w", len(ids), maxDeadLetters, contend.ErrInvalid)
	}
	for _, id := range ids {
		if _, err := idTime(id); err != nil {
			return err
		}
	}
	return nil
}

// idTime checks that id is a stream entry's ID, "milliseconds-sequence",
// and returns the time it holds.
func idTime(id string) (time.Time, error) {
	ms, seq, ok := strings.Cut(id, "-")
	millis, err := strconv.ParseUint(ms, 10, 63) // a sign is refused
	if ok && err == nil {
		_, err = strconv.ParseUint(seq, 10, 64)
	}
	if !ok || err != nil {
		return time.Time{}, fmt.Errorf("redisq: %q is not a dead letter's ID: %w", id, contend.ErrInvalid)
	}
	return time.UnixMilli(int64(millis)), nil
}
