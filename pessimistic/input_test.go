package pessimistic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	products(t, db, 1, "p")
	for name, cfg := range map[string]pessimistic.LockerConfig{
		"no table":          {},
		"injected table":    {Table: "products; DROP TABLE products"},
		"quoted key column": {Table: "products", KeyColumn: `id" = id OR "id`},
		"spaced key column": {Table: "products", KeyColumn: "id or 1=1"},
		"three-part name":   {Table: "a.b.products"},
		"leading digit":     {Table: "1products"},
		"unknown strength":  {Table: "products", Strength: 7},
		"unknown mode":      {Table: "products", OnHeld: -1},
		"negative timeout":  {Table: "products", LockTimeout: -time.Second},
		"negative finish":   {Table: "products", FinishTimeout: -time.Second},
	} {
		_, err := pessimistic.NewLocker(db, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	_, err := pessimistic.NewLocker(nil, pessimistic.LockerConfig{Table: "products"})
	require.ErrorIs(t, err, contend.ErrInvalid, "nil db")

	for name, cfg := range map[string]pessimistic.AdvisoryConfig{
		"skip locked":      {OnHeld: pessimistic.SkipLocked},
		"unknown mode":     {OnHeld: 9},
		"negative timeout": {LockTimeout: -time.Millisecond},
		"negative finish":  {FinishTimeout: -time.Millisecond},
	} {
		_, err := pessimistic.NewAdvisory(db, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	_, err = pessimistic.NewAdvisory(nil, pessimistic.AdvisoryConfig{})
	require.ErrorIs(t, err, contend.ErrInvalid, "nil db")

	// A well-formed name that does not exist is the server's error, at the
	// first lock (New does no I/O), and not mistaken for a lost race.
	l, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "nosuchtable"})
	require.NoError(t, err)
	err = l.Do(t.Context(), "p", func(context.Context) error { return nil })
	require.ErrorContains(t, err, "nosuchtable")
	require.NotErrorIs(t, err, contend.ErrConflict)
	require.NotErrorIs(t, err, contend.ErrNotFound)

	require.Equal(t, 1, stockOf(t, db, "p"), "the injection attempts reached nothing")
}

func TestCallsRefuseBadInput(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 1, "p")
	l := newLocker(t, db, pessimistic.LockerConfig{})
	a := advisory(t, db, pessimistic.AdvisoryConfig{})
	ctx := t.Context()
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	manyFn := func(context.Context, contend.DBTX, []string) error { ran = true; return nil }

	for name, err := range map[string]error{
		"Do empty key":          l.Do(ctx, "", fn),
		"Do nil fn":             l.Do(ctx, "p", nil),
		"LockMany no keys":      l.LockMany(ctx, nil, manyFn),
		"LockMany empty key":    l.LockMany(ctx, []string{"p", ""}, manyFn),
		"LockMany nil fn":       l.LockMany(ctx, []string{"p"}, nil),
		"Claim zero":            l.Claim(ctx, 0, manyFn),
		"Claim negative":        l.Claim(ctx, -1, manyFn),
		"Claim nil fn":          l.Claim(ctx, 1, nil),
		"advisory Do empty key": a.Do(ctx, "", fn),
		"advisory Do nil fn":    a.Do(ctx, "k", nil),
	} {
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	require.False(t, ran)
	requireFree(t, db, "p")
}
