package queue_test

import (
	"context"
	"strconv"
	"sync"
	stdatomic "sync/atomic"
	"testing"
	"time"

	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/queue"
)

// Benchmarks pair the queue with its floor, a sibling sub-benchmark named
// `raw` in the same run, so benchratio/benchstat show the ratio:
//
//   - BenchmarkThroughput: fire-and-forget jobs that do nothing, against a bare
//     channel hand-off to one goroutine per partition (the same FNV-1a
//     partitioning); what remains is the queue's own cost per job.
//   - BenchmarkHotKey: buys of one product, against atomic.Update's
//     single-row conditional decrement from the same number of goroutines;
//     the queue's batch handler turns pending buys into one UPDATE. Reports
//     decrements/s.

const benchPartitions = 16

// rawBuffer is the raw channels' capacity: Config.Buffer's default, so that
// both hold as many jobs per partition.
const rawBuffer = 1024

var benchWorkers = []int{1, 8, 64}

func BenchmarkThroughput(b *testing.B) {
	for _, impl := range []struct {
		name string
		run  func(b *testing.B, workers int, pick func() string)
	}{
		{"raw", rawThroughput},
		{"queue", queueThroughput},
	} {
		b.Run(impl.name+"/mem/partitions="+strconv.Itoa(benchPartitions), func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, workers := range benchWorkers {
						b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
							impl.run(b, workers, w.Pick)
						})
					}
				})
			}
		})
	}
}

type rawJob struct {
	key     string
	payload []byte
}

func rawThroughput(b *testing.B, workers int, pick func() string) {
	var (
		chans   = make([]chan rawJob, benchPartitions)
		handled stdatomic.Int64
		wg      sync.WaitGroup
	)
	for i := range chans {
		chans[i] = make(chan rawJob, rawBuffer)
		wg.Go(func() {
			for j := range chans[i] {
				handled.Add(1 + int64(len(j.payload))) // as the queue's handler sees the job
			}
		})
	}
	workload.Parallel(b, workers, func(context.Context) error {
		k := pick()
		chans[partition(k)] <- rawJob{key: k}
		return nil
	})
	for _, ch := range chans {
		close(ch)
	}
	wg.Wait()
}

func partition(key string) int { return int(fnv1a(key) % benchPartitions) }

func queueThroughput(b *testing.B, workers int, pick func() string) {
	var handled stdatomic.Int64
	q, err := queue.New(queue.Config{Partitions: benchPartitions, Handler: func(context.Context, queue.Job) ([]byte, error) {
		handled.Add(1)
		return nil, nil
	}})
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = q.Run(context.Background()) }()
	workload.Parallel(b, workers, func(ctx context.Context) error {
		return q.Enqueue(ctx, pick(), nil)
	})
	if err := q.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
}

const decrement = `UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`

func BenchmarkHotKey(b *testing.B) {
	for _, impl := range []struct {
		name string
		new  func(b *testing.B) func(ctx context.Context) error
	}{
		{"raw", func(b *testing.B) func(ctx context.Context) error {
			db := testserver.DB(b, "pgx")
			workload.Products(b, db, 1<<40, workload.Hot)
			return func(ctx context.Context) error {
				_, err := atomic.Update(ctx, db, decrement, workload.Hot)
				return err
			}
		}},
		{"queue", func(b *testing.B) func(ctx context.Context) error {
			db := testserver.DB(b, "pgx")
			workload.Products(b, db, 1<<40, workload.Hot)
			var statements stdatomic.Int64
			q := start(b, queue.Config{Partitions: benchPartitions, BatchHandler: seller(db, &statements)})
			return func(ctx context.Context) error {
				_, err := q.Submit(ctx, workload.Hot, nil)
				return err
			}
		}},
	} {
		b.Run(impl.name, func(b *testing.B) {
			for _, workers := range benchWorkers {
				b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
					op := impl.new(b)
					start := time.Now()
					workload.Parallel(b, workers, op)
					b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decrements/s")
				})
			}
		})
	}
}
