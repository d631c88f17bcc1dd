// Package accepttest helps test servers' accept loops.
package accepttest

import (
	"net"
	"os"
	"sync/atomic"
	"syscall"
)

// Listener is a real listener whose Accept fails with EMFILE while it is
// set failing, as Accept does in a process out of file descriptors: the
// call returns at once, and clients that connect meanwhile wait in the
// kernel's backlog until an Accept after SetFailing(false) takes them.
type Listener struct {
	net.Listener
	failing  atomic.Bool
	failures atomic.Int64
}

// New wraps ln; failing is the initial state. Set it failing before the
// server's loop first calls Accept: a call already blocked in ln's Accept
// takes the next connection whatever the state.
func New(ln net.Listener, failing bool) *Listener {
	l := &Listener{Listener: ln}
	l.failing.Store(failing)
	return l
}

// SetFailing turns the failures on or off.
func (l *Listener) SetFailing(on bool) { l.failing.Store(on) }

// Failures is how many Accepts failed so far.
func (l *Listener) Failures() int64 { return l.failures.Load() }

// Accept fails with EMFILE while l is failing, else accepts from the
// wrapped listener.
func (l *Listener) Accept() (net.Conn, error) {
	if l.failing.Load() {
		l.failures.Add(1)
		return nil, &net.OpError{Op: "accept", Net: l.Addr().Network(), Addr: l.Addr(),
			Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}
