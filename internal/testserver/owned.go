package testserver

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"testing"
)

// owned is a throwaway server that belongs to one test, which may stop it
// and start it again on the same port.
type owned struct {
	d    daemon
	port int
	p    *process // nil while stopped
}

// own starts d for t on a free port of 127.0.0.1, stopped and its directory
// removed when t ends.
func own(t testing.TB, d daemon) *owned {
	t.Helper()
	o := &owned{d: d}
	t.Cleanup(func() {
		if err := o.remove(); err != nil {
			t.Errorf("testserver: owned %s: %v", d.name, err)
		}
	})
	if err := o.startOnFreePort(); err != nil {
		t.Fatalf("testserver: owned %s: %v", d.name, err)
	}
	return o
}

// startOnFreePort starts the server on a free port. The port is free when
// picked but may be taken before the server binds it; one more port then,
// as launch does.
func (o *owned) startOnFreePort() error {
	for attempt := 1; ; attempt++ {
		var err error
		if o.port, err = freePort(); err != nil {
			return err
		}
		if err = o.Start(); err == nil || attempt == 2 {
			return err
		}
	}
}

// remove stops the server and removes its directory.
func (o *owned) remove() error { return errors.Join(o.Stop(), removeDir(o.d.dir)) }

// Addr is the server's host:port; it stays the same across restarts.
func (o *owned) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(o.port)) }

// URL is the server's URL.
func (o *owned) URL() string { return o.d.url(o.port) }

// Running reports whether the server is up (as far as this type knows).
func (o *owned) Running() bool { return o.p != nil }

// Stop shuts the server down and waits for it. Stopping a stopped server
// does nothing.
func (o *owned) Stop() error {
	if o.p == nil {
		return nil
	}
	err := o.p.halt()
	o.p = nil
	return err
}

// Kill ends the server at once with SIGKILL, as a crash or a lost machine
// does: it answers nothing more and says goodbye to nobody. Killing a
// stopped server does nothing.
func (o *owned) Kill() error {
	if o.p == nil {
		return nil
	}
	p := o.p
	o.p = nil
	if err := p.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("testserver: kill %s: %w", o.d.name, err)
	}
	_ = p.cmd.Wait() // "signal: killed"
	return nil
}

// Start starts the stopped server again, on the same port, and waits until
// it answers. Starting a running server does nothing.
func (o *owned) Start() error {
	if o.p != nil {
		return nil
	}
	p, err := o.d.start(o.port, filepath.Join(o.d.dir, o.d.name+".log"))
	if err != nil {
		return err
	}
	exited, err := p.waitReady(o.Addr(), o.URL(), o.d.ready)
	if err != nil {
		if !exited {
			err = errors.Join(err, p.halt())
		}
		return err
	}
	o.p = p
	return nil
}

// Restart stops the server and starts it again on the same port: every
// connection is dropped.
func (o *owned) Restart() error {
	if err := o.Stop(); err != nil {
		return err
	}
	return o.Start()
}
