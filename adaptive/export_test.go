package adaptive

import (
	"database/sql"

	"github.com/contend/contend/internal/sqldb"
)

// Pin makes every call of g run in m, whatever its keys' rates, and record
// nothing: for tests that mix the modes on purpose. Call it before g's first
// call.
func (g *Guard) Pin(m Mode) {
	g.pinned, g.pin = true, m
}

// SkipBump makes g's locked path lock the row without moving its version:
// the negative control of the mixed-mode test. Call it before g's first call.
func (g *Guard) SkipBump() {
	if g.db.Dialect() == sqldb.MySQL {
		// No FOR NO KEY UPDATE there, and a SELECT counts no rows: an
		// update that changes nothing locks the row, and counts it under
		// clientFoundRows.
		g.lockSQL = `UPDATE ` + g.table + ` SET ` + g.key + ` = ` + g.key + ` WHERE ` + g.key + ` = ?`
		return
	}
	g.lockSQL = `SELECT 1 FROM ` + g.table + ` WHERE ` + g.key + ` = $1 FOR NO KEY UPDATE`
}

// Isolation makes g's locked path begin its transactions at level: for the
// negative control of the nested-lock test. Call it before g's first call.
func (g *Guard) Isolation(level sql.IsolationLevel) {
	g.opts.Tx = &sql.TxOptions{Isolation: level}
}

// Window is about how many samples a key's conflict rate averages over.
const Window = window

// Record adds samples observations, conflicts of them conflicts, to key's
// rate, as g's calls do, and returns key's mode after them: for tests that
// turn a key hot at a chosen moment.
func (g *Guard) Record(key string, samples, conflicts int) Mode {
	return g.stats.record(key, samples, conflicts)
}
