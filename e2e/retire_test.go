package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/retired"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// TestRetiredNode: the key of edge-2, a member of pool shop, is stolen
// and the thief keeps running the real tether-edge with it. The operator
// responds with `tetherctl node retire edge-2` (which also deletes the
// Node), with every shipped manifest applied. The thief's tunnel ends and
// its reconnections are refused, so it has no route, no election record
// and no delegated heartbeat; its key can register the Node again neither
// into a pool nor at all; the pool is led by the honest member. A new
// machine onboards under another name by registering itself, and under
// the same name with a certificate issued after the retirement, while the
// old key stays out.
func TestRetiredNode(t *testing.T) {
	testenv.RequireRoot(t)
	w := world.New(t, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: "shop", Hosts: []string{"edge-1", "edge-2"}, LAN: netip.MustParsePrefix("192.168.1.0/24")},
	}}, t.Logf)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	w.ApplyShipped(t, "edge-rbac.yaml", "pool-rbac.yaml", "node-admission.yaml")
	gw := w.Gateways[0]
	w.StartGateway(t, gw, "--netrules", "nftables")
	for _, e := range w.Edges {
		w.StartEdge(t, e, w.ProxyArgs(e)...)
	}
	w.RouteSitesVia(t, gw)
	if err := w.WaitReachable(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	honest, thief := w.Edge("edge-1"), w.Edge("edge-2")
	waitOneLeader(t, ctx, []*world.Edge{honest, thief}, nil, 60*time.Second)
	connected := func(node string) bool { return slices.Contains(connectedEdges(gatewayStatus(t, gw)), node) }
	testenv.Eventually(t, "both edges connected", func() bool { return connected(honest.Name) && connected(thief.Name) })
	stolen, err := tls.LoadX509KeyPair(thief.CertFile, thief.KeyFile)
	if err != nil {
		t.Fatal(err)
	}

	// The operator's response, from the cloud's client host.
	cmd := w.Client.Command(ctx, bins.Ctl, "node", "retire", thief.Name, "--kubeconfig", w.CP.AdminKubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tetherctl node retire: %v\n%s", err, out)
	}
	t.Logf("tetherctl node retire %s: %s", thief.Name, out)

	// Its tunnel ends, and the thief's tether-edge, which dials again, is
	// refused.
	testenv.Eventually(t, "the thief's tunnel closed and a reconnection refused", func() bool {
		return !connected(thief.Name) && gatewayMetric(t, gw, `tether_gateway_tunnel_connections_total{result="retired"}`) >= 1
	})
	if n := gatewayMetric(t, gw, `tether_gateway_tunnel_evictions_total{reason="retired"}`); n != 1 {
		t.Errorf("retired evictions %v, want 1", n)
	}
	// With the stolen key itself: refused in the handshake, so no stream
	// (election record, delegated heartbeat) can be sent.
	if conn, err := dialTunnel(ctx, thief.Host, gw, stolen, w.GatewayCA.Pool()); !refusedInHandshake(conn, err) {
		t.Errorf("the stolen key's tunnel: %v, want refused in the handshake", err)
	}

	// The key cannot bring its Node back, into a pool or at all.
	thiefAPI, _, _ := w.CP.NodeClient(t, thief.Name)
	// (Into a pool, both policies refuse it; without labels, the one of
	// the retired nodes.)
	for _, labels := range []map[string]string{{corev1.LabelHostname: thief.Name}, {world.PoolLabel: "shop", world.EdgeLabel: "true"}} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: thief.Name, Labels: labels}}
		testenv.EventuallyNoError(t, fmt.Sprintf("the thief's registration with %v refused", labels), func() error {
			_, err := thiefAPI.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'tether-") {
				return nil
			}
			return fmt.Errorf("last answer: %v", err)
		})
		_, err := thiefAPI.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || (labels[world.PoolLabel] == "" && !strings.Contains(err.Error(), "is retired")) {
			t.Errorf("the thief's registration with %v: %v, want refused (as retired, without labels)", labels, err)
		}
	}

	// The pool is the honest member's: it leads, and the election record
	// the gateway writes names it.
	waitOneLeader(t, ctx, []*world.Edge{honest}, nil, 90*time.Second)
	testenv.EventuallyWithin(t, 90*time.Second, "pool shop's record names "+honest.Name, func() bool {
		el, err := record.ReadLeader(ctx, w.CP.Client.CoreV1().ConfigMaps(record.Namespace), "shop")
		return err == nil && el.Holder == honest.Name
	})

	// A new machine under another name registers itself (with the
	// kubelet's labels and the edge label; the operator sets its pool)
	// and gets a tunnel.
	fresh, err := w.ClusterCA.NodeCert("edge-3")
	if err != nil {
		t.Fatal(err)
	}
	freshAPI, _, _ := w.CP.NodeClient(t, "edge-3")
	if _, err := freshAPI.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-3",
		Labels: map[string]string{corev1.LabelHostname: "edge-3", world.EdgeLabel: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("a new node registers itself: %v", err)
	}
	if _, err := dialTunnel(ctx, honest.Host, gw, fresh.TLS, w.GatewayCA.Pool()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "edge-3 connected", func() bool { return connected("edge-3") })

	// A new machine under the retired name: the operator creates its Node;
	// its certificate, issued after the retirement, gets a tunnel, and the
	// old key still none.
	cm, err := w.CP.Client.CoreV1().ConfigMaps(retired.Namespace).Get(ctx, retired.ConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at, err := retired.Parse(cm.Data[thief.Name])
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a second after the retirement", func() bool { return time.Now().After(at.Add(time.Second)) })
	renewed, err := w.ClusterCA.Issue(testenv.Template{CommonName: "system:node:" + thief.Name, Organizations: []string{"system:nodes"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, NotBefore: at.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.CP.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: thief.Name,
		Labels: map[string]string{world.EdgeLabel: "true", world.PoolLabel: "shop"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the operator re-creates the Node: %v", err)
	}
	conn, err := dialTunnel(ctx, honest.Host, gw, renewed.TLS, w.GatewayCA.Pool())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(tunnel.CloseNormal, "")
	testenv.Eventually(t, "the new "+thief.Name+" connected", func() bool { return connected(thief.Name) })
	if conn, err := dialTunnel(ctx, thief.Host, gw, stolen, w.GatewayCA.Pool()); !refusedInHandshake(conn, err) {
		t.Errorf("the stolen key's tunnel after the name came back: %v, want refused in the handshake", err)
	}
}
