package contendtest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/contendtest"
	"github.com/contend/contend/queue"
)

// startBot is the code under test: it starts a bot's engine under whatever
// guard the service was built with, and says what the user should see.
func startBot(ctx context.Context, g contend.Guard, bot string) string {
	err := g.Do(ctx, bot, func(ctx context.Context) error {
		select { // spawning the engine takes a moment
		case <-time.After(10 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	switch {
	case err == nil:
		return "started"
	case ctx.Err() != nil:
		// Before ErrConflict: a wait cut short by ctx matches both.
		return "timed out, try again"
	case errors.Is(err, contend.ErrLockLost):
		return "lost the lock while starting: check the engine"
	case errors.Is(err, contend.ErrConflict):
		return "already starting"
	case errors.Is(err, contend.ErrNotFound):
		return "no such bot"
	default:
		return "error: " + err.Error()
	}
}

// A test scripts one outcome per call and checks the answer to each.
func ExampleGuard() {
	g := contendtest.NewGuard(
		contendtest.Run(),
		contendtest.Conflict(),
		contendtest.NotFound(),
		contendtest.WaitForCtx(),
		contendtest.LoseLock(0),
		contendtest.Fail(errors.New("connection reset")),
	)
	for range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		fmt.Println(startBot(ctx, g, "bot-1"))
		cancel()
	}
	fmt.Println("outcomes left:", g.Left())
	// Output:
	// started
	// already starting
	// no such bot
	// timed out, try again
	// lost the lock while starting: check the engine
	// error: connection reset
	// outcomes left: 0
}

// A stock that must never sell more than it holds, checked with 50 buyers
// arriving at once. The guard here is the in-memory queue, which keeps one
// key's fns apart within this process; a service's test would use the
// guard it runs with, on a real backend.
func ExampleRace() {
	noJobs := func(context.Context, queue.Job) ([]byte, error) { return nil, nil }
	q, err := queue.New(queue.Config{Partitions: 4, Handler: noJobs})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	go q.Run(ctx)
	defer q.Close(ctx)

	stock := 10 // touched only under the guard
	errSoldOut := errors.New("sold out")
	buy := func(int) error {
		return q.Do(ctx, "sku-1", func(context.Context) error {
			if stock < 1 {
				return errSoldOut
			}
			stock--
			return nil
		})
	}

	sold, soldOut := 0, 0
	for _, err := range contendtest.Race(50, buy) {
		switch {
		case err == nil:
			sold++
		case errors.Is(err, errSoldOut):
			soldOut++
		default:
			log.Fatal(err)
		}
	}
	fmt.Println("sold", sold, "sold out", soldOut, "left", stock)
	// Output: sold 10 sold out 40 left 0
}
