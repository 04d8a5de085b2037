package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// The README's program sells exactly the stock, and again when run twice.
func TestQuickstart(t *testing.T) {
	dsn := testserver.Postgres(t)
	for range 2 {
		sold, left, err := run(t.Context(), dsn)
		require.NoError(t, err)
		require.Equal(t, 3, sold)
		require.Equal(t, 0, left)
	}
}
