// Package faultproxy is a TCP proxy for tests that injects network faults
// between a real client (go-redis, a database driver) and a real server, so a
// fault test exercises the client's own timeouts, retries and reconnects
// instead of a fake that fails on cue.
//
// Each fault reproduces something production does:
//
//   - [Proxy.Blackhole] is a partition, or a peer that froze (a long GC pause,
//     a SIGSTOPped or migrating VM, a firewall or NAT that forgot the flow and
//     now drops its packets). Nothing arrives and nothing is refused: no FIN,
//     no RST, and connect still succeeds. The client learns of it only from
//     its own timers. A side that closes during the blackhole is not heard by
//     the other side either: the server keeps the session (and whatever it
//     holds) as a real server does until its keepalive gives up.
//   - [Proxy.SetLatency] is a slow or distant link (another zone, a loaded
//     network): every exchange takes longer, and margins computed from a
//     timeout or a lease shrink by the round trip.
//   - [Proxy.Reset] is a server crash or restart, a failover, or a load
//     balancer dropping its flows: every open connection fails with
//     "connection reset by peer" while new connections work.
//   - [Proxy.DropNextReply] is the reply lost after the command ran: the
//     server executed it, then the connection broke or stalled before the
//     answer arrived. The client cannot tell "not run" from "run, unheard",
//     and a client that retries on timeout (go-redis does) runs it twice.
//
// Faults act on chunks: whatever one read from a socket returned. Bytes that
// arrive while a fault discards them are gone for good; they are not
// delivered after [Proxy.Heal] (unlike a real short partition, where TCP
// would retransmit them). A connection that carried traffic during a
// blackhole is therefore out of step once healed and should not be reused;
// go-redis drops a connection after a timeout anyway.
package faultproxy

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// A Proxy forwards connections to one target and applies the faults its
// methods switch on. Its methods are safe for concurrent use.
type Proxy struct {
	t      testing.TB
	target string
	ln     *net.TCPListener
	ctx    context.Context // cancelled when the proxy closes, to stop a dial
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection's goroutines

	mu        sync.Mutex // protects the fields below and every link's flags
	links     map[*link]struct{}
	closed    bool
	blackhole bool
	latency   time.Duration
	dropNext  bool
	dropTo    []byte // DropReplyTo's request text, nil when not armed
}

// A link is one client connection and the server connection made for it.
type link struct {
	client, server *net.TCPConn
	done           chan struct{} // closed by teardown, to end a latency wait

	// Guarded by Proxy.mu.
	gone     bool // torn down: both sockets closed
	muted    bool // a reply was dropped: nothing more goes to the client
	dropNext bool // the next reply on this link is to be dropped (DropReplyTo)
	orphaned bool // one side ended during a blackhole; the other was not told
}

// Start listens on 127.0.0.1:0 and forwards every accepted connection to
// target ("host:port"). When t ends the listener and every connection are
// closed and every goroutine of the proxy is waited for.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("faultproxy: listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{t: t, target: target, ln: ln, ctx: ctx, cancel: cancel, links: map[*link]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// Addr is the address to point a client at, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole stops forwarding in both directions, on open and new connections
// alike, and discards what it reads instead. No connection is closed and
// nothing is sent: each side sees silence. A new connection is accepted and
// dialled to the target (a real partition would stall the handshake too), but
// carries nothing. A side that closes during the blackhole is not told to the
// other side; [Proxy.Heal] resets what it left open.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole = true
}

// SetLatency delays each chunk by d before it is forwarded, in both
// directions, keeping order. The delay is served chunk by chunk, so it also
// caps throughput (about 32 KiB per d per direction): fine for commands,
// slow for bulk transfers. 0 turns it off.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Reset closes every open connection with an RST (SetLinger(0)) on both
// sides, as a crashed server's host or a restarted load balancer does. The
// faults switched on stay on; new connections work as they would without it.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		p.teardownLocked(l, true)
	}
}

// DropNextReply discards the next chunk the server sends on any connection,
// and mutes that connection towards the client for the rest of its life, so
// the command has run on the server but the client never hears. What the
// client sends still reaches the server. Other connections are untouched.
func (p *Proxy) DropNextReply() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropNext = true
}

// DropReplyTo is [Proxy.DropNextReply] for one request: the next chunk a
// client sends that contains request (a command's name as the protocol
// spells it, "XADD", in any case) arms it, and the next chunk the server sends on that
// connection is the one dropped. Replies on other connections, which may
// come first (a blocking read's answer), are untouched.
func (p *Proxy) DropReplyTo(request string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropTo = bytes.ToLower([]byte(request))
}

// Heal turns off Blackhole, latency and a DropNextReply not yet spent. What a
// fault discarded stays lost, and a connection muted by DropNextReply stays
// muted. A connection one side of which closed during the blackhole is reset
// on its other side, as that side's retransmission meeting a forgotten socket
// would be.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole, p.latency, p.dropNext, p.dropTo = false, 0, false, nil
	for l := range p.links {
		if l.orphaned {
			p.teardownLocked(l, true)
		}
	}
}

// Conns is the number of connections the proxy holds open: accepted and not
// torn down, including one whose client left during a blackhole (its server
// side is still open until Heal). Tests wait on it.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.AcceptTCP()
		if err != nil {
			return // the listener was closed by close
		}
		p.wg.Go(func() { p.serve(client) })
	}
}

// serve dials the target for client and forwards between them until the link
// is torn down.
func (p *Proxy) serve(client *net.TCPConn) {
	var d net.Dialer
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		if p.ctx.Err() == nil {
			p.t.Logf("faultproxy: dial %s: %v", p.target, err)
		}
		// Reset, the nearest thing to a refused connect once accepted: the
		// client fails at once instead of waiting for a reply.
		_ = client.SetLinger(0)
		_ = client.Close()
		return
	}
	l := &link{client: client, server: server.(*net.TCPConn), done: make(chan struct{})}
	p.mu.Lock()
	p.links[l] = struct{}{}
	if p.closed {
		p.teardownLocked(l, false) // close ran while we dialled
	}
	p.mu.Unlock()
	p.wg.Go(func() { p.pump(l, l.client, l.server, false) })
	p.pump(l, l.server, l.client, true)
}

// pump copies src to dst one chunk at a time, applying the faults, until a
// side fails or the link is torn down.
func (p *Proxy) pump(l *link, src, dst *net.TCPConn, toClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := p.delay(); d > 0 {
				select {
				case <-time.After(d):
				case <-l.done:
					return
				}
			}
			// Decided after the delay, so a chunk still delayed when a
			// blackhole starts is lost with the others.
			if p.forward(l, toClient, buf[:n]) {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					err = werr
				}
			}
		}
		if err != nil {
			p.ended(l)
			return
		}
	}
}

func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

// forward reports whether chunk, read from one side of l, goes on to the
// other side, spending a pending DropNextReply on it if it is a reply, and
// arming l's if it is the request DropReplyTo waits for.
func (p *Proxy) forward(l *link, toClient bool, chunk []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case l.gone, p.blackhole:
		return false
	case toClient && l.muted:
		return false
	case toClient && (p.dropNext || l.dropNext):
		if !l.dropNext {
			p.dropNext = false
		}
		l.dropNext, l.muted = false, true
		return false
	case !toClient && p.dropTo != nil && bytes.Contains(bytes.ToLower(chunk), p.dropTo):
		p.dropTo, l.dropNext = nil, true
	}
	return true
}

// ended handles the end of one direction of l: its source closed or failed,
// or its destination failed.
func (p *Proxy) ended(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole && !l.gone {
		// A partition carries no FIN: the other side stays open, in silence.
		l.orphaned = true
		return
	}
	p.teardownLocked(l, false)
}

// teardownLocked closes both sockets of l, with an RST if rst, and forgets
// l. Closing them ends both pumps. p.mu must be held.
func (p *Proxy) teardownLocked(l *link, rst bool) {
	if l.gone {
		return
	}
	l.gone = true
	delete(p.links, l)
	close(l.done)
	for _, c := range []*net.TCPConn{l.client, l.server} {
		if rst {
			_ = c.SetLinger(0)
		}
		_ = c.Close()
	}
}

// close shuts the proxy down and waits for all its goroutines.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	for l := range p.links {
		p.teardownLocked(l, false)
	}
	p.mu.Unlock()
	p.cancel()
	_ = p.ln.Close()
	p.wg.Wait()
}
