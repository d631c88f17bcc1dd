package edgeproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// TestRunTunnelReachesPods starts tether-edge with a gateway and the
// apiserver proxy against a real kube-apiserver, as node edge-1 whose pod
// range is 192.0.2.0/24 (no host address of the test's): the tunnel
// dials its pod on a declared port (the dial itself fails, nothing
// listens there, but it is not refused), refuses other ports and
// addresses, and does so again after a restart without the cloud, from
// the cache the pod informers filled.
func TestRunTunnelReachesPods(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := cp.Client.CoreV1()
	if _, err := admin.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"},
		Spec: corev1.NodeSpec{PodCIDR: "192.0.2.0/24", PodCIDRs: []string{"192.0.2.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const ns = "shop"
	if _, err := admin.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := admin.Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{NodeName: "edge-1", AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1",
				Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase, pod.Status.PodIP, pod.Status.PodIPs = corev1.PodRunning, "192.0.2.7", []corev1.PodIP{{IP: "192.0.2.7"}}
	if _, err := admin.Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	node, err := cp.CA.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	pem := filepath.Join(dir, "kubelet-client-current.pem")
	if err := os.WriteFile(pem, append(node.CertPEM, node.KeyPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	caFile, err := cp.CA.WriteFile(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := cp.CA.ServerCert("gateway", "gw.test")
	ln, err := quic.ListenAddr("127.0.0.1:0",
		tunnel.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &srv.TLS, nil }, cp.CA.Pool()),
		tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	cfg := DefaultConfig()
	cfg.Gateway = []string{ln.Addr().String()}
	cfg.GatewayCA = caFile
	cfg.GatewayServerName = "gw.test"
	cfg.Cert, cfg.Key = pem, pem
	cfg.ServerAddr, cfg.ServerCA = []string{cp.URL}, caFile
	cfg.APIServerListen = freePort(t)
	cfg.AdminListen = ""
	cfg.PoolListen = ""
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Logger = slog.New(slog.DiscardHandler)

	// run starts tether-edge and returns the gateway's connection to it
	// and a function that stops it.
	run := func(cfg Config) (*quic.Conn, func()) {
		t.Helper()
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(rctx, cfg) }()
		actx, acancel := context.WithTimeout(ctx, 30*time.Second)
		defer acancel()
		conn, err := ln.Accept(actx)
		if err != nil {
			stop()
			t.Fatal(err)
		}
		return conn, func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			conn.CloseWithError(0, "")
		}
	}
	ask := func(conn *quic.Conn, dest string) tunnel.Reply {
		t.Helper()
		s, err := conn.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.CancelRead(0)
		if err := tunnel.WriteRequest(s, tunnel.Request{Dest: netip.MustParseAddrPort(dest)}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s.SetReadDeadline(time.Now().Add(30 * time.Second))
		rep, err := tunnel.ReadReply(s)
		var refused *tunnel.RefusedError
		if err != nil && !errors.As(err, &refused) {
			t.Fatalf("reply to %s: %v", dest, err)
		}
		return rep
	}
	// check waits until the pod is known (NotAllowed before), then
	// checks that its declared port is dialled and other ports and
	// addresses are refused.
	check := func(conn *quic.Conn) {
		t.Helper()
		var rep tunnel.Reply
		testenv.Eventually(t, "the pod's declared port dialled", func() bool {
			rep = ask(conn, "192.0.2.7:9100")
			return rep.Code != tunnel.NotAllowed
		})
		if rep.Code != tunnel.Timeout && rep.Code != tunnel.DialFailed {
			t.Errorf("192.0.2.7:9100: %v %q, want a failed dial", rep.Code, rep.Message)
		}
		for dest, want := range map[string]string{
			"192.0.2.7:22":   "192.0.2.7:22 is not an allowed port of pod shop/web",
			"192.0.2.9:9100": "192.0.2.9 is in this node's pod range but no pod of this node has it",
		} {
			if rep := ask(conn, dest); rep.Code != tunnel.NotAllowed || !strings.Contains(rep.Message, want) {
				t.Errorf("%s: %v %q, want not allowed: %s", dest, rep.Code, rep.Message, want)
			}
		}
	}

	conn, stop := run(cfg)
	check(conn)
	stop()

	// Restarted with the cloud out of reach: the pods come from the cache.
	offline := cfg
	offline.ServerAddr = []string{"https://" + freePort(t)}
	conn, stop = run(offline)
	defer stop()
	check(conn)
}
