package queue

import (
	"context"
	"sync/atomic"

	"github.com/contend/contend/internal/queuecore"
)

// Stats is a snapshot of what a queue holds and has done, per partition and
// summed over them. Counters only grow; Depth and InFlight are
// instantaneous.
type Stats struct {
	PartitionStats
	// Partitions holds one entry per partition, by index (see
	// [Queue.Partition]): a hot key shows as one deep partition.
	Partitions []PartitionStats
}

// PartitionStats is what one partition holds and has done.
type PartitionStats struct {
	// Depth is how many jobs wait: in memory, in the partition's buffer;
	// in package redisq, in the partition's stream, not yet acknowledged.
	Depth int
	// InFlight is how many jobs a handler is processing now.
	InFlight int64
	// Handled counts jobs that got an answer from a handler.
	Handled int64
	// Redeliveries counts deliveries after a job's first.
	Redeliveries int64
	// DeadLetters counts jobs that failed on every delivery.
	DeadLetters int64
}

type counters struct {
	partitions []partitionCounters
}

type partitionCounters struct {
	queuecore.Counters
	// taken is how many jobs the worker took from the buffer and has not
	// started: they still count in the depth.
	taken atomic.Int64
	// Keeps each partition's counters on its own cache lines: the workers
	// of neighbouring partitions write them at once.
	_ [32]byte
}

// waiting records that the worker has started every job of items before
// index next.
func (pc *partitionCounters) waiting(items []item, next int) {
	pc.taken.Store(int64(len(items) - next))
}

// Stats returns a snapshot of the queue's counters. It is safe to call at any
// time, from any goroutine. In memory it reads no server and never fails:
// ctx and the error give it the shape of package redisq's Stats, which
// reads the streams' depth from Redis.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	s := Stats{Partitions: make([]PartitionStats, len(q.parts))}
	var sum queuecore.Figures
	for i := range q.parts {
		pc := &q.stats.partitions[i]
		f := pc.Snapshot(q.parts[i].depth() + int(pc.taken.Load()))
		s.Partitions[i] = PartitionStats(f)
		sum.Add(f)
	}
	s.PartitionStats = PartitionStats(sum)
	return s, nil
}
