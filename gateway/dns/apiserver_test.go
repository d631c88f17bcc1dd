package dns_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/gateway/dns"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestNodeToAnswer wires nodewatch to the DNS server and the hosts
// ConfigMap writer as the gateway does, against a real kube-apiserver, and
// measures how long a node written to the API takes to be answered (the
// issue asks for under 100 ms; the bound is generous, the figure is
// logged) and to disappear once deleted.
func TestNodeToAnswer(t *testing.T) {
	testenv.RequireRoot(t)
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	h := testenv.NewHost(t, "dns")
	c := cp.Client
	ctx, cancel := context.WithCancel(context.Background())

	w := nodewatch.New(c, nodewatch.Options{})
	s, err := dns.New(dns.Options{Zones: []string{"tether.internal."}})
	if err != nil {
		t.Fatal(err)
	}
	hw := dns.NewHostsWriter(c, dns.HostsOptions{Namespace: "kube-system", Name: "tether-nodes"})
	w.Subscribe(s.Update)
	w.Subscribe(hw.Update)

	pc, err := h.ListenPacket("udp", "127.0.0.1:53")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 3)
	go func() { done <- w.Run(ctx) }()
	go func() { done <- hw.Run(ctx) }()
	go func() { done <- s.Serve(ctx, pc, nil) }()
	t.Cleanup(func() {
		cancel()
		for range 3 {
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		}
	})
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := w.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}

	conn, err := h.DialContext(ctx, "udp", "127.0.0.1:53")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const name = "edge-new.tether.internal."
	if r := ask(t, conn, name); r.Rcode != mdns.RcodeNameError {
		t.Fatalf("before the node exists: %s, want NXDOMAIN", mdns.RcodeToString[r.Rcode])
	}

	// The node is created as kubelet does it: the object, then its
	// addresses in status. Only then does it have an answer.
	n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: "edge-new", Labels: map[string]string{nodewatch.EdgeLabel: "true"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.20.0.1"}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	r := waitAnswer(t, conn, name, written, 100*time.Millisecond, func(r *mdns.Msg) bool {
		return r.Rcode == mdns.RcodeSuccess && len(r.Answer) == 1
	})
	if a, ok := r.Answer[0].(*mdns.A); !ok || a.A.String() != "10.20.0.1" {
		t.Errorf("answer %v, want A 10.20.0.1", r.Answer[0])
	}
	t.Logf("node answered %v after UpdateStatus returned", time.Since(written).Round(10*time.Microsecond))
	waitConfigMap(t, cp, "10.20.0.1\tedge-new\n")

	if err := c.CoreV1().Nodes().Delete(ctx, "edge-new", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitAnswer(t, conn, name, deleted, 100*time.Millisecond, func(r *mdns.Msg) bool { return r.Rcode == mdns.RcodeNameError })
	t.Logf("node gone %v after Delete returned", time.Since(deleted).Round(10*time.Microsecond))
	waitConfigMap(t, cp, "")
}

// ask sends one A query over conn and returns the answer.
func ask(t *testing.T, conn net.Conn, name string) *mdns.Msg {
	t.Helper()
	q := new(mdns.Msg)
	q.SetQuestion(name, mdns.TypeA)
	dc := &mdns.Conn{Conn: conn}
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if err := dc.WriteMsg(q); err != nil {
		t.Fatalf("send query: %v", err)
	}
	for {
		r, err := dc.ReadMsg()
		if err != nil {
			t.Fatalf("read answer: %v", err)
		}
		if r.Id == q.Id {
			return r
		}
	}
}

// waitAnswer polls every 2 ms until done holds for the answer, failing if
// that takes longer than bound after since.
func waitAnswer(t *testing.T, conn net.Conn, name string, since time.Time, bound time.Duration, done func(*mdns.Msg) bool) *mdns.Msg {
	t.Helper()
	var r *mdns.Msg
	testenv.Eventually(t, "the answer for "+name+" to change", func() bool {
		r = ask(t, conn, name)
		return done(r)
	})
	if d := time.Since(since); d > bound {
		t.Errorf("answer changed after %v, want under %v", d, bound)
	}
	return r
}

// waitConfigMap waits until the hosts ConfigMap holds exactly want.
func waitConfigMap(t *testing.T, cp *testenv.ControlPlane, want string) {
	t.Helper()
	testenv.EventuallyNoError(t, "the hosts configmap to hold "+want, func() error {
		cm, err := cp.Client.CoreV1().ConfigMaps("kube-system").Get(t.Context(), "tether-nodes", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := cm.Data[dns.DefaultHostsKey]; got != want {
			return fmt.Errorf("it holds %q", got)
		}
		return nil
	})
}
