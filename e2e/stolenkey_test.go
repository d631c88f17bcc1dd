package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// TestStolenNodeKey: the key of one edge node (edge-0, alone on site-x) is
// in an attacker's hands. With every shipped manifest applied (RBAC and the
// node admission policy), the attacker, who holds nothing but that node's
// identity, tries each way a node's key could reach beyond its own node. Its
// name sorts before every honest node's, so a tie broken by name order would
// go its way. Honest clients, which verify nothing (curl -k), must keep
// reaching the right kubelet throughout. It runs with each netrules
// backend.
func TestStolenNodeKey(t *testing.T) {
	testenv.RequireRoot(t)
	for _, backend := range []string{"nftables", "iptables"} {
		t.Run(backend, func(t *testing.T) { stolenNodeKey(t, backend) })
	}
}

func stolenNodeKey(t *testing.T, backend string) {
	w := world.New(t, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: "site-a", Hosts: []string{"edge-a1", "edge-a2"}, LAN: netip.MustParsePrefix("192.168.1.0/24")},
		{Name: "site-x", Hosts: []string{"edge-0"}, LAN: netip.MustParsePrefix("192.168.9.0/24")},
	}}, t.Logf)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w.ApplyShipped(t, "edge-rbac.yaml", "pool-rbac.yaml", "edge-bootstrap-rbac.yaml", "gateway-hosts-configmap-rbac.yaml", "node-admission.yaml")

	// A cloud node, not an edge: its stand-in kubelet runs on the apiserver
	// host, in the VPC.
	apiHost := w.Topo.Cloud("apiserver")
	world.StartKubelet(t, apiHost, "cloud-1", w.KubeletCA)
	cloudIP := apiHost.Addr.String()
	cloud := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cloud-1", Labels: map[string]string{corev1.LabelHostname: "cloud-1"}}}
	created, err := w.CP.Client.CoreV1().Nodes().Create(ctx, cloud, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: cloudIP}}
	if _, err := w.CP.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A second member of the thief's pool, with no machine: the thief,
	// leading the pool, may renew its Lease (and no further in time).
	member := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-0b", Labels: map[string]string{world.EdgeLabel: "true", world.PoolLabel: "site-x"}}}
	if _, err := w.CP.Client.CoreV1().Nodes().Create(ctx, member, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	gw := w.Gateways[0]
	w.StartGateway(t, gw, "--netrules", backend, "--dns-listen", ":53", "--dns-zone", world.Zone)
	// Every edge runs tether-edge with its apiserver proxy and its pool;
	// the thief runs the real one too, as a thief would.
	for _, e := range w.Edges {
		w.StartEdge(t, e, w.ProxyArgs(e)...)
	}
	w.RouteSitesVia(t, gw)
	if err := w.WaitReachable(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	honest, thief := w.Edge("edge-a1"), w.Edge("edge-0")
	honestIP := honest.Host.Addr.String()
	siteA := []*world.Edge{honest, w.Edge("edge-a2")}
	t.Logf("edges reachable; waiting for the pools' leaders")
	leaderA := waitOneLeader(t, ctx, siteA, nil, 60*time.Second)
	waitOneLeader(t, ctx, []*world.Edge{thief}, nil, 60*time.Second)
	holder := func(pool string) string {
		el, err := record.ReadLeader(ctx, w.CP.Client.CoreV1().ConfigMaps(record.Namespace), pool)
		if err != nil {
			return ""
		}
		return el.Holder
	}
	t.Logf("pool site-a led by %s, site-x by %s", leaderA.Name, thief.Name)
	if h := holder("site-a"); h != leaderA.Name {
		t.Fatalf("pool site-a's record names %q, its members follow %s", h, leaderA.Name)
	}

	// The thief's identity: a certificate for system:node:edge-0 from the
	// cluster CA, which is what the copied kubelet key is.
	stolen, _, _ := w.CP.NodeClient(t, thief.Name)
	// The admission policy applies once kube-apiserver's policy informer
	// has it, a moment after it is stored: wait for that with dry runs.
	untilRefusedByPolicy(t, ctx, "the thief's dry run of its own pool label", func(dryRun []string) error {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"site-a"}}}`, world.PoolLabel)
		_, err := stolen.CoreV1().Nodes().Patch(ctx, thief.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: dryRun})
		return err
	})
	setAddress := func(t *testing.T, addr string) {
		t.Helper()
		patch := fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":%q}]}}`, addr)
		if _, err := stolen.CoreV1().Nodes().Patch(ctx, thief.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("the node may write its own addresses (NodeRestriction allows it): %v", err)
		}
	}
	// answeredBy fetches /healthz from h with curl -k (no verification at
	// all) and returns the node whose stand-in kubelet answered.
	answeredBy := func(h *testenv.Host, addr string) string {
		out, _ := h.Command(ctx, "curl", "--silent", "--insecure", "--max-time", "5",
			fmt.Sprintf("https://%s:%d/healthz", addr, world.KubeletPort)).CombinedOutput()
		return strings.TrimPrefix(strings.TrimSpace(string(out)), "ok ")
	}
	waitRefusal := func(t *testing.T, want statusapi.AddressRefusal) {
		t.Helper()
		testenv.EventuallyWithin(t, 15*time.Second, fmt.Sprintf("the gateway to refuse %s's claim of %s (%s)", want.Node, want.Addr, want.Reason), func() bool {
			for _, r := range gatewayStatus(t, gw).AddressRefusals {
				if r == want {
					return true
				}
			}
			return false
		})
	}

	t.Run("AnotherEdgesAddress", func(t *testing.T) {
		// The world registered the Nodes as the operator, before the
		// admission policy stamped registrations: the operator pins the
		// honest node's address, which then beats the thief's claim
		// (e2e.TestAddressClaims has nodes register themselves).
		pin := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, nodewatch.RegisteredAnnotation, honestIP)
		if _, err := w.CP.Client.CoreV1().Nodes().Patch(ctx, honest.Name, types.MergePatchType, []byte(pin), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		setAddress(t, honestIP)
		waitRefusal(t, statusapi.AddressRefusal{Addr: netip.MustParseAddr(honestIP), Node: thief.Name, Reason: string(nodewatch.ReasonConflict), Holder: honest.Name})
		for i := range 10 {
			if got := answeredBy(w.Client, honestIP); got != honest.Name {
				t.Fatalf("connection %d of 10 to %s's address answered by %q", i+1, honest.Name, got)
			}
		}
		// DNS answers the honest node's name with its address, and the
		// thief's name with nothing it does not own.
		if out := dig(t, w.Client, gw, "+short", honest.Name+"."+world.Zone, "A"); strings.TrimSpace(out) != honestIP {
			t.Errorf("DNS for %s: %q, want %s", honest.Name, out, honestIP)
		}
		if out := dig(t, w.Client, gw, "+short", thief.Name+"."+world.Zone, "A"); strings.TrimSpace(out) != "" {
			t.Errorf("DNS for %s answers %q: an address it does not own", thief.Name, out)
		}
		if v := gatewayMetric(t, gw, `tether_gateway_address_refusals_total{reason="conflict"}`); v != 1 {
			t.Errorf("conflicts counted %v times, want once", v)
		}
		out, err := w.Client.Command(ctx, w.Bins.Ctl, "status", "--gateway", world.GatewayAdmin(gw, "")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "address claims not routed") || !strings.Contains(string(out), honestIP) {
			t.Errorf("tetherctl status does not show the conflict (%v):\n%s", err, out)
		}
	})

	t.Run("ACloudNodesAddress", func(t *testing.T) {
		setAddress(t, cloudIP)
		waitRefusal(t, statusapi.AddressRefusal{Addr: netip.MustParseAddr(cloudIP), Node: thief.Name, Reason: string(nodewatch.ReasonCloudNode)})
		// From the gateway host itself (its OUTPUT chain) and from a cloud
		// host whose route to the node passes through the gateway
		// (PREROUTING), the cloud node's own kubelet answers.
		if got := answeredBy(gw, cloudIP); got != "cloud-1" {
			t.Errorf("from the gateway host, %s:%d answered by %q, want cloud-1", cloudIP, world.KubeletPort, got)
		}
		// Both ways through the gateway host, routing as a VPC router would:
		// without the redirect the packets pass it to the real node.
		if err := gw.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
			t.Fatal(err)
		}
		defer gw.Sysctl("net.ipv4.ip_forward", "0")
		w.RouteVia(t, netip.PrefixFrom(apiHost.Addr, 32), gw)
		defer w.Client.Run(t, "ip", "route", "del", cloudIP+"/32")
		apiHost.Run(t, "ip", "route", "replace", w.Client.Addr.String()+"/32", "via", gw.Addr.String())
		defer apiHost.Run(t, "ip", "route", "del", w.Client.Addr.String()+"/32")
		if got := answeredBy(w.Client, cloudIP); got != "cloud-1" {
			t.Errorf("from a cloud host routed through the gateway, %s:%d answered by %q, want cloud-1", cloudIP, world.KubeletPort, got)
		}
		if got := answeredBy(w.Client, honestIP); got != honest.Name {
			t.Errorf("%s answered by %q", honest.Name, got)
		}
	})

	t.Run("TheGatewayHostsAddress", func(t *testing.T) {
		setAddress(t, gw.Addr.String())
		waitRefusal(t, statusapi.AddressRefusal{Addr: gw.Addr, Node: thief.Name, Reason: string(nodewatch.ReasonGatewayHost)})
		body, err := world.Get(ctx, gw, world.GatewayAdmin(gw, "/healthz"))
		if err != nil || !strings.Contains(body, "ok") {
			t.Errorf("the gateway's own admin port after the claim: %q %v", body, err)
		}
	})

	t.Run("OwnLabelsAndVIP", func(t *testing.T) {
		for _, patch := range []string{
			fmt.Sprintf(`{"metadata":{"labels":{%q:"site-a"}}}`, world.PoolLabel),
			fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, world.EdgeLabel),
			fmt.Sprintf(`{"metadata":{"annotations":{"tether.io/vip":%q}}}`, honestIP),
		} {
			_, err := stolen.CoreV1().Nodes().Patch(ctx, thief.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			if !apierrors.IsForbidden(err) {
				t.Errorf("patch %s of its own Node: %v, want Forbidden", patch, err)
			}
		}
		n, err := w.CP.Client.CoreV1().Nodes().Get(ctx, thief.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels[world.PoolLabel] != "site-x" || n.Labels[world.EdgeLabel] != "true" || n.Annotations["tether.io/vip"] != "" {
			t.Errorf("the thief's Node changed: labels %v, annotations %v", n.Labels, n.Annotations)
		}
	})

	t.Run("ElectionRecordsThroughTheAPI", func(t *testing.T) {
		cms := stolen.CoreV1().ConfigMaps(record.Namespace)
		for _, name := range []string{record.ElectionName("site-a"), record.ElectionName("site-x"), record.ElectionName("nowhere")} {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: record.Namespace,
				Annotations: map[string]string{"control-plane.alpha.kubernetes.io/leader": `{"holderIdentity":"edge-0","leaseDurationSeconds":3600}`}}}
			if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsAlreadyExists(err) {
				t.Errorf("create %s: %v, want Forbidden", name, err)
			}
			if cur, err := w.CP.Client.CoreV1().ConfigMaps(record.Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
				cur = cur.DeepCopy()
				cur.Annotations = cm.Annotations
				if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
					t.Errorf("update %s: %v, want Forbidden", name, err)
				}
			}
		}
	})

	t.Run("ThroughItsTunnel", func(t *testing.T) {
		kp, err := w.ClusterCA.NodeCert(thief.Name)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := dialTunnel(ctx, thief.Host, gw, kp.TLS, w.GatewayCA.Pool())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseWithError(tunnel.CloseNormal, "")

		// The election record of a pool it is not in.
		rec, _ := json.Marshal(corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("site-a"), Namespace: record.Namespace,
			Annotations: map[string]string{"control-plane.alpha.kubernetes.io/leader": `{"holderIdentity":"edge-0","leaseDurationSeconds":3600}`}}})
		for _, op := range []tunnel.ElectionOp{tunnel.ElectionCreate, tunnel.ElectionUpdate} {
			rep := electionRequest(t, ctx, conn, tunnel.ElectionRequest{Op: op, Record: tunnel.RecordElection, Pool: "site-a", ConfigMap: rec})
			if rep.Code == tunnel.OK {
				t.Errorf("%s of pool site-a's election record through the tunnel: accepted", op)
			}
		}
		if cm, err := w.CP.Client.CoreV1().ConfigMaps(record.Namespace).Get(ctx, record.ElectionName("site-a"), metav1.GetOptions{}); err == nil &&
			strings.Contains(cm.Annotations["control-plane.alpha.kubernetes.io/leader"], `"edge-0"`) {
			t.Errorf("pool site-a's election record names the thief: %v", cm.Annotations)
		}

		// An update of pool site-a's record from its current version.
		cur, err := w.CP.Client.CoreV1().ConfigMaps(record.Namespace).Get(ctx, record.ElectionName("site-a"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Annotations["control-plane.alpha.kubernetes.io/leader"] = `{"holderIdentity":"edge-0","leaseDurationSeconds":3600}`
		rec, _ = json.Marshal(cur)
		if rep := electionRequest(t, ctx, conn, tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection, Pool: "site-a", ConfigMap: rec}); rep.Code != tunnel.OtherPool {
			t.Errorf("update of pool site-a's record from its current version: %v, want %v", rep.Code, tunnel.OtherPool)
		}
		// Its own pool's record, naming another node.
		own, err := w.CP.Client.CoreV1().ConfigMaps(record.Namespace).Get(ctx, record.ElectionName("site-x"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		own.Annotations["control-plane.alpha.kubernetes.io/leader"] = `{"holderIdentity":"edge-a1","leaseDurationSeconds":3600}`
		rec, _ = json.Marshal(own)
		if rep := electionRequest(t, ctx, conn, tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection, Pool: "site-x", ConfigMap: rec}); rep.Code == tunnel.OK {
			t.Error("its own pool's record naming edge-a1 as holder: accepted")
		}
		if h := holder("site-a"); h != leaderA.Name {
			t.Errorf("pool site-a's record names %q after the attempts, want %s", h, leaderA.Name)
		}

		// The Lease of a member of its own pool, a day ahead: written at
		// the gateway's now; an honest renewal afterwards still goes in.
		sendLease := func(renew time.Time) tunnel.Reply {
			lease, _ := json.Marshal(coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: member.Name, Namespace: corev1.NamespaceNodeLease},
				Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renew}}})
			return delegateRequest(t, ctx, conn, tunnel.DelegateRequest{Node: member.Name, Lease: lease})
		}
		if rep := sendLease(time.Now().Add(24 * time.Hour)); rep.Code != tunnel.OK {
			t.Fatalf("the pool leader's delegated heartbeat for its member: %v %s", rep.Code, rep.Message)
		}
		l, err := w.CP.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, member.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ahead := time.Until(l.Spec.RenewTime.Time); ahead > time.Minute {
			t.Errorf("a renewal a day ahead was written %v ahead", ahead.Round(time.Second))
		}
		next := time.Now().Add(2 * time.Second)
		if rep := sendLease(next); rep.Code != tunnel.OK {
			t.Fatalf("honest renewal: %v %s", rep.Code, rep.Message)
		}
		if l2, err := w.CP.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, member.Name, metav1.GetOptions{}); err != nil || !l2.Spec.RenewTime.After(l.Spec.RenewTime.Time) {
			t.Errorf("the honest renewal after the clamped one was not written: %v %v", l2.Spec.RenewTime, err)
		}

		// A delegated heartbeat for a node of another pool.
		lease, _ := json.Marshal(coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: honest.Name, Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: time.Now().Add(24 * time.Hour)}}})
		rep := delegateRequest(t, ctx, conn, tunnel.DelegateRequest{Node: honest.Name, Lease: lease})
		if rep.Code != tunnel.OtherPool {
			t.Errorf("delegated heartbeat for %s: %v, want %v", honest.Name, rep.Code, tunnel.OtherPool)
		}
		if l, err := w.CP.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, honest.Name, metav1.GetOptions{}); err == nil &&
			l.Annotations[openyurt.DelegateHeartbeatAnnotation] == "true" {
			t.Errorf("%s's Lease was written for the thief: %+v", honest.Name, l.Spec)
		}
	})

	t.Logf("attacks done")
	// Site-a still follows its own leader, and the record names it.
	waitOneLeader(t, ctx, siteA, nil, 30*time.Second)
	if h := holder("site-a"); h != "edge-a1" && h != "edge-a2" {
		t.Errorf("pool site-a's record names %q at the end", h)
	}

	// Through everything, honest clients reached the right kubelets.
	for _, e := range []*world.Edge{honest, w.Edge("edge-a2")} {
		if got := answeredBy(w.Client, e.Host.Addr.String()); got != e.Name {
			t.Errorf("%s's address answered by %q at the end", e.Name, got)
		}
	}
	if got := connectedEdges(gatewayStatus(t, gw)); len(got) < 2 {
		t.Errorf("edges connected at the end: %v", got)
	}
	t.Logf("checks done; stopping")
}

// electionRequest sends r on a new stream of conn and reads the reply.
func electionRequest(t *testing.T, ctx context.Context, conn *quic.Conn, r tunnel.ElectionRequest) tunnel.ElectionReply {
	t.Helper()
	rep, err := electionRoundTrip(ctx, conn, r)
	if rep.Code == tunnel.OK && err != nil {
		t.Fatalf("election request: %v", err)
	}
	return rep
}

// electionRoundTrip sends r on a new stream of conn and reads the reply:
// a refusal is its code with the error; any other error comes with the
// zero reply (whose code is OK).
func electionRoundTrip(ctx context.Context, conn *quic.Conn, r tunnel.ElectionRequest) (tunnel.ElectionReply, error) {
	b, err := tunnel.AppendElectionRequest(nil, r)
	if err != nil {
		return tunnel.ElectionReply{}, err
	}
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return tunnel.ElectionReply{}, err
	}
	defer s.Close()
	if _, err := s.Write(b); err != nil {
		return tunnel.ElectionReply{}, err
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	rep, err := tunnel.ReadElectionReply(s)
	if rep.Code == tunnel.OK && err != nil {
		return tunnel.ElectionReply{}, fmt.Errorf("election reply: %w", err)
	}
	return rep, err
}

// delegateRequest sends r on a new stream of conn and reads the reply.
func delegateRequest(t *testing.T, ctx context.Context, conn *quic.Conn, r tunnel.DelegateRequest) tunnel.Reply {
	t.Helper()
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := tunnel.WriteDelegateRequest(s, r); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	rep, err := tunnel.ReadReply(s)
	if rep.Code == tunnel.OK && err != nil {
		t.Fatalf("delegate reply: %v", err)
	}
	return rep
}
