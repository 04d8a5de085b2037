package redisq

import "context"

// StuckSubmitter registers a submitter of request id that never reads its
// answer, as one whose ctx has just ended and which has not yet left, and
// returns the list the answers come back on and the function that removes
// the submitter.
func (q *Queue) StuckSubmitter(id string) (replies string, leave func(), err error) {
	if err := q.await(id, make(chan string, 1)); err != nil {
		return "", nil, err
	}
	return q.replies(), func() { q.forget(id) }, nil
}

// Acknowledge acknowledges ids in partition p's stream, and trims it, as
// an owner does once it has handled them.
func (q *Queue) Acknowledge(ctx context.Context, p int, ids ...string) error {
	args := []any{group}
	for _, id := range ids {
		args = append(args, id)
	}
	return ack.Run(ctx, q.rdb, []string{q.stream(p)}, args...).Err()
}
