package contend_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
)

func TestQuerierFallsBackToDB(t *testing.T) {
	t.Parallel()
	db := &sql.DB{}
	require.Same(t, db, contend.Querier(t.Context(), db))
}

func TestQuerierReturnsTheGuardsTransaction(t *testing.T) {
	t.Parallel()
	db, tx := &sql.DB{}, &sql.Tx{}
	ctx := contend.WithQuerier(t.Context(), tx)
	require.Same(t, tx, contend.Querier(ctx, db))
	// A context derived from fn's keeps the transaction.
	child, cancel := context.WithCancel(ctx)
	defer cancel()
	require.Same(t, tx, contend.Querier(child, db))
}
