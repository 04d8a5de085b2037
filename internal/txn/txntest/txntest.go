// Package txntest holds what the SQL strategies' tests share about
// transactions: a handle of a kind the library does not know, and the fault
// scenarios every SQL guard is run through.
package txntest

import (
	neturl "net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/faultproxy"
)

// Wrapped is a handle as applications wrap theirs for logging or metrics: it
// has [contend.DBTX]'s methods and nothing else, so nothing tells whether it
// stands for a pool or for a transaction.
type Wrapped struct{ contend.DBTX }

// IdleInTransaction is the idle_in_transaction_session_timeout of the
// sessions [Proxied] opens (MariaDB's idle_transaction_timeout, in whole
// seconds): how long the server keeps a transaction whose client has gone
// silent before it ends the session and lets go of its locks.
const IdleInTransaction = time.Second

// Proxied starts a fault proxy in front of the server that url names (a
// PostgreSQL URL, or a mysql:// URL of MariaDB) and returns it with url
// pointed at it. The sessions opened through it end on the server after
// [IdleInTransaction] spent idle in a transaction.
func Proxied(t testing.TB, url string) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	p := faultproxy.Start(t, u.Host)
	u.Host = p.Addr()
	q := u.Query()
	if u.Scheme == "mysql" {
		q.Set("idle_transaction_timeout", strconv.FormatInt(int64(IdleInTransaction/time.Second), 10))
	} else {
		q.Set("idle_in_transaction_session_timeout", strconv.FormatInt(IdleInTransaction.Milliseconds(), 10))
	}
	u.RawQuery = q.Encode()
	return p, u.String()
}
