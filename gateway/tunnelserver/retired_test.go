package tunnelserver

import (
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/internal/retired"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// retiredSet is a Retired whose set a test changes.
type retiredSet struct{ s atomic.Pointer[retired.Set] }

func (r *retiredSet) Retired(node string, cert *x509.Certificate) bool {
	s := r.s.Load()
	return s != nil && s.Retires(node, cert)
}

// A retired node identity: its live tunnel is closed at once, its next
// handshake refused, and a stream it opens before the close is never
// served; the other edges stay, and a certificate issued for the same
// name after the retirement (a new machine) is let in.
func TestRetiredIdentity(t *testing.T) {
	rs := &retiredSet{}
	el := &recordingElections{calls: make(chan electionCall, 4), reply: tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.OK}}}
	f := startWith(t, func(o *Options) { o.Retired = rs; o.Elections = el })
	stolen := f.node("edge-1") // NotBefore: a minute ago
	honest := f.node("edge-2")
	evictions := func() float64 {
		v, err := metrictest.Value(f.srv.evictions, "tether_gateway_tunnel_evictions_total", "reason="+resultRetired)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// Retired now: a stream it opens is not served, even before the
	// gateway is told to close the retired tunnels.
	at := time.Now().Add(-5 * time.Second) // after edge-1's NotBefore, a minute ago
	rs.s.Store(&retired.Set{"edge-1": at})
	raw, err := tunnel.AppendElectionRequest(nil, tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection, Pool: "shop",
		ConfigMap: []byte(`{"metadata":{"name":"pool-shop"}}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := elect(t, stolen, raw); err == nil {
		t.Fatal("a retired certificate's election request was answered")
	}
	if code, ok := stolen.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseNotAllowed {
		t.Fatalf("retired tunnel closed with %v (by gateway: %v), want CloseNotAllowed", code, ok)
	}
	select {
	case c := <-el.calls:
		t.Fatalf("a retired certificate's election request reached the handler: %+v", c)
	default:
	}
	if got := evictions(); got != 1 {
		t.Errorf("retired evictions %v, want 1", got)
	}

	// The same key again: refused during the handshake.
	old, err := f.ca.Issue(testenv.Template{CommonName: "system:node:edge-1", Organizations: []string{"system:nodes"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, NotBefore: at.Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	before := f.counter(resultRetired)
	f.refusedHandshake(old.TLS)
	if got := f.counter(resultRetired); got != before+1 {
		t.Errorf("retired refusals %v, want %v", got, before+1)
	}
	if _, ok := f.reg.Lookup("edge-1"); ok {
		t.Fatal("the retired identity is registered")
	}

	// CloseRetired closes the tunnels a change of the set retires.
	rs.s.Store(&retired.Set{"edge-1": at, "edge-2": time.Now()})
	f.srv.CloseRetired()
	if code, ok := honest.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseNotAllowed {
		t.Fatalf("edge-2's tunnel closed with %v (by gateway: %v), want CloseNotAllowed", code, ok)
	}
	if got := evictions(); got != 2 {
		t.Errorf("retired evictions %v, want 2", got)
	}

	// A new machine under the retired name, its certificate issued after
	// the retirement, is let in; and so is an edge never retired.
	renewed, err := f.ca.Issue(testenv.Template{CommonName: "system:node:edge-1", Organizations: []string{"system:nodes"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, NotBefore: at.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.dial(renewed.TLS, f.ca); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "edge-1 registered again", func() bool { _, ok := f.reg.Lookup("edge-1"); return ok })
	f.streamWorks("edge-1")
	f.node("edge-3")
	f.streamWorks("edge-3")
}
