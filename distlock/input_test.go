package distlock_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
)

func TestNewClientRefusesBadInput(t *testing.T) {
	t.Parallel()
	rdb, _ := redisOnly(t)
	_, err := distlock.NewClient(nil, distlock.Config{})
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = distlock.NewClient((*redis.Client)(nil), distlock.Config{})
	require.ErrorIs(t, err, contend.ErrInvalid, "a typed nil client")
	for name, cfg := range map[string]distlock.Config{
		"negative TTL":            {TTL: -time.Second},
		"TTL below the minimum":   {TTL: distlock.MinTTL - time.Millisecond},
		"negative MaxWait":        {MaxWait: -time.Second},
		"negative Recheck":        {Recheck: -time.Second},
		"sub-millisecond Recheck": {Recheck: time.Microsecond},
		"negative GrantLease":     {GrantLease: -time.Second},
		// Three Rechecks, a deadline MaxWait from now: they must not
		// overflow.
		"Recheck near MaxInt64":    {Recheck: math.MaxInt64 - 1},
		"GrantLease near MaxInt64": {GrantLease: math.MaxInt64},
		"TTL near MaxInt64":        {TTL: math.MaxInt64},
		"MaxWait near MaxInt64":    {MaxWait: math.MaxInt64},
		"Recheck past MaxDuration": {Recheck: distlock.MaxDuration + 1},
		// A brace would make the prefix every lock's Cluster hash tag.
		"prefix with {":  {Prefix: "app{x}:"},
		"prefix with }":  {Prefix: "app}:"},
		"prefix with {{": {Prefix: "{"},
	} {
		_, err := distlock.NewClient(rdb, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	_, err = distlock.NewClient(rdb, distlock.Config{TTL: distlock.MinTTL})
	require.NoError(t, err, "the minimum itself is fine")
}

func TestCallsRefuseBadInput(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	ctx := t.Context()
	for _, obtain := range []func(context.Context, string, time.Duration) (*distlock.Lock, error){c.TryObtain, c.Obtain} {
		_, err := obtain(ctx, "", time.Second)
		require.ErrorIs(t, err, contend.ErrInvalid, "empty key")
		// A '}' would end the key's hash tag early: "}job" leaves it empty,
		// and the lock's keys on different Cluster slots.
		for _, key := range []string{"}job", "a}b", "}"} {
			_, err := obtain(ctx, key, time.Second)
			require.ErrorIs(t, err, contend.ErrInvalid, "key %q", key)
		}
		for _, ttl := range []time.Duration{0, -time.Second, time.Millisecond, distlock.MinTTL - 1, math.MaxInt64} {
			_, err := obtain(ctx, "job", ttl)
			require.ErrorIs(t, err, contend.ErrInvalid, "ttl %v", ttl)
		}
	}
	ran := false
	require.ErrorIs(t, c.Do(ctx, "", func(context.Context) error { ran = true; return nil }), contend.ErrInvalid)
	require.ErrorIs(t, c.Do(ctx, "job", nil), contend.ErrInvalid)
	require.False(t, ran)

	l, err := c.TryObtain(ctx, "job", time.Second)
	require.NoError(t, err)
	require.ErrorIs(t, l.Refresh(ctx, -time.Second), contend.ErrInvalid)
	require.ErrorIs(t, l.Refresh(ctx, time.Millisecond), contend.ErrInvalid)
	require.NoError(t, l.Release(ctx))

	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1, "refused input wrote nothing but the one lock's fencing counter: %v", keys)
}

func TestNewQuorumRefusesBadInput(t *testing.T) {
	t.Parallel()
	rdb, _ := redisOnly(t)
	_, err := distlock.NewQuorum(nil, distlock.QuorumConfig{})
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = distlock.NewQuorum([]redis.Scripter{rdb, nil, rdb}, distlock.QuorumConfig{})
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = distlock.NewQuorum([]redis.Scripter{rdb, (*redis.Client)(nil), rdb}, distlock.QuorumConfig{})
	require.ErrorIs(t, err, contend.ErrInvalid)
	for name, cfg := range map[string]distlock.QuorumConfig{
		"negative TTL":          {TTL: -time.Second},
		"TTL below the minimum": {TTL: time.Millisecond},
		"negative MaxWait":      {MaxWait: -time.Second},
		"negative NodeTimeout":  {NodeTimeout: -time.Second},
		"drift over half":       {DriftFactor: 0.6},
		"negative drift":        {DriftFactor: -0.1},
		"prefix with a brace":   {Prefix: "app{x}:"},
	} {
		_, err := distlock.NewQuorum([]redis.Scripter{rdb}, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	q, err := distlock.NewQuorum([]redis.Scripter{rdb}, distlock.QuorumConfig{})
	require.NoError(t, err)
	_, err = q.TryObtain(t.Context(), "", time.Second)
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = q.TryObtain(t.Context(), "}job", time.Second)
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = q.Obtain(t.Context(), "job", 0)
	require.ErrorIs(t, err, contend.ErrInvalid)
	require.ErrorIs(t, q.Do(t.Context(), "job", nil), contend.ErrInvalid)
}
