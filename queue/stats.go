package queue

import "sync/atomic"

// Stats is a snapshot of what a queue holds and has done, per partition and
// summed. Counters only grow; Depth and InFlight are instantaneous.
type Stats struct {
	PartitionStats
	// Partitions holds one entry per partition, by index (see
	// [Queue.Partition]): a hot key shows as one deep partition.
	Partitions []PartitionStats
}

// PartitionStats is what one partition holds and has done.
type PartitionStats struct {
	// Depth is how many jobs wait in the buffer.
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

// Add adds o's figures to s: a sum over partitions, or over instances.
func (s *PartitionStats) Add(o PartitionStats) {
	s.Depth += o.Depth
	s.InFlight += o.InFlight
	s.Handled += o.Handled
	s.Redeliveries += o.Redeliveries
	s.DeadLetters += o.DeadLetters
}

type counters struct {
	partitions []partitionCounters
}

// Counters are one partition's running totals, as both backends keep them
// (queue/redisq too): jobs running, handled, delivered again, and dead
// letters. Safe for concurrent use.
type Counters struct {
	InFlight, Handled, Redeliveries, DeadLetters atomic.Int64
}

// Snapshot returns the totals as a partition's Stats, with depth, which the
// backend measures its own way.
func (c *Counters) Snapshot(depth int) PartitionStats {
	return PartitionStats{
		Depth:        depth,
		InFlight:     c.InFlight.Load(),
		Handled:      c.Handled.Load(),
		Redeliveries: c.Redeliveries.Load(),
		DeadLetters:  c.DeadLetters.Load(),
	}
}

type partitionCounters struct {
	Counters
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
// time, from any goroutine.
func (q *Queue) Stats() Stats {
	s := Stats{Partitions: make([]PartitionStats, len(q.parts))}
	for i := range q.parts {
		pc := &q.stats.partitions[i]
		ps := pc.Snapshot(q.parts[i].depth() + int(pc.taken.Load()))
		s.Partitions[i] = ps
		s.PartitionStats.Add(ps)
	}
	return s
}
