package adaptive

// Pin makes every call of g run in m, whatever its keys' rates, and record
// nothing: for tests that mix the modes on purpose. Call it before g's first
// call.
func (g *Guard) Pin(m Mode) {
	g.pinned, g.pin = true, m
}

// SkipBump makes g's locked path lock the row without moving its version:
// the negative control of the mixed-mode test. Call it before g's first call.
func (g *Guard) SkipBump() {
	g.lockSQL = `SELECT 1 FROM ` + g.table + ` WHERE ` + g.key + ` = $1 FOR NO KEY UPDATE`
}
