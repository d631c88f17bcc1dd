package main

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
)

// The tour's world: pool site-a has two nodes (a leader and a follower to
// cut), site-b one (reached by kubectl logs, in another site than the
// kube-proxy's).
var tourSites = []testenv.SiteSpec{
	{Name: "site-a", Hosts: []string{"edge-1", "edge-2"}, LAN: netip.MustParsePrefix("192.168.1.0/24")},
	{Name: "site-b", Hosts: []string{"edge-3"}, LAN: netip.MustParsePrefix("192.168.2.0/24")},
}

const (
	tourNamespace = "tour"
	tourService   = "web"
	// grace is kube-controller-manager's node monitor grace period in the
	// tour (its default is 50 s): a node whose Lease nobody renews for
	// that long turns Ready=Unknown. The kubelet renews its Lease every
	// 10 s: 25 s leaves two renewals of slack.
	grace = 25 * time.Second
	// leasePeriod is how often the kubelet renews its Lease; edge-3's
	// stand-in renews at the same pace.
	leasePeriod = 10 * time.Second
	// logsNode is the node step 3 reaches with kubectl logs: it keeps the
	// stand-in kubelet (see setup).
	logsNode = "edge-3"
	// stepTimeout bounds every wait of the tour for what a step shows.
	stepTimeout = 40 * time.Second
	// kubeletTimeout bounds the waits on what a kubelet does in its own
	// time: start and post its Node Ready, and renew its Lease (the
	// gateway taints a node after four delegated renewals, 40 s of a
	// kubelet's, and untaints it on its first renewal of its own).
	kubeletTimeout = 90 * time.Second
	// edgeProxy is tether-edge's apiserver proxy on each edge node.
	edgeProxy       = "http://127.0.0.1:10261"
	kubeletUA       = "kubelet/v1.36.3 (linux/amd64) kubernetes/demo"
	tourSteps       = 3
	contrastNode    = "ghost"
	wrapColumns     = 96
	kubeletCABase   = "kubelet-ca"
	tourDirPrefix   = "tether-tour-"
	tourContainer   = "web"
	tourServicePort = 80
	tourTargetPort  = 8080
)

// tourWorld is what the tour keeps between its steps.
type tourWorld struct {
	once bool
	dir  string
	cm   *testenv.ControllerManager
}

// newTour returns the tour and the world it needs: the three edges above,
// and a kube-apiserver that reaches kubelets as in node-ip mode (by their
// InternalIP, which the VPC routes to the gateway; by default it would try
// their host name first, which would need the gateway's DNS as its
// resolver) and verifies their serving certificates with their CA, so that
// `kubectl logs` shows TLS end to end.
func newTour(s *testenv.Session, once bool) (*tourWorld, world.Options, error) {
	dir, err := os.MkdirTemp("", tourDirPrefix)
	if err != nil {
		return nil, world.Options{}, err
	}
	s.Cleanup(func() { os.RemoveAll(dir) })
	ca := testenv.MustCA(s, "kubelet-serving-ca")
	caFile, err := ca.WriteFile(dir, kubeletCABase)
	if err != nil {
		return nil, world.Options{}, err
	}
	return &tourWorld{once: once, dir: dir}, world.Options{
		Sites:     tourSites,
		KubeletCA: ca,
		APIServerArgs: []string{
			"--kubelet-preferred-address-types=InternalIP",
			"--kubelet-certificate-authority=" + caFile,
		},
	}, nil
}

// prepare runs before the edges start: what they need in the cloud beyond
// the Node authorizer (edge-rbac.yaml: Services, Nodes, ServiceCIDRs for
// the topology filter and kube-proxy; pool-rbac.yaml: the pool election).
func (t *tourWorld) prepare(ctx context.Context, s *testenv.Session, w *world.World) error {
	step("the edges' RBAC in the cloud: packaging/kubernetes/edge-rbac.yaml and pool-rbac.yaml")
	w.ApplyEdgeRBAC(s)
	return ctx.Err()
}

// run is the tour, after the tunnel part of the demo.
func (t *tourWorld) run(ctx context.Context, s *testenv.Session, w *world.World) error {
	start := time.Now()
	fmt.Println()
	step("the tour: the rest of Tether, in %d steps. tether-edge on each node is also the node components' kube-apiserver (%s)", tourSteps, edgeProxy)
	if err := t.setup(ctx, s, w); err != nil {
		return err
	}
	steps := []func(context.Context, *testenv.Session, *world.World) error{t.topology, t.cut, t.logs}
	for i, f := range steps {
		if i > 0 {
			if err := t.pause(ctx); err != nil {
				return err
			}
		}
		stepStart := time.Now()
		if err := f(ctx, s, w); err != nil {
			return fmt.Errorf("tour step %d of %d: %w", i+1, tourSteps, err)
		}
		say("(step %d took %v)", i+1, time.Since(stepStart).Round(time.Second))
	}
	fmt.Println()
	step("tour: all %d steps shown in %v", tourSteps, time.Since(start).Round(time.Second))
	return nil
}

// setup starts the nodes' kubelets and kube-controller-manager, and
// creates the workload the steps look at: a Pod on each edge node and a
// Service with an endpoint on each.
func (t *tourWorld) setup(ctx context.Context, s *testenv.Session, w *world.World) error {
	admin := w.CP.Client
	var hollow []*world.Edge
	for _, e := range w.Edges {
		if e.Name != logsNode {
			hollow = append(hollow, e)
		}
	}
	step("kubemark's hollow kubelet (the kubelet's own code over a fake container runtime) on %s, "+
		"with its node's tether-edge as its kube-apiserver: it posts its Node's status and renews its Lease every %v", edgeNames(hollow), leasePeriod)
	for _, e := range hollow {
		w.StartHollowKubelet(s, e, false)
	}
	// A hollow kubelet posts its own server's port (HollowKubeletPort,
	// plain HTTP, over a runtime that keeps no logs) in its Node's status,
	// where kube-apiserver would send kubectl logs. The node of step 3
	// keeps the stand-in kubelet, which the world starts on every edge
	// host and which serves the kubelet's HTTPS API on KubeletPort through
	// the tunnel; there, scripted renewals stand in for the kubelet's.
	step("%s keeps the stand-in kubelet, whose HTTPS API on :%d step 3 reaches: its Node is posted Ready and its Lease renewed every %v through its tether-edge",
		logsNode, world.KubeletPort, leasePeriod)
	e3 := w.Edge(logsNode)
	e3.StartHeartbeats(ctx, leasePeriod)
	if err := world.MarkReady(ctx, admin, e3.Name); err != nil {
		return fmt.Errorf("mark %s Ready: %w", e3.Name, err)
	}
	// The kubelet admits Pods only once it has posted its Node's capacity.
	start := time.Now()
	for _, e := range hollow {
		if err := waitForD(ctx, kubeletTimeout, func() (bool, string) {
			ready, _, err := world.NodeCondition(ctx, admin, e.Name)
			return err == nil && ready == corev1.ConditionTrue, fmt.Sprintf("%s Ready=%q %v", e.Name, ready, err)
		}); err != nil {
			return fmt.Errorf("the kubelet on %s does not post its Node Ready: %w", e.Name, err)
		}
	}
	say("shown: the kubelets on %s posted their Nodes Ready through tether-edge (%v)", edgeNames(hollow), time.Since(start).Round(100*time.Millisecond))
	step("kube-controller-manager's node lifecycle controller (grace %v)", grace)
	t.cm = w.CP.StartControllerManager(s, testenv.ControllerManagerOptions{NodeMonitorGracePeriod: grace})

	step("workload: namespace %s, a Pod %s-<node> on each edge node, Service %s with one endpoint per Pod", tourNamespace, tourService, tourService)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tourNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// No service account controller runs: the Pods' default account is
	// made here.
	if _, err := admin.CoreV1().ServiceAccounts(tourNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	var endpoints []discoveryv1.Endpoint
	for i, e := range w.Edges {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: podName(e), Namespace: tourNamespace, Labels: map[string]string{"app": tourService}},
			Spec: corev1.PodSpec{NodeName: e.Name, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: tourContainer, Image: "registry.invalid/web:demo"}}},
		}
		if _, err := admin.CoreV1().Pods(tourNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		endpoints = append(endpoints, discoveryv1.Endpoint{
			Addresses:  []string{podIP(i)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName:   ptr.To(e.Name),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: tourNamespace, Name: pod.Name},
		})
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: tourService, Namespace: tourNamespace,
			Annotations: map[string]string{openyurt.TopologyKeysAnnotation: openyurt.KeyNodePool}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: tourServicePort, TargetPort: intstr.FromInt32(tourTargetPort), Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := admin.CoreV1().Services(tourNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	// A Service without a selector: its EndpointSlice is written here (no
	// EndpointSlice controller runs), naming each endpoint's node.
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: tourService + "-1", Namespace: tourNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: tourService}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](tourTargetPort), Protocol: ptr.To(corev1.ProtocolTCP), Name: ptr.To("")}},
	}
	if _, err := admin.DiscoveryV1().EndpointSlices(tourNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, e := range hollow {
		if err := waitForD(ctx, kubeletTimeout, func() (bool, string) {
			p, err := admin.CoreV1().Pods(tourNamespace).Get(ctx, podName(e), metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return p.Status.Phase == corev1.PodRunning, fmt.Sprintf("%s/%s %s", tourNamespace, p.Name, p.Status.Phase)
		}); err != nil {
			return fmt.Errorf("the kubelet on %s does not run its Pod: %w", e.Name, err)
		}
	}
	say("shown: the kubelets on %s admitted and run their Pods (phase Running, in their fake runtimes)", edgeNames(hollow))
	return nil
}

// edgeNames lists the edges' names, "a and b" for two.
func edgeNames(edges []*world.Edge) string {
	var names []string
	for _, e := range edges {
		names = append(names, e.Name)
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func podName(e *world.Edge) string { return tourService + "-" + e.Name }

// podIP is the address of the Pod on the i-th edge node.
func podIP(i int) string { return fmt.Sprintf("10.244.%d.10", i+1) }

// topology is step 1: a real kube-proxy behind tether-edge programs only
// the endpoints of its pool, and follows an annotation change.
func (t *tourWorld) topology(ctx context.Context, s *testenv.Session, w *world.World) error {
	e1 := w.Edge("edge-1")
	heading(1, "service topology: a real kube-proxy on edge-1 programs only its pool's endpoints")
	var all []string
	for i, e := range w.Edges {
		all = append(all, fmt.Sprintf("%s on %s (pool %s)", podIP(i), e.Name, e.Site.Name))
	}
	say("Service %s/%s has %d endpoints in the cloud: %s;", tourNamespace, tourService, len(w.Edges), strings.Join(all, ", "))
	say("it is annotated %s: %s (OpenYurt's annotation, read as is).", openyurt.TopologyKeysAnnotation, openyurt.KeyNodePool)
	say("starting kube-proxy (nftables mode, built from k8s.io/kubernetes) on edge-1 with tether-edge (%s) as its apiserver", edgeProxy)
	kp := testenv.StartKubeProxy(s, e1.Host, e1.Name, edgeProxy)

	samePool := []string{podIP(0), podIP(1)}
	if _, err := waitEndpoints(ctx, kp, samePool); err != nil {
		return err
	}
	chain, err := kp.ServiceChain(ctx, tourNamespace, tourService)
	if err != nil {
		return err
	}
	say("kube-proxy's rules on edge-1 (nft list table ip kube-proxy, the Service's chain):")
	for l := range strings.Lines(chain) {
		say("  %s", strings.TrimRight(strings.ReplaceAll(l, "\t", "  "), "\n"))
	}
	say("shown: kube-proxy on edge-1 programs %s (edge-1 and edge-2, its pool), not %s on edge-3", strings.Join(samePool, " "), podIP(2))
	why("tether-edge filters the EndpointSlices that kube-proxy lists and watches by the Service's topology keys, " +
		"so a site's traffic stays in the site instead of crossing the WAN to another one; kube-proxy itself is unmodified.")

	fmt.Println()
	say("changing the annotation in the cloud to %s (same node only)", openyurt.KeyHostname)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, openyurt.TopologyKeysAnnotation, openyurt.KeyHostname)
	if _, err := w.CP.Client.CoreV1().Services(tourNamespace).Patch(ctx, tourService, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	took, err := waitEndpoints(ctx, kp, []string{podIP(0)})
	if err != nil {
		return err
	}
	say("shown: %v later kube-proxy on edge-1 programs %s only (its own node), without a restart", took.Round(10*time.Millisecond), podIP(0))
	why("tether-edge re-sends the affected EndpointSlices on kube-proxy's open watch when a Service's annotation " +
		"or a pool's membership changes: operators change topology in the cloud, not on the nodes.")
	return nil
}

// waitEndpoints waits until kube-proxy has programmed exactly want for the
// tour's Service and returns how long that took.
func waitEndpoints(ctx context.Context, kp *testenv.KubeProxy, want []string) (time.Duration, error) {
	start := time.Now()
	var got []string
	var err error
	for time.Since(start) < stepTimeout {
		if got, err = kp.Endpoints(ctx, tourNamespace, tourService); err == nil && slices.Equal(got, want) {
			return time.Since(start), nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return 0, err
		}
	}
	rules, _ := kp.Rules(ctx)
	return 0, fmt.Errorf("kube-proxy on %s programs %v for %s/%s after %v (last error: %v), want %v; its rules:\n%s\nits log ends:\n%s",
		kp.Node, got, tourNamespace, tourService, stepTimeout, err, want, logTail(rules), logTail(kp.Log()))
}

// cut is step 2: a node cut from the cloud reads from its cache and is
// kept Ready by its pool's leader, tainted, and untainted when it is back.
func (t *tourWorld) cut(ctx context.Context, s *testenv.Session, w *world.World) error {
	admin := w.CP.Client
	leader, f, err := poolRoles(ctx, w, "site-a")
	if err != nil {
		return err
	}
	heading(2, fmt.Sprintf("%s loses its uplink: its node keeps working and stays Ready through its pool", f.Name))
	say("pool site-a: %s leads (it watches the pool's Services and EndpointSlices in the cloud for its peers), %s follows", leader.Name, f.Name)

	// What a starting kubelet reads, read here with its User-Agent (the
	// hollow kubelet already runs): online, then offline.
	kubelet := f.ProxyClient(kubeletUA)
	if _, err := kubeletReads(ctx, kubelet, f.Name); err != nil {
		return fmt.Errorf("%s's kubelet start-up reads through tether-edge, online: %w", f.Name, err)
	}
	cached, err := f.Served(ctx, "cache")
	if err != nil {
		return err
	}

	say("cutting %s's uplink: nftables in its namespace drops everything beyond its site LAN %s (the pool peer stays reachable)", f.Name, f.Site.LAN)
	f.CutUplink(s)
	cutAt := time.Now()
	healed := false
	defer func() {
		if !healed {
			f.HealUplink(s)
		}
	}()
	if err := waitFor(ctx, func() (bool, string) {
		st, err := f.Status(ctx)
		return err == nil && st.APIServer != nil && !st.APIServer.Healthy, fmt.Sprintf("%s's /status: %+v %v", f.Name, st.APIServer, err)
	}); err != nil {
		return fmt.Errorf("%s does not find the cloud unreachable: %w", f.Name, err)
	}
	say("%s's tether-edge finds kube-apiserver unreachable %v after the cut", f.Name, time.Since(cutAt).Round(100*time.Millisecond))

	var summary string
	if err := waitFor(ctx, func() (bool, string) {
		var err error
		summary, err = kubeletReads(ctx, kubelet, f.Name)
		now, _ := f.Served(ctx, "cache")
		return err == nil && now >= cached+2, fmt.Sprintf("reads: %v; served from the cache: %v, %v before", err, now, cached)
	}); err != nil {
		return fmt.Errorf("%s's kubelet start-up reads offline: %w", f.Name, err)
	}
	say("shown: a kubelet starting on %s now (its reads, made with the kubelet's User-Agent) gets its Node and lists its Pods through tether-edge offline: %s,", f.Name, summary)
	say("answered from tether-edge's cache (tether_edge_apiserver_requests_total{served=\"cache\"})")
	why("a kubelet (or kube-proxy, coredns) that restarts while its node is offline still finds its Pods, Services " +
		"and endpoints, so workloads keep running; status updates are queued and replayed when the cloud is back.")

	var renewed time.Time
	if err := waitForD(ctx, kubeletTimeout, func() (bool, string) {
		l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, f.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		renewed = l.Spec.RenewTime.Time
		return l.Annotations[openyurt.DelegateHeartbeatAnnotation] == "true" && renewed.After(cutAt),
			fmt.Sprintf("Lease renewed %v, annotations %v", renewed, l.Annotations)
	}); err != nil {
		return fmt.Errorf("no delegated renewal of %s's Lease: %w", f.Name, err)
	}
	say("shown: %v after the cut, Lease kube-node-lease/%s in the cloud has a new renewal, marked %s=true:",
		time.Since(cutAt).Round(100*time.Millisecond), f.Name, openyurt.DelegateHeartbeatAnnotation)
	say("the hollow kubelet on %s renewed it as always; its tether-edge sent the renewal to the leader %s over the LAN, and %s had tether-gateway write it",
		f.Name, leader.Name, leader.Name)
	if err := waitForD(ctx, kubeletTimeout, func() (bool, string) {
		_, tainted, err := world.NodeCondition(ctx, admin, f.Name)
		return err == nil && tainted, fmt.Sprintf("tainted %v, %v", tainted, err)
	}); err != nil {
		return fmt.Errorf("no taint on %s: %w", f.Name, err)
	}
	say("shown: Node %s has the taint %s=true:NoSchedule", f.Name, openyurt.UnschedulableTaintKey)

	// The contrast: a Node posted Ready after the cut and renewed by
	// nobody. Posted two of the controller's periods after the cut, it is
	// judged in a later pass than f would be without its pool (an older
	// heartbeat, the same grace): once it is Unknown, f has been judged.
	if err := sleep(ctx, time.Until(cutAt.Add(2*t.cm.Options.NodeMonitorPeriod))); err != nil {
		return err
	}
	if err := world.MarkReady(ctx, admin, contrastNode); err != nil {
		return err
	}
	ghostAt := time.Now()
	say("for contrast, Node %s is posted Ready now and renewed by nobody ...", contrastNode)
	if err := waitForD(ctx, grace+stepTimeout, func() (bool, string) {
		ready, _, err := world.NodeCondition(ctx, admin, contrastNode)
		return err == nil && ready == corev1.ConditionUnknown, fmt.Sprintf("%s Ready=%s %v", contrastNode, ready, err)
	}); err != nil {
		return fmt.Errorf("kube-controller-manager never judged %s: %w", contrastNode, err)
	}
	ready, tainted, err := world.NodeCondition(ctx, admin, f.Name)
	if err != nil {
		return err
	}
	if ready != corev1.ConditionTrue || !tainted {
		return fmt.Errorf("%s is Ready=%s (tainted %v) %v after the cut, want Ready=True and tainted", f.Name, ready, tainted, time.Since(cutAt).Round(time.Second))
	}
	say("shown: %s turned Ready=Unknown %v later (kube-controller-manager's grace: %v); %s, cut %v ago, is still Ready=True",
		contrastNode, time.Since(ghostAt).Round(100*time.Millisecond), grace, f.Name, time.Since(cutAt).Round(time.Second))
	if err := admin.CoreV1().Nodes().Delete(ctx, contrastNode, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if out, err := w.Client.Command(ctx, w.Bins.Ctl, "pools", "--kubeconfig", w.CP.AdminKubeconfig).CombinedOutput(); err == nil {
		say("the operator's view, tetherctl pools (kubectl tether pools):")
		for l := range strings.Lines(string(out)) {
			say("  %s", strings.TrimRight(l, "\n"))
		}
	} else {
		return fmt.Errorf("tetherctl pools: %v: %s", err, out)
	}
	why("without its pool, the node lifecycle controller would mark the node NotReady and, after the " +
		"pods' tolerations, evict them, although they run fine at the site. The taint keeps new Pods " +
		"away from a node the cloud cannot reach, without evicting what runs there.")

	fmt.Println()
	say("healing %s's uplink", f.Name)
	f.HealUplink(s)
	healed = true
	healAt := time.Now()
	if err := waitForD(ctx, kubeletTimeout, func() (bool, string) {
		l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, f.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return l.Annotations[openyurt.DelegateHeartbeatAnnotation] == "", fmt.Sprintf("annotations %v", l.Annotations)
	}); err != nil {
		return fmt.Errorf("%s's Lease still delegated after the heal: %w", f.Name, err)
	}
	own := time.Since(healAt)
	if err := waitForD(ctx, kubeletTimeout, func() (bool, string) {
		ready, tainted, err := world.NodeCondition(ctx, admin, f.Name)
		return err == nil && !tainted && ready == corev1.ConditionTrue, fmt.Sprintf("Ready=%s tainted %v %v", ready, tainted, err)
	}); err != nil {
		return fmt.Errorf("%s not untainted after the heal: %w", f.Name, err)
	}
	say("shown: %s's kubelet renews its own Lease again (%v after the heal) and is untainted and Ready (%v after the heal)",
		f.Name, own.Round(100*time.Millisecond), time.Since(healAt).Round(100*time.Millisecond))
	return nil
}

// kubeletReads does what a starting kubelet reads: its Node and its Pods.
func kubeletReads(ctx context.Context, c kubernetes.Interface, node string) (string, error) {
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get node %s: %w", node, err)
	}
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", fmt.Errorf("list pods on %s: %w", node, err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	if len(names) == 0 {
		return "", fmt.Errorf("no pods listed on %s", node)
	}
	return fmt.Sprintf("Node %s (InternalIP %s), Pods [%s]", n.Name, internalIP(n), strings.Join(names, " ")), nil
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return "none"
}

// poolRoles waits until the pool has one leader that every member follows.
func poolRoles(ctx context.Context, w *world.World, pool string) (leader, follower *world.Edge, err error) {
	var members []*world.Edge
	for _, e := range w.Edges {
		if e.Site.Name == pool {
			members = append(members, e)
		}
	}
	err = waitFor(ctx, func() (bool, string) {
		leader, follower = nil, nil
		var seen []string
		for _, e := range members {
			st, err := e.Status(ctx)
			if err != nil || st.Pool == nil {
				return false, fmt.Sprintf("%s: %v", e.Name, err)
			}
			seen = append(seen, fmt.Sprintf("%s: %s of %s", e.Name, st.Pool.Role, st.Pool.Leader))
			switch st.Pool.Role {
			case "leader":
				leader = e
			default:
				follower = e
			}
			if st.Pool.Leader == "" {
				return false, strings.Join(seen, ", ")
			}
		}
		return leader != nil && follower != nil, strings.Join(seen, ", ")
	})
	if err != nil {
		return nil, nil, fmt.Errorf("pool %s elected no leader: %w", pool, err)
	}
	return leader, follower, nil
}

// logs is step 3: `kubectl logs` through kube-apiserver reaches a kubelet
// behind NAT.
func (t *tourWorld) logs(ctx context.Context, s *testenv.Session, w *world.World) error {
	e := w.Edge("edge-3")
	heading(3, fmt.Sprintf("kubectl logs through kube-apiserver reaches %s's kubelet behind NAT", e.Name))
	// tools/build-testbins.sh builds kubectl beside kube-apiserver.
	kubectl := filepath.Join(filepath.Dir(testenv.Binaries(s).KubeAPIServer), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		return fmt.Errorf("kubectl: %w (tools/build-testbins.sh builds it: make testbins)", err)
	}
	api, gw := w.Topo.Cloud("apiserver"), w.Gateways[0]
	var lans []string
	for _, site := range w.Topo.Sites {
		api.Run(s, "ip", "route", "replace", site.LAN.String(), "via", gw.Addr.String())
		lans = append(lans, site.LAN.String())
	}
	say("the VPC routes the edge sites' ranges (%s) to tether-gateway for kube-apiserver's host too (node-ip mode)", strings.Join(lans, ", "))
	say("kube-apiserver is unmodified: --kubelet-preferred-address-types=InternalIP, --kubelet-certificate-authority=%s.crt", kubeletCABase)

	home := filepath.Join(t.dir, "home") // kubectl's cache, not root's
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	// The stand-in kubelet answers: it serves the kubelet's HTTPS API on
	// KubeletPort for the tunnel (see setup); the hollow kubelets are the
	// ones that talk to tether-edge.
	before := e.Kubelet.Requests.Load()
	pod := podName(e)
	say("cloud client: $ kubectl -n %s logs %s", tourNamespace, pod)
	var out []byte
	want := "served by the kubelet of " + e.Name
	if err := waitFor(ctx, func() (bool, string) {
		cmd := w.Client.Command(ctx, kubectl, "--kubeconfig", w.CP.AdminKubeconfig, "--request-timeout", "10s", "-n", tourNamespace, "logs", pod)
		cmd.Env = append(os.Environ(), "HOME="+home)
		var err error
		out, err = cmd.CombinedOutput()
		return err == nil && strings.Contains(string(out), want), fmt.Sprintf("%v: %s", err, out)
	}); err != nil {
		return fmt.Errorf("kubectl logs %s: %w", pod, err)
	}
	for l := range strings.Lines(string(out)) {
		say("  %s", strings.TrimRight(l, "\n"))
	}
	if after := e.Kubelet.Requests.Load(); after <= before {
		return fmt.Errorf("kubectl logs answered, but %s's kubelet served no request", e.Name)
	}
	say("shown: the log lines come from %s's (stand-in) kubelet at %s, a private address behind %s's NAT", e.Name, e.Kubelet.Addr, e.Site.Name)
	why("kube-apiserver dialled the node's InternalIP as usual; the route took it to tether-gateway, which relayed the " +
		"TCP connection over the tunnel " + e.Name + " dialled out. kube-apiserver verified the kubelet's own certificate: " +
		"TLS is end to end, the gateway never holds a key. kubectl exec, attach, port-forward and metrics-server take the same path.")
	return nil
}

// heading starts tour step n.
func heading(n int, title string) {
	fmt.Println()
	step("tour %d/%d: %s", n, tourSteps, title)
}

// say prints a line of a step, indented.
func say(format string, args ...any) {
	fmt.Printf("    "+format+"\n", args...)
}

// why prints why a step matters, wrapped.
func why(text string) {
	prefix := "    why it matters: "
	line := prefix
	for _, word := range strings.Fields(text) {
		if len(line)+1+len(word) > wrapColumns && len(line) > len(prefix) {
			fmt.Println(line)
			line = strings.Repeat(" ", len(prefix)) + word
			continue
		}
		if len(line) > len(prefix) {
			line += " "
		}
		line += word
	}
	fmt.Println(line)
}

// pause waits for Enter between steps when a person is watching (stdin is
// a terminal and not --once).
func (t *tourWorld) pause(ctx context.Context) error {
	if t.once {
		return ctx.Err()
	}
	if fi, err := os.Stdin.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return ctx.Err()
	}
	fmt.Print("\n    press Enter for the next step (Ctrl-C stops the demo and cleans up) ")
	line := make(chan struct{})
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		close(line)
	}()
	select {
	case <-ctx.Done():
		fmt.Println()
		return ctx.Err()
	case <-line:
		return nil
	}
}

// waitFor polls cond every 100 ms until it holds, for up to stepTimeout;
// the error carries cond's last description.
func waitFor(ctx context.Context, cond func() (bool, string)) error {
	return waitForD(ctx, stepTimeout, cond)
}

func waitForD(ctx context.Context, d time.Duration, cond func() (bool, string)) error {
	var last string
	for start := time.Now(); time.Since(start) < d; {
		var ok bool
		if ok, last = cond(); ok {
			return nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("not within %v; last seen: %s", d, last)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func logTail(s string) string {
	const n = 3000
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
