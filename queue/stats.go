package queue

import (
	"sync/atomic"

	"github.com/contend/contend/internal/queuecore"
)

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
// time, from any goroutine.
func (q *Queue) Stats() Stats {
	s := Stats{Partitions: make([]PartitionStats, len(q.parts))}
	for i := range q.parts {
		pc := &q.stats.partitions[i]
		ps := PartitionStats{
			Depth:        q.parts[i].depth() + int(pc.taken.Load()),
			InFlight:     pc.InFlight.Load(),
			Handled:      pc.Handled.Load(),
			Redeliveries: pc.Redeliveries.Load(),
			DeadLetters:  pc.DeadLetters.Load(),
		}
		s.Partitions[i] = ps
		s.PartitionStats.Add(ps)
	}
	return s
}
