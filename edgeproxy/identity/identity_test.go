package identity

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestIdentityRefusesACertificateOutsideSystemNodes: every way the edge
// reads a node name from a certificate (the tunnel's --cert, the
// apiserver proxy's kubeconfig with the certificate inline or in files,
// a stored bootstrap certificate) takes CN=system:node:<name> only with
// O=system:nodes, as the gateway and the pool's peers do. The kubeconfig
// with an inline certificate used to take the CN alone.
func TestIdentityRefusesACertificateOutsideSystemNodes(t *testing.T) {
	ca := testenv.MustCA(t, "identity-test")
	node, _ := ca.NodeCert("edge-5")
	notNode, _ := ca.ClientCert("system:node:edge-5", "system:authenticated")
	for _, c := range []struct {
		name string
		kp   *testenv.KeyPair
		want string
	}{
		{"node", node, "edge-5"},
		{"not in system:nodes", notNode, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			certFile, keyFile, err := c.kp.WriteFiles(dir, "client")
			if err != nil {
				t.Fatal(err)
			}
			for _, inline := range []bool{true, false} {
				id := start(t, Options{Kubeconfig: writeKubeconfig(t, dir, c.kp, certFile, keyFile, inline)})
				acc, err := id.APIServer()
				if err != nil {
					t.Fatal(err)
				}
				if acc.Node != c.want || id.Name() != c.want {
					t.Errorf("kubeconfig (inline %v): node %q, identity's %q, want %q", inline, acc.Node, id.Name(), c.want)
				}
			}

			id := start(t, Options{Cert: certFile, Key: keyFile})
			if _, err := id.Tunnel(); (err == nil) != (c.want != "") {
				t.Errorf("tunnel: err %v", err)
			}

			cert, err := tls.X509KeyPair(c.kp.CertPEM, c.kp.KeyPEM)
			if err != nil {
				t.Fatal(err)
			}
			if got := isNode("edge-5")(&cert); got != (c.want != "") {
				t.Errorf("stored bootstrap certificate accepted: %v", got)
			}
		})
	}
}

// start starts an identity with opts, logging nowhere.
func start(t *testing.T, opts Options) *Identity {
	t.Helper()
	opts.Logger = slog.New(slog.DiscardHandler)
	id, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(id.Stop)
	return id
}

// writeKubeconfig writes a kubeconfig with kp's certificate, inline or as
// the two files.
func writeKubeconfig(t *testing.T, dir string, kp *testenv.KeyPair, certFile, keyFile string, inline bool) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	if inline {
		kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CertPEM, ClientKeyData: kp.KeyPEM}
	} else {
		kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile}
	}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestIdentityLoadsAndWatchesEachPairOnce: the tunnel's --cert and the
// kubeconfig naming the same files share one loaded certificate, watched
// once, and a rotation reaches both users.
func TestIdentityLoadsAndWatchesEachPairOnce(t *testing.T) {
	ca := testenv.MustCA(t, "identity-test")
	node, _ := ca.NodeCert("edge-6")
	dir := t.TempDir()
	certFile, keyFile, err := node.WriteFiles(dir, "client")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	id := start(t, Options{Cert: certFile, Key: keyFile, Kubeconfig: writeKubeconfig(t, dir, node, certFile, keyFile, false)})
	tunCert, err := id.Tunnel()
	if err != nil {
		t.Fatal(err)
	}
	acc, err := id.APIServer()
	if err != nil {
		t.Fatal(err)
	}
	if tunCert != acc.Cert || len(id.pairs) != 1 {
		t.Fatalf("the tunnel and the proxy hold %p and %p; %d pairs loaded", tunCert, acc.Cert, len(id.pairs))
	}
	if id.Name() != "edge-6" {
		t.Errorf("node %q", id.Name())
	}
	var tunnelRotations, proxyRotations atomic.Int32
	tunCert.OnRotate("tunnel", log, func() { tunnelRotations.Add(1) })
	acc.Cert.OnRotate("proxy", log, func() { proxyRotations.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		id.Watch(ctx, 20*time.Millisecond)
	}()
	defer func() { cancel(); <-done }()

	rotated, _ := ca.NodeCert("edge-6")
	if err := os.WriteFile(keyFile, rotated.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, rotated.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the rotation told to the tunnel and the proxy", func() bool {
		return tunnelRotations.Load() > 0 && proxyRotations.Load() > 0
	})
	cur, err := acc.TLS.GetClientCertificate(nil)
	if err != nil || !bytes.Equal(cur.Certificate[0], rotated.Cert.Raw) {
		t.Errorf("the proxy presents %v, %v after the rotation", cur, err)
	}
}
