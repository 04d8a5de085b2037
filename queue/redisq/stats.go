package redisq

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend/internal/queuecore"
	"github.com/contend/contend/queue"
)

// Stats returns a snapshot per partition, and summed, of what this instance
// did and of what the streams hold.
//
// InFlight, Handled, Redeliveries and DeadLetters count this instance's work
// only, since it was made: sum them over the instances for the whole queue
// (Depth, the same for every instance, is not summed).
// A redelivery is a delivery whose stream count is above one, so it includes
// the first delivery of a job by an owner that took it over. Depth is global,
// read from Redis, the same whichever instance asks: the entries of the
// partition's stream not yet acknowledged, that is the consumer group's lag
// (never delivered) plus its pending entries (delivered to some instance,
// in flight or waiting in a read batch). When Redis cannot tell the lag (the
// stream had entries deleted in the middle), Depth is the stream's length,
// an upper bound. Stats costs one round trip, whatever the partitions.
func (q *Queue) Stats(ctx context.Context) (queue.Stats, error) {
	n := q.cfg.Partitions
	lens := make([]*redis.IntCmd, n)
	groups := make([]*redis.XInfoGroupsCmd, n)
	pipe := q.rdb.Pipeline()
	for p := range n {
		lens[p] = pipe.XLen(ctx, q.stream(p))
		groups[p] = pipe.XInfoGroups(ctx, q.stream(p))
	}
	// XINFO GROUPS fails on a stream not made yet; its XLEN, 0, is right.
	_, _ = pipe.Exec(ctx)
	s := queue.Stats{Partitions: make([]queue.PartitionStats, n)}
	var sum queuecore.Figures
	for p := range n {
		length, err := lens[p].Result()
		if err != nil {
			return queue.Stats{}, fmt.Errorf("redisq: stats of partition %d: %w", p, err)
		}
		depth := length
		for _, g := range groups[p].Val() {
			if g.Name == group && g.Lag >= 0 {
				depth = g.Lag + g.Pending
			}
		}
		f := q.counters[p].Snapshot(int(depth))
		s.Partitions[p] = queue.PartitionStats(f)
		sum.Add(f)
	}
	s.PartitionStats = queue.PartitionStats(sum)
	return s, nil
}
