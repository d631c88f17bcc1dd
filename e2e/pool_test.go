package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore"
)

const kubeProxyUA = "kube-proxy/v1.36.3 (linux/amd64) kubernetes/e2e"

// TestNodePool runs three edges of one pool in one site against a real
// apiserver, kube-controller-manager's node lifecycle controller and a
// gateway: one leads and the others replicate; a follower cut from the
// cloud keeps its node Ready through the leader and the gateway (and is
// tainted); a stopped leader is replaced; a cut site serves its replicas.
func TestNodePool(t *testing.T) {
	w := world.New(t, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: "shop", Hosts: []string{"edge-1", "edge-2", "edge-3"}, LAN: netip.MustParsePrefix("192.168.7.0/24")},
	}}, t.Logf)
	w.ApplyEdgeRBAC(t)
	// The kubelet renews its Lease every 10 s; 25 s leaves two renewals of
	// slack (kube-controller-manager's own default: 50 s).
	cm := w.CP.StartControllerManager(t, testenv.ControllerManagerOptions{NodeMonitorGracePeriod: 25 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	admin := w.CP.Client
	createSlices(t, ctx, admin, "shop", 0, 50)

	// Every node runs the kubelet's own code (kubemark's hollow kubelet)
	// behind its tether-edge: its Lease, node status and reads are what
	// the pool carries.
	edgeArgs := func(e *world.Edge) []string {
		return append(w.ProxyArgs(e), "--cache-components", world.HollowComponents)
	}
	w.StartGateway(t, w.Gateways[0])
	w.RouteSitesVia(t, w.Gateways[0])
	for _, e := range w.Edges {
		w.StartEdge(t, e, edgeArgs(e)...)
		w.StartHollowKubelet(t, e, false)
	}
	if err := w.WaitReachable(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, e := range w.Edges {
		testenv.Eventually(t, "the kubelet reports "+e.Name+" Ready", func() bool { return nodeReady(t, ctx, admin, e.Name) })
	}
	top := t

	leader := waitOneLeader(t, ctx, w.Edges, nil, 30*time.Second)
	t.Logf("leader: %s", leader.Name)
	waitConverged(t, ctx, admin, w.Edges, 30*time.Second)

	t.Run("ReplicasFollowTheCloud", func(t *testing.T) {
		// The followers get the new slice on their open replication
		// streams, as changes: no snapshot, no new stream.
		before := map[string]replicationCounts{}
		for _, e := range w.Edges {
			if e != leader {
				before[e.Name] = followerCounts(t, ctx, e)
			}
		}
		createSlices(t, ctx, admin, "shop", 50, 51)
		took := waitConverged(t, ctx, admin, w.Edges, 30*time.Second)
		t.Logf("all three replicas equal with the new slice %v after the create returned", took.Round(time.Millisecond))
		for name, b := range before {
			e := w.Edge(name)
			a := followerCounts(t, ctx, e)
			if a.changes <= b.changes || a.resyncs != b.resyncs || a.connected != 1 {
				t.Errorf("%s: replication changes frames %v → %v, resyncs %v → %v, connected %v; want the slice as changes on the same stream",
					name, b.changes, a.changes, b.resyncs, a.resyncs, a.connected)
			}
		}
		// /metrics says the same as /status.
		for _, e := range w.Edges {
			testenv.EventuallyNoError(t, e.Name+"'s metrics to say what /status says", func() error {
				body, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
				lead, connected := world.Metric(body, "tether_edge_pool_leader"), world.Metric(body, "tether_edge_pool_replica_connected")
				age := world.Metric(body, "tether_edge_pool_last_sync_age_seconds")
				if err == nil && (e == leader) == (lead == 1) && (e != leader) == (connected == 1) && age >= 0 && age <= 30 {
					return nil
				}
				return fmt.Errorf("leader %v, replica_connected %v, last_sync_age_seconds %v, %v; the leader is %s", lead, connected, age, err, leader.Name)
			})
		}
		// Node components read them from the replica.
		for _, e := range w.Edges {
			before := poolServed(t, ctx, e)
			l, err := e.ProxyClient(kubeProxyUA).DiscoveryV1().EndpointSlices("shop").List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) != 51 {
				t.Fatalf("%s: list through the proxy: %d items, %v", e.Name, len(l.Items), err)
			}
			testenv.Eventually(t, e.Name+": the list served from the pool replica", func() bool { return poolServed(t, ctx, e) > before })
		}
	})

	t.Run("StrangersCannotJoin", func(t *testing.T) {
		st, err := leader.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		url := fmt.Sprintf("https://%s:%d/pool/v1/replicate?rev=0", leader.Host.Addr, poolstore.DefaultPort)
		// A node of another pool, with a valid node certificate.
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Labels: map[string]string{openyurt.PoolLabel: "other"}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		other := writeCert(t, w, "elsewhere", w.ClusterCA)
		// A certificate naming a node of this pool, from another CA.
		forged := writeCert(t, w, w.Edges[1].Name, testenv.MustCA(t, "forger"))
		for name, args := range map[string][]string{
			"other pool":     {"--cert", other[0], "--key", other[1]},
			"another CA":     {"--cert", forged[0], "--key", forged[1]},
			"no certificate": nil,
		} {
			out, err := leader.Host.Command(ctx, "curl", append([]string{"-s", "--max-time", "5", "-k", "--http2", "-o", "/dev/null",
				"-w", "%{http_code}", url}, args...)...).Output()
			code := strings.TrimSpace(string(out))
			if name == "other pool" {
				if code != "403" {
					t.Errorf("%s: answered %q (%v), want 403", name, code, err)
				}
				continue
			}
			if err == nil || code != "000" {
				t.Errorf("%s: answered %q, want the TLS handshake refused", name, code)
			}
		}
		if after, _ := leader.Status(ctx); after.Pool == nil || after.Pool.Digest != st.Pool.Digest {
			t.Errorf("the leader's replica changed")
		}
	})

	t.Run("FollowerCutKeepsItsNodeReady", func(t *testing.T) {
		var f *world.Edge
		for _, e := range w.Edges {
			if e != leader {
				f = e
				break
			}
		}
		f.CutUplink(t)
		cutAt := time.Now()
		// Its Lease keeps being renewed, with the annotation, through the
		// leader and the gateway.
		var renewed time.Time
		waitUntil(t, 40*time.Second, "a delegated renewal of "+f.Name, func() bool {
			l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, f.Name, metav1.GetOptions{})
			if err != nil || l.Annotations[openyurt.DelegateHeartbeatAnnotation] != "true" {
				return false
			}
			renewed = l.Spec.RenewTime.Time
			return renewed.After(cutAt)
		})
		// The gateway taints a node after a few delegated renewals: the
		// kubelet renews every 10 s.
		waitUntil(t, 90*time.Second, "the taint on "+f.Name, func() bool { return hasTaint(ctx, admin, f.Name) })
		// Beyond the grace period, the node is still Ready. What shows the
		// lifecycle controller has judged it past its grace: a node
		// nobody renews, posted Ready after f's last renewal of its own,
		// turns Unknown. Posted at least two of the controller's periods
		// after the cut, it is judged in a later pass than f would be
		// without the delegated renewals (an older heartbeat, the same
		// grace), so f's judgement is in by then.
		grace, period := cm.Options.NodeMonitorGracePeriod, cm.Options.NodeMonitorPeriod
		if wait := time.Until(cutAt.Add(2 * period)); wait > 0 {
			time.Sleep(wait) // ordering of heartbeat times, not waiting for an event
		}
		markReady(t, ctx, admin, "ghost")
		waitUntil(t, grace+60*time.Second, "ghost Ready=Unknown", func() bool { return !nodeReady(t, ctx, admin, "ghost") })
		if !nodeReady(t, ctx, admin, f.Name) {
			t.Fatalf("%s is not Ready %v after its uplink was cut (grace %v)", f.Name, time.Since(cutAt).Round(time.Second), grace)
		}
		l, _ := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, f.Name, metav1.GetOptions{})
		if !l.Spec.RenewTime.After(renewed) {
			t.Fatalf("%s's Lease not renewed since %v", f.Name, renewed)
		}

		f.HealUplink(t)
		waitUntil(t, 40*time.Second, "the annotation gone from "+f.Name+"'s Lease", func() bool {
			l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, f.Name, metav1.GetOptions{})
			return err == nil && l.Annotations[openyurt.DelegateHeartbeatAnnotation] == ""
		})
		waitUntil(t, 30*time.Second, "the taint gone from "+f.Name, func() bool { return !hasTaint(ctx, admin, f.Name) })
	})

	t.Run("LeaderStopped", func(t *testing.T) {
		stopped := time.Now()
		if err := w.Stop(leader.Host); err != nil {
			t.Fatal(err)
		}
		rest := slices.DeleteFunc(slices.Clone(w.Edges), func(e *world.Edge) bool { return e == leader })
		next := waitOneLeader(t, ctx, rest, leader, 15*time.Second+30*time.Second)
		t.Logf("new leader %s %v after the old one stopped", next.Name, time.Since(stopped).Round(time.Millisecond))
		createSlices(t, ctx, admin, "shop", 51, 60)
		waitConverged(t, ctx, admin, rest, 60*time.Second)
		checkSameAsCloud(t, ctx, admin, rest)
		w.StartEdge(top, leader, edgeArgs(leader)...) // lives beyond this subtest
		waitConverged(t, ctx, admin, w.Edges, 60*time.Second)
		leader = next
	})

	t.Run("SiteCutServesReplicas", func(t *testing.T) {
		w.Edges[0].Site.Cut()
		for _, e := range w.Edges {
			testenv.EventuallyNoError(t, e.Name+" to see the cloud unreachable", func() error {
				st, err := e.Status(ctx)
				if err == nil && st.APIServer != nil && !st.APIServer.Healthy {
					return nil
				}
				return fmt.Errorf("%+v %v", st.APIServer, err)
			})
		}
		for _, e := range w.Edges {
			before := poolServed(t, ctx, e)
			l, err := e.ProxyClient(kubeProxyUA).DiscoveryV1().EndpointSlices("shop").List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) != 60 {
				t.Fatalf("%s offline: list from the replica: %d items, %v", e.Name, len(l.Items), err)
			}
			testenv.Eventually(t, e.Name+" offline: the list served from the pool replica", func() bool { return poolServed(t, ctx, e) > before })
		}
		createSlices(t, ctx, admin, "shop", 60, 65)
		w.Edges[0].Site.Heal()
		waitConverged(t, ctx, admin, w.Edges, 60*time.Second)
		// The replicas' object count covers every pool resource, so it
		// can pass before the leader has caught up with the slices made
		// during the cut: catching up is what is checked, within 30 s.
		testenv.EventuallyNoError(t, "the replicas to catch up with the cloud", func() error { return sameAsCloud(ctx, admin, w.Edges) })
		checkSameAsCloud(t, ctx, admin, w.Edges)
	})
}

// waitUntil waits for cond for up to d and returns how long it took.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	testenv.EventuallyWithin(t, d, what, cond)
	return time.Since(start)
}

// waitOneLeader waits until exactly one of edges says it leads (not
// notThis) and the others follow it.
func waitOneLeader(t *testing.T, ctx context.Context, edges []*world.Edge, notThis *world.Edge, d time.Duration) *world.Edge {
	t.Helper()
	var leader *world.Edge
	waitUntil(t, d, "one pool leader", func() bool {
		leader = nil
		var leaders []string
		for _, e := range edges {
			st, err := e.Status(ctx)
			if err != nil || st.Pool == nil {
				return false
			}
			if st.Pool.Role == "leader" {
				leader = e
			}
			leaders = append(leaders, st.Pool.Leader)
		}
		return leader != nil && leader != notThis && len(slices.Compact(leaders)) == 1
	})
	return leader
}

// waitConverged waits until every edge's replica has n EndpointSlices in
// namespace shop and all digests are equal; it returns how long it took.
func waitConverged(t *testing.T, ctx context.Context, admin kubernetes.Interface, edges []*world.Edge, d time.Duration) time.Duration {
	t.Helper()
	var last []string
	took := waitUntil(t, d, "replicas converged on the cloud's objects", func() bool {
		last = last[:0]
		n, err := cloudPoolObjects(ctx, admin)
		if err != nil {
			return false
		}
		digest := ""
		for _, e := range edges {
			st, err := e.Status(ctx)
			if err != nil || st.Pool == nil {
				return false
			}
			last = append(last, fmt.Sprintf("%s:%s rev %d objects %d digest %.12s", e.Name, st.Pool.Role, st.Pool.Rev, st.Pool.Objects, st.Pool.Digest))
			if digest == "" {
				digest = st.Pool.Digest
			}
			if st.Pool.Digest != digest || st.Pool.Objects != n {
				return false
			}
		}
		return true
	})
	t.Logf("converged: %s", strings.Join(last, "; "))
	return took
}

// cloudPoolObjects is how many objects the cloud has of the pool's
// resources (EndpointSlices, Endpoints, Services, all namespaces): what a
// replica that follows it holds.
func cloudPoolObjects(ctx context.Context, admin kubernetes.Interface) (int, error) {
	es, err := admin.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	ep, err := admin.CoreV1().Endpoints("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	svc, err := admin.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	return len(es.Items) + len(ep.Items) + len(svc.Items), nil
}

// checkSameAsCloud compares what each edge serves from its replica with
// the cloud: the same slices at the same resourceVersions, none missing,
// none twice.
func checkSameAsCloud(t *testing.T, ctx context.Context, admin kubernetes.Interface, edges []*world.Edge) {
	t.Helper()
	if err := sameAsCloud(ctx, admin, edges); err != nil {
		t.Error(err)
	}
}

// sameAsCloud is nil when every edge serves the cloud's slices.
func sameAsCloud(ctx context.Context, admin kubernetes.Interface, edges []*world.Edge) error {
	cloud, err := admin.DiscoveryV1().EndpointSlices("shop").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	want := sliceVersions(cloud.Items)
	var errs []error
	for _, e := range edges {
		l, err := e.ProxyClient(kubeProxyUA).DiscoveryV1().EndpointSlices("shop").List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("%s: %w", e.Name, err)
		}
		if got := sliceVersions(l.Items); !slices.Equal(got, want) {
			errs = append(errs, fmt.Errorf("%s serves %d slices, the cloud has %d:\n got %v\nwant %v", e.Name, len(got), len(want), got, want))
		}
	}
	return errors.Join(errs...)
}

func sliceVersions(items []discoveryv1.EndpointSlice) []string {
	out := make([]string, 0, len(items))
	for _, s := range items {
		out = append(out, s.Name+"@"+s.ResourceVersion)
	}
	slices.Sort(out)
	return out
}

func createSlices(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, from, to int) {
	t.Helper()
	if _, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := from; i < to; i++ {
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("svc-", i), Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprint("svc-", i)}}, AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)}}}}
		if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// markReady posts a Ready condition for node (creating it if needed), as
// kubelet does when it starts.
func markReady(t *testing.T, ctx context.Context, c kubernetes.Interface, name string) {
	t.Helper()
	if err := world.MarkReady(ctx, c, name); err != nil {
		t.Fatal(err)
	}
}

func nodeReady(t *testing.T, ctx context.Context, c kubernetes.Interface, name string) bool {
	t.Helper()
	ready, _, err := world.NodeCondition(ctx, c, name)
	if err != nil {
		t.Fatal(err)
	}
	return ready == corev1.ConditionTrue
}

func hasTaint(ctx context.Context, c kubernetes.Interface, name string) bool {
	_, tainted, err := world.NodeCondition(ctx, c, name)
	return err == nil && tainted
}

// writeCert writes a node certificate for node from ca into the world's
// directory: [cert, key].
func writeCert(t *testing.T, w *world.World, node string, ca *testenv.CA) [2]string {
	t.Helper()
	kp, err := ca.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := kp.WriteFiles(w.Dir, node+"-"+ca.Cert.Subject.CommonName)
	if err != nil {
		t.Fatal(err)
	}
	return [2]string{c, k}
}

// replicationCounts are a follower's replication metrics.
type replicationCounts struct{ changes, resyncs, connected float64 }

func followerCounts(t *testing.T, ctx context.Context, e *world.Edge) replicationCounts {
	t.Helper()
	body, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	return replicationCounts{
		changes:   world.Metric(body, `tether_edge_pool_frames_received_total{type="changes"}`),
		resyncs:   world.Metric(body, "tether_edge_pool_resyncs_total"),
		connected: world.Metric(body, "tether_edge_pool_replica_connected"),
	}
}

// poolServed is how many requests e's proxy answered from the pool
// replica.
func poolServed(t *testing.T, ctx context.Context, e *world.Edge) float64 {
	t.Helper()
	n, err := e.Served(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	return n
}
