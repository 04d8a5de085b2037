package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/testserver"
)

// The Guard contract, in both of Do's policies. The TTL is long enough that
// a loaded machine's slow refresh does not count as a lost lock, and so is
// the grant lease, which is what a lock handed over from another process
// lives on until its holder extends it (by default 1s: once, in a -race CI
// run beside the other packages' tests, a holder's lock lapsed within it
// and its release reported the loss); the fault tests cover short ones.
func TestClientIsAGuard(t *testing.T) {
	for name, failFast := range map[string]bool{"fail_fast": true, "waiting": false} {
		t.Run(name, func(t *testing.T) {
			guardtest.Run(t, guardtest.Suite{
				Driver: "pgx",
				New: func(t testing.TB, env guardtest.Env) contend.Guard {
					return newClient(t, env.Redis, distlock.Config{Prefix: env.Prefix, TTL: 3 * time.Second, GrantLease: 3 * time.Second, NoWait: failFast})
				},
				FailFast:  failFast,
				Exclusive: true,
			})
		})
	}
}

// The same contract on a Redis Cluster of three masters, the package's
// shared one, started here if need be, before the worker processes that
// find it through the environment. (Its run under faults puts only
// PostgreSQL behind the fault proxy: the Cluster client reaches the nodes
// by the addresses they announce.)
func TestClientIsAGuardOnACluster(t *testing.T) {
	testserver.RedisCluster(t, 3)
	guardtest.Run(t, guardtest.Suite{
		Driver: "pgx",
		New: func(t testing.TB, env guardtest.Env) contend.Guard {
			return newClient(t, testserver.RedisCluster(t, 3), distlock.Config{Prefix: env.Prefix, TTL: 3 * time.Second, GrantLease: 3 * time.Second})
		},
		Exclusive: true,
	})
}

// A quorum over three databases of the test server passes the same
// contract. They are not independent masters, which the contract does not
// need; TestQuorum* use separate servers.
func TestQuorumIsAGuard(t *testing.T) {
	guardtest.Run(t, guardtest.Suite{
		Driver: "pgx",
		New: func(t testing.TB, env guardtest.Env) contend.Guard {
			nodes := []redis.Scripter{env.Redis, database(t, 1), database(t, 2)}
			q, err := distlock.NewQuorum(nodes, distlock.QuorumConfig{
				Prefix: env.Prefix, TTL: 3 * time.Second, NodeTimeout: time.Second,
			})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, q.Close(context.Background())) })
			return q
		},
		Exclusive: true,
	})
}

// database returns a client of database db of the test server, closed when
// t ends.
func database(t testing.TB, db int) *redis.Client {
	t.Helper()
	u, err := testserver.RedisURL()
	require.NoError(t, err)
	opts, err := redis.ParseURL(u)
	require.NoError(t, err)
	opts.DB = db
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Ping(context.Background()).Err())
	return c
}
