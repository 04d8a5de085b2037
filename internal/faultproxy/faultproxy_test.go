package faultproxy_test

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/contend/contend/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redisAddr is the shared local Redis the proxies forward to.
const redisAddr = "127.0.0.1:6379"

// noRetries is go-redis's spelling of "no retries": MaxRetries 0 means the
// default, 3.
const noRetries = -1

// newClient returns a client closed when t ends (before its proxy, which
// Start registered earlier).
func newClient(t *testing.T, opt *redis.Options) *redis.Client {
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// direct is a client that bypasses the proxy, to see what Redis really holds.
func direct(t *testing.T) *redis.Client {
	return newClient(t, &redis.Options{Addr: redisAddr})
}

// uniqueKey returns a key no other test or run uses, deleted through d when t
// ends.
func uniqueKey(t *testing.T, d *redis.Client) string {
	key := "faultproxy-test:" + t.Name() + ":" + rand.Text()
	t.Cleanup(func() { _ = d.Del(context.Background(), key).Err() })
	return key
}

// countDials returns a go-redis Dialer that counts the connections it makes.
func countDials(n *atomic.Int32) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

func requireTimeout(t *testing.T, err error) {
	t.Helper()
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "want a timeout, got %v", err)
}

func TestForwards(t *testing.T) {
	ctx := t.Context()
	p := faultproxy.Start(t, redisAddr)
	key := uniqueKey(t, direct(t))
	c := newClient(t, &redis.Options{Addr: p.Addr()})

	require.Equal(t, "PONG", c.Ping(ctx).Val())
	require.NoError(t, c.Set(ctx, key, "v", time.Minute).Err())
	got, err := c.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "v", got)
	require.Equal(t, 1, p.Conns())

	// The client's FIN is passed on and the connection is forgotten.
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return p.Conns() == 0 }, 5*time.Second, time.Millisecond)
}

func TestBlackholeTimesOutWithoutClosing(t *testing.T) {
	ctx := t.Context()
	var dials atomic.Int32
	p := faultproxy.Start(t, redisAddr)
	key := uniqueKey(t, direct(t))
	// A short ReadTimeout keeps the test short; no retries so that one
	// attempt's error is what the call returns.
	c := newClient(t, &redis.Options{
		Addr: p.Addr(), ReadTimeout: 200 * time.Millisecond, MaxRetries: noRetries,
		Dialer: countDials(&dials),
	})
	require.NoError(t, c.Ping(ctx).Err())

	p.Blackhole()
	start := time.Now()
	err := c.Get(ctx, key).Err()
	requireTimeout(t, err)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	// Had the proxy closed the connection, go-redis's pool check would have
	// seen the FIN and redialled before sending the GET.
	require.Equal(t, int32(1), dials.Load(), "the GET must wait on the connection open before the blackhole")
	// go-redis closed its timed-out connection, but the partition keeps that
	// from Redis: the proxy still holds the server side open.
	require.Equal(t, 1, p.Conns())

	p.Heal()
	// Heal resets the orphaned connection (or the proxy reads the client's
	// FIN only now and passes it on): nothing stays open.
	require.Eventually(t, func() bool { return p.Conns() == 0 }, 5*time.Second, time.Millisecond)
	c2 := newClient(t, &redis.Options{Addr: p.Addr(), ReadTimeout: 200 * time.Millisecond, MaxRetries: noRetries})
	require.NoError(t, c2.Set(ctx, key, "after", time.Minute).Err())
	require.Equal(t, "after", c2.Get(ctx, key).Val())
}

// TestBlackholeOutlivesContextDeadline documents the go-redis default a
// library must cope with: without ContextTimeoutEnabled the ctx deadline
// does not bound a call's network wait, only ReadTimeout does. A promise
// such as "return by the deadline" needs a timer of the library's own.
func TestBlackholeOutlivesContextDeadline(t *testing.T) {
	p := faultproxy.Start(t, redisAddr)
	key := uniqueKey(t, direct(t))
	// ReadTimeout 500ms instead of the default 3s, and no retries, keep the
	// test short; ContextTimeoutEnabled stays at its default, false.
	c := newClient(t, &redis.Options{Addr: p.Addr(), ReadTimeout: 500 * time.Millisecond, MaxRetries: noRetries})
	require.NoError(t, c.Ping(t.Context()).Err())

	p.Blackhole()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Get(ctx, key).Err()
	took := time.Since(start)
	t.Logf("GET with a 100ms deadline returned after %v: %v", took, err)
	require.Error(t, err)
	require.GreaterOrEqual(t, took, 400*time.Millisecond, "the call returned by its ctx deadline")
}

func TestLatency(t *testing.T) {
	ctx := t.Context()
	p := faultproxy.Start(t, redisAddr)
	key := uniqueKey(t, direct(t))
	c := newClient(t, &redis.Options{Addr: p.Addr()})
	require.NoError(t, c.Ping(ctx).Err()) // dial outside the timed round trip

	p.SetLatency(50 * time.Millisecond)
	start := time.Now()
	require.NoError(t, c.Ping(ctx).Err())
	took := time.Since(start)
	t.Logf("PING round trip with 50ms latency: %v", took)
	require.GreaterOrEqual(t, took, 100*time.Millisecond, "latency must apply both ways")

	require.NoError(t, c.Set(ctx, key, "slow", time.Minute).Err())
	require.Equal(t, "slow", c.Get(ctx, key).Val())
}

func TestResetFailsOpenConnections(t *testing.T) {
	ctx := t.Context()
	p := faultproxy.Start(t, redisAddr)
	d := direct(t)
	key := uniqueKey(t, d) // never pushed to: BLPOP blocks on it
	name := "faultproxy-reset-" + rand.Text()
	// No retries: with them go-redis re-sends the BLPOP on a fresh
	// connection and the reset never reaches the caller.
	c := newClient(t, &redis.Options{Addr: p.Addr(), ClientName: name, MaxRetries: noRetries})

	errc := make(chan error, 1)
	go func() { errc <- c.BLPop(ctx, 10*time.Second, key).Err() }()
	require.Eventually(t, func() bool { return blocked(ctx, d, name) }, 5*time.Second, 5*time.Millisecond,
		"the BLPOP never blocked in Redis")

	// A raw connection too, to see the RST itself: go-redis reports it as
	// EOF (below), as it would a FIN.
	raw, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer raw.Close()
	require.Eventually(t, func() bool { return p.Conns() == 2 }, 5*time.Second, time.Millisecond)

	p.Reset()
	_, err = raw.Read(make([]byte, 1))
	require.ErrorIs(t, err, syscall.ECONNRESET)

	err = <-errc
	t.Logf("in-flight BLPOP after Reset: %v", err)
	// The socket reports ECONNRESET, but go-redis (RESP3) peeks for push
	// notifications first, swallows that error and reads again: io.EOF.
	require.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF), "want a reset or EOF, got %v", err)
	require.Equal(t, 0, p.Conns())

	// go-redis dropped the broken connection and dials a fresh one.
	require.NoError(t, c.Set(ctx, key+":after", "ok", time.Minute).Err())
	require.NoError(t, d.Del(ctx, key+":after").Err())
	require.Equal(t, 1, p.Conns())
}

// blocked reports whether the client named name is blocked in Redis.
func blocked(ctx context.Context, d *redis.Client, name string) bool {
	list, err := d.ClientList(ctx).Result()
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(list, "\n") {
		if strings.Contains(line, " name="+name+" ") && strings.Contains(line, " flags=b ") {
			return true
		}
	}
	return false
}

func TestDropNextReplyRunsCommandTwice(t *testing.T) {
	ctx := t.Context()
	p := faultproxy.Start(t, redisAddr)
	d := direct(t)
	key := uniqueKey(t, d)
	// A short ReadTimeout so the lost reply is given up on quickly; retries
	// stay at the default (3), as in production.
	c := newClient(t, &redis.Options{Addr: p.Addr(), ReadTimeout: 200 * time.Millisecond})
	// Connect first, so the dropped reply is INCR's and not the handshake's.
	require.NoError(t, c.Ping(ctx).Err())

	p.DropNextReply()
	n, err := c.Incr(ctx, key).Result()
	require.NoError(t, err, "the client sees one successful INCR")
	t.Logf("INCR returned %d to the client", n)

	got, err := d.Get(ctx, key).Int()
	require.NoError(t, err)
	require.Equal(t, 2, got, "the INCR ran twice: once unheard, once re-sent")
}

// DropReplyTo drops the reply to the request it names, on that request's
// connection, and no other: a blocking read answered on another connection
// after the fault was armed gets its reply. With DropNextReply that reply
// would be the one dropped.
func TestDropReplyToDropsThatRequestsReply(t *testing.T) {
	ctx := t.Context()
	p := faultproxy.Start(t, redisAddr)
	d := direct(t)
	key := uniqueKey(t, d)
	c := newClient(t, &redis.Options{Addr: p.Addr(), ReadTimeout: 200 * time.Millisecond})
	require.NoError(t, c.Ping(ctx).Err())

	p.DropReplyTo("INCR")
	popped := make(chan error, 1)
	go func() { popped <- c.BLPop(ctx, 5*time.Second, key+":list").Err() }()
	time.Sleep(50 * time.Millisecond) // the BLPOP is blocked in Redis
	require.NoError(t, d.RPush(ctx, key+":list", "x").Err())
	select {
	case err := <-popped:
		require.NoError(t, err, "the blocking read's reply was dropped")
	case <-time.After(3 * time.Second):
		t.Fatal("the blocking read's reply was dropped")
	}

	_, err := c.Incr(ctx, key).Result()
	require.NoError(t, err)
	got, err := d.Get(ctx, key).Int()
	require.NoError(t, err)
	require.Equal(t, 2, got, "the INCR ran twice: once unheard, once re-sent")
}
