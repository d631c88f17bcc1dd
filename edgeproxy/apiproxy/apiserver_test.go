package apiproxy

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	edgecache "github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/edgeproxy/upstream"
	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestAgainstKubeAPIServer runs the proxy on an edge host behind NAT,
// against a real kube-apiserver on a cloud host, and loses the cloud by
// cutting the site's uplink.
func TestAgainstKubeAPIServer(t *testing.T) {
	testenv.RequireRoot(t)
	topo := testenv.NewTopology(t, testenv.TopologySpec{
		CloudHosts: []string{"apiserver"},
		Sites:      []testenv.SiteSpec{{Name: "site", Hosts: []string{"edge"}}},
	})
	cloud := topo.Cloud("apiserver")
	site := topo.Site("site")
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{BindAddress: cloud.Addr.String(), Runner: cloud})

	// No leak check here: these subtests share the control plane's
	// client-go clients, whose HTTP/2 connections and health pings to the
	// apiserver outlive a subtest (CI saw them reported twice as leaks).
	// The proxy's own leaks are checked in ProxyLeavesNothing.
	t.Run("KubeletThroughCut", func(t *testing.T) { testKubeletThroughCut(t, cp, site) })
	t.Run("OfflineDetails", func(t *testing.T) { testOfflineDetails(t, cp, site.Host("edge")) })
	t.Run("SlowCloudStaysHealthy", func(t *testing.T) { testSlowCloud(t, cp, cloud, site.Host("edge")) })
}

const (
	stepCondition = "tether.test/Step"
	workNS        = "work"
)

func testKubeletThroughCut(t *testing.T, cp *testenv.ControlPlane, site *testenv.Site) {
	const node = "edge-1"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin := cp.Client
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, edgeSpec{net: site.Host("edge"), server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA})
	e.waitHealthy(true, 30*time.Second)
	kubelet, _ := e.client(kubeletUA)

	// The kubelet registers its Node and Lease through the proxy, with
	// the node's identity the proxy holds.
	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Labels: map[string]string{"openyurt.io/is-edge-worker": "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("register node through the proxy: %v", err)
	}
	if _, err := kubelet.CoordinationV1().Leases("kube-node-lease").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: "kube-node-lease"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create lease through the proxy: %v", err)
	}
	renewer := startRenewer(ctx, kubelet, node, time.Second)

	// The cloud side: pods bound to the node, their ConfigMap and Secret.
	createWorkload(ctx, t, admin, node, "pod-a", "pod-b")

	// kubelet's pod informer (watch-list, as client-go does by default)
	// and a raw watch, both with the spec.nodeName selector.
	podInformer, stopInformer := startPodInformer(t, kubelet, fields.OneTermEqualSelector("spec.nodeName", node).String(), "")
	defer stopInformer()
	waitKeys(t, "kubelet's informer", podInformer, "work/pod-a", "work/pod-b")
	rawWatch, err := kubelet.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + node, TimeoutSeconds: ptr.To[int64](600)})
	if err != nil {
		t.Fatal(err)
	}
	defer rawWatch.Stop()
	for _, name := range []string{"cm-1"} {
		if _, err := kubelet.CoreV1().ConfigMaps(workNS).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Fatalf("get configmap through the proxy: %v", err)
		}
	}
	if _, err := kubelet.CoreV1().Secrets(workNS).Get(ctx, "s-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("get secret through the proxy: %v", err)
	}
	if _, err := kubelet.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := patchPodStep(ctx, kubelet, "pod-a", "online"); err != nil {
		t.Fatalf("pod status online: %v", err)
	}
	testenv.EventuallyNoError(t, "the online writes in the cache", func() error {
		for _, k := range []struct {
			gvr       string
			ns, name  string
			getObject func() (*localapi.Object, error)
		}{
			{"pods", workNS, "pod-a", func() (*localapi.Object, error) { return e.Store.Get("kubelet", podsGVR, workNS, "pod-a") }},
			{"configmaps", workNS, "cm-1", func() (*localapi.Object, error) {
				return e.Store.Get("kubelet", gvr("", "configmaps"), workNS, "cm-1")
			}},
			{"secrets", workNS, "s-1", func() (*localapi.Object, error) { return e.Store.Get("kubelet", gvr("", "secrets"), workNS, "s-1") }},
			{"nodes", "", node, func() (*localapi.Object, error) { return e.Store.Get("kubelet", nodesGVR, "", node) }},
			{"leases", "kube-node-lease", node, func() (*localapi.Object, error) {
				return e.Store.Get("kubelet", leasesGVR, "kube-node-lease", node)
			}},
		} {
			if o, err := k.getObject(); err != nil || o == nil {
				return fmt.Errorf("%s %s/%s not cached (%v)", k.gvr, k.ns, k.name, err)
			}
		}
		return nil
	})
	if got := e.metric("tether_edge_apiserver_requests_total", "component", "kubelet", "served", "upstream"); got == 0 {
		t.Error("no kubelet request counted as served upstream")
	}
	if n := e.metric("tether_edge_apiserver_cache_update_failures_total"); n != 0 {
		t.Errorf("%v responses (protobuf, as client-go asks) could not be cached\n%s", n, e.logs.String())
	}

	// Its initial events and the status write: the write is the last
	// change of the node's pods before the cut.
	waitPodStep(t, rawWatch, "pod-a", "online")

	// ---- The site loses the cloud.
	site.Cut()
	cutAt := time.Now()
	t.Logf("cloud cut; unhealthy after %v", e.waitHealthy(false, 30*time.Second).Round(time.Millisecond))
	if err := e.Proxy.Ready(); err != nil {
		t.Errorf("/readyz offline with a cache: %v", err)
	}
	if e.metric("tether_edge_apiserver_upstream_healthy") != 0 {
		t.Error("upstream_healthy metric not 0 while cut")
	}
	// Meanwhile in the cloud: pod-b is deleted, pod-c created on the node.
	if err := admin.CoreV1().Pods(workNS).Delete(ctx, "pod-b", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	createWorkload(ctx, t, admin, node, "pod-c")

	checkOfflineReads := func(e *edge, what string) {
		t.Helper()
		if _, err := kubelet.CoreV1().Pods(workNS).Get(ctx, "pod-a", metav1.GetOptions{}); err != nil {
			t.Errorf("%s: get pod: %v", what, err)
		}
		list, err := kubelet.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			t.Fatalf("%s: list pods: %v", what, err)
		}
		if got := podNames(list.Items); !slices.Equal(got, []string{"pod-a", "pod-b"}) {
			t.Errorf("%s: pods %v, want the cached pod-a pod-b", what, got)
		}
		info, _ := e.Store.Info("kubelet", podsGVR)
		if list.ResourceVersion != fmt.Sprint(info.MaxRV) {
			t.Errorf("%s: list resourceVersion %s, want the largest seen, %d", what, list.ResourceVersion, info.MaxRV)
		}
		for _, p := range list.Items {
			// (Objects answered locally offline have made-up
			// resourceVersions, above the list's: none yet the first time.)
			if localapi.ParseRV(p.ResourceVersion) > info.MaxRV && what == "offline" {
				t.Errorf("%s: pod %s newer (%s) than the list", what, p.Name, p.ResourceVersion)
			}
		}
		// A selector never used before the cut: served from the same data.
		web, err := kubelet.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, LabelSelector: "app=web"})
		if err != nil || !slices.Equal(podNames(web.Items), []string{"pod-a"}) {
			t.Errorf("%s: list app=web: %v %v", what, podNames(web.Items), err)
		}
		if _, err := kubelet.CoreV1().ConfigMaps(workNS).Get(ctx, "cm-1", metav1.GetOptions{}); err != nil {
			t.Errorf("%s: get configmap: %v", what, err)
		}
		if _, err := kubelet.CoreV1().Secrets(workNS).Get(ctx, "s-1", metav1.GetOptions{}); err != nil {
			t.Errorf("%s: get secret: %v", what, err)
		}
		_, err = kubelet.CoreV1().Pods(workNS).Get(ctx, "pod-z", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s: get of an uncached pod: %v, want NotFound", what, err)
		}
		err = kubelet.CoreV1().ConfigMaps(workNS).Delete(ctx, "cm-1", metav1.DeleteOptions{})
		if !apierrors.IsServiceUnavailable(err) {
			t.Errorf("%s: delete offline: %v, want 503", what, err)
		}
		// A new informer with other selectors syncs from the cache
		// (watch-list: initial events and the bookmark that ends them).
		dbInformer, stop := startPodInformer(t, kubelet, "spec.nodeName="+node, "app=db")
		waitKeys(t, what+": new app=db informer", dbInformer, "work/pod-b")
		stop()
	}
	checkOfflineReads(e, "offline")

	// The raw watch stays open, without events, without a busy loop:
	// once the upstream connection is found dead (HTTP/2 ping), the
	// proxy holds it (and the informer's).
	testenv.EventuallyNoError(t, "both watches held", func() error {
		if n := e.metric("tether_edge_apiserver_watches_open", "mode", "held"); n < 2 {
			return fmt.Errorf("%v watches held, want the informer's and the raw one", n)
		}
		return nil
	})
	quiet := time.After(3 * time.Second)
	for done := false; !done; {
		select {
		case ev, ok := <-rawWatch.ResultChan():
			if !ok {
				t.Fatal("watch closed by the cut")
			}
			t.Fatalf("watch event while cut: %s %v", ev.Type, ev.Object)
		case <-quiet:
			done = true
		}
	}
	// Lease renewals keep succeeding, locally.
	testenv.EventuallyNoError(t, "Lease renewals answered locally after the cut", func() error {
		if n := renewer.okSince(cutAt.Add(3 * time.Second)); n < 3 {
			return fmt.Errorf("%d renewals after the cut", n)
		}
		return nil
	})
	if e.metric("tether_edge_apiserver_requests_total", "component", "kubelet", "verb", "update", "served", "local") == 0 {
		t.Error("no renewal answered locally")
	}

	// Status writes are accepted, answered as the apiserver would, and
	// kept in order; pod-a's second patch takes the place of its first
	// (writequeue).
	for i, w := range []func() error{
		func() error { return checkStep(patchPodStep(ctx, kubelet, "pod-a", "1")) },
		func() error { return patchNodeStep(ctx, kubelet, node, "2") },
		func() error { return checkStep(patchPodStep(ctx, kubelet, "pod-a", "3")) },
		func() error { return updatePodStep(ctx, kubelet, "pod-b", "4") }, // deleted upstream meanwhile
	} {
		if err := w(); err != nil {
			t.Fatalf("offline status write %d: %v", i+1, err)
		}
	}
	if n := e.Proxy.queue.Len(); n != 3 {
		t.Fatalf("%d writes queued, want 3", n)
	}

	// tether-edge restarts while cut: the cache and queue are still there.
	rawWatch.Stop()
	restarted := time.Now()
	e = e.restart()
	e.waitHealthy(false, 30*time.Second)
	checkOfflineReads(e, "after restart")
	if n := e.Proxy.queue.Len(); n != 3 {
		t.Fatalf("after restart %d writes queued, want 3", n)
	}
	testenv.EventuallyNoError(t, "a Lease renewal after the restart", func() error {
		if n := renewer.okSince(restarted); n < 1 {
			return fmt.Errorf("no renewal since the restart: %v", renewer.lastErr())
		}
		return nil
	})

	// ---- The cloud comes back.
	steps := watchSteps(ctx, t, admin, node)
	site.Heal()
	t.Logf("cloud healed; healthy after %v", e.waitHealthy(true, 60*time.Second).Round(time.Millisecond))
	healthy := time.Now()
	testenv.EventuallyNoError(t, "the queue replayed", func() error {
		if n := e.Proxy.queue.Len(); n != 0 {
			return fmt.Errorf("%d writes still queued", n)
		}
		return nil
	})
	if a, o := e.metric("tether_edge_apiserver_queue_replayed_total", "result", "applied"), e.metric("tether_edge_apiserver_queue_replayed_total", "result", "obsolete"); a != 2 || o != 1 {
		t.Errorf("replayed: %v applied, %v obsolete; want 2 and 1 (pod-b is gone)\n%s", a, o, e.logs.String())
	}
	testenv.EventuallyNoError(t, "the status writes upstream in order", func() error {
		if got := steps.sequence(); !slices.Equal(got, []string{"node:2", "pod-a:3"}) {
			return fmt.Errorf("status writes arrived as %v, want node:2 pod-a:3 in that order", got)
		}
		return nil
	})
	// Caches catch up: pod-c is there, pod-b is not, in the kubelet's
	// informer and in the proxy's cache.
	waitKeys(t, "kubelet's informer after heal", podInformer, "work/pod-a", "work/pod-c")
	testenv.EventuallyNoError(t, "the proxy's cache caught up", func() error {
		items, _, _, err := e.Store.List("kubelet", podsGVR, edgecache.Scope{})
		if err != nil {
			return err
		}
		var names []string
		for _, o := range items {
			names = append(names, o.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"pod-a", "pod-c"}) {
			return fmt.Errorf("cache holds pods %v, want pod-a pod-c", names)
		}
		return nil
	})
	// The node's Lease is renewed in the cloud again: a renewal made
	// since the proxy found the cloud back (offline ones were answered
	// locally, never queued).
	testenv.EventuallyNoError(t, "the Lease renewed in the cloud again", func() error {
		l, err := admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if renewed := l.Spec.RenewTime.Time; !renewed.After(healthy) {
			return fmt.Errorf("lease last renewed %v, before the cloud was back (%v)", renewed, healthy)
		}
		return nil
	})
	t.Logf("renewals: %d ok, %d failed in all (last error: %v)", renewer.count(true), renewer.count(false), renewer.lastErr())
}

// waitPodStep reads a watch's events until one shows pod at step.
func waitPodStep(t *testing.T, w watch.Interface, pod, step string) {
	t.Helper()
	const within = 30 * time.Second
	timeout := time.After(within)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch ended before %s reached step %q", pod, step)
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod && p.Name == pod && podStep(p) == step {
				return
			}
		case <-timeout:
			t.Fatalf("no event of %s at step %q within %v", pod, step, within)
		}
	}
}

func gvr(group, resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}
}

// createWorkload creates, as admin, the namespace, its default
// ServiceAccount, a ConfigMap, a Secret and pods bound to node that use
// them (so that the Node authorizer lets the node read them).
func createWorkload(ctx context.Context, t *testing.T, admin kubernetes.Interface, node string, pods ...string) {
	t.Helper()
	ignoreExists := func(err error) {
		t.Helper()
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: workNS}}, metav1.CreateOptions{})
	ignoreExists(err)
	_, err = admin.CoreV1().ServiceAccounts(workNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	ignoreExists(err)
	_, err = admin.CoreV1().ConfigMaps(workNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm-1"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	ignoreExists(err)
	_, err = admin.CoreV1().Secrets(workNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s-1"}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	ignoreExists(err)
	for i, name := range pods {
		app := []string{"web", "db"}[i%2]
		_, err := admin.CoreV1().Pods(workNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{
				NodeName:                     node,
				AutomountServiceAccountToken: ptr.To(false),
				Containers:                   []corev1.Container{{Name: "c", Image: "registry.example/app:1"}},
				Volumes: []corev1.Volume{
					{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm-1"}}}},
					{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s-1"}}},
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// startPodInformer starts a pod informer with the given selectors.
func startPodInformer(t *testing.T, c kubernetes.Interface, fieldSelector, labelSelector string) (cache.SharedIndexInformer, func()) {
	t.Helper()
	factory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector, o.LabelSelector = fieldSelector, labelSelector
	}))
	inf := factory.Core().V1().Pods().Informer()
	stop := make(chan struct{})
	factory.Start(stop)
	return inf, func() { close(stop); factory.Shutdown() }
}

func waitKeys(t *testing.T, what string, inf cache.SharedIndexInformer, want ...string) {
	t.Helper()
	testenv.EventuallyNoError(t, "the informer to hold its keys", func() error {
		if !inf.HasSynced() {
			return fmt.Errorf("%s not synced", what)
		}
		got := inf.GetStore().ListKeys()
		sort.Strings(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s holds %v, want %v", what, got, want)
		}
		return nil
	})
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// patchPodStep sets the step condition of a pod's status with a strategic
// merge patch, as kubelet's status manager patches pod status.
func patchPodStep(ctx context.Context, c kubernetes.Interface, pod, step string) (*corev1.Pod, error) {
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","message":%q}]}}`, stepCondition, step)
	p, err := c.CoreV1().Pods(workNS).Patch(ctx, pod, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	if err != nil {
		return nil, err
	}
	if got := podStep(p); got != step {
		return p, fmt.Errorf("answer has step %q, want %q", got, step)
	}
	return p, nil
}

func checkStep(_ *corev1.Pod, err error) error { return err }

// updatePodStep sets the step with an update (PUT) of the status.
func updatePodStep(ctx context.Context, c kubernetes.Interface, pod, step string) error {
	p, err := c.CoreV1().Pods(workNS).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	p.Status.Conditions = slices.DeleteFunc(p.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == stepCondition })
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: stepCondition, Status: corev1.ConditionTrue, Message: step})
	_, err = c.CoreV1().Pods(workNS).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// patchNodeStep sets a step condition on the node's status, as kubelet
// patches its node status.
func patchNodeStep(ctx context.Context, c kubernetes.Interface, node, step string) error {
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"TetherStep","status":"True","message":%q}]}}`, step)
	n, err := c.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	if err != nil {
		return err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == "TetherStep" && cond.Message == step {
			return nil
		}
	}
	return fmt.Errorf("answer lacks the step: %+v", n.Status.Conditions)
}

func podStep(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == stepCondition {
			return c.Message
		}
	}
	return ""
}

// steps records, from the cloud, each new step of pod and node status
// with the resourceVersion that wrote it: the order in which the writes
// reached the apiserver.
type steps struct {
	mu   sync.Mutex
	seen map[string]string
	recs []stepRec
}

type stepRec struct {
	what string
	rv   uint64
}

func (s *steps) record(obj, step string, rv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if step == "" || s.seen[obj] == step {
		return
	}
	s.seen[obj] = step
	s.recs = append(s.recs, stepRec{obj + ":" + step, localapi.ParseRV(rv)})
}

func (s *steps) sequence() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := slices.Clone(s.recs)
	slices.SortFunc(recs, func(a, b stepRec) int { return int(a.rv) - int(b.rv) })
	var out []string
	for _, r := range recs {
		out = append(out, r.what)
	}
	return out
}

func watchSteps(ctx context.Context, t *testing.T, admin kubernetes.Interface, node string) *steps {
	t.Helper()
	s := &steps{seen: map[string]string{}}
	pods, err := admin.CoreV1().Pods(workNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		s.seen[p.Name] = podStep(&p)
	}
	nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.seen["node"] = nodeStep(nodes.Items, node)
	pw, err := admin.CoreV1().Pods(workNS).Watch(ctx, metav1.ListOptions{ResourceVersion: pods.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	nw, err := admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: nodes.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range pw.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				s.record(p.Name, podStep(p), p.ResourceVersion)
			}
		}
	}()
	go func() {
		for ev := range nw.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && n.Name == node {
				s.record("node", nodeStep([]corev1.Node{*n}, node), n.ResourceVersion)
			}
		}
	}()
	t.Cleanup(func() { pw.Stop(); nw.Stop() })
	return s
}

func nodeStep(nodes []corev1.Node, node string) string {
	for _, n := range nodes {
		if n.Name != node {
			continue
		}
		for _, c := range n.Status.Conditions {
			if c.Type == "TetherStep" {
				return c.Message
			}
		}
	}
	return ""
}

// renewer renews the node's Lease as kubelet does: update the last lease
// it had; on a conflict, get it again.
type renewer struct {
	mu      sync.Mutex
	results []renewal
}

type renewal struct {
	at  time.Time
	err error
}

func startRenewer(ctx context.Context, c kubernetes.Interface, node string, every time.Duration) *renewer {
	r := &renewer{}
	go func() {
		var latest *coordinationv1.Lease
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			err := func() error {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if latest == nil {
					l, err := c.CoordinationV1().Leases("kube-node-lease").Get(rctx, node, metav1.GetOptions{})
					if err != nil {
						return err
					}
					latest = l
				}
				l := latest.DeepCopy()
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
				got, err := c.CoordinationV1().Leases("kube-node-lease").Update(rctx, l, metav1.UpdateOptions{})
				if err != nil {
					latest = nil
					return err
				}
				latest = got
				return nil
			}()
			r.mu.Lock()
			r.results = append(r.results, renewal{time.Now(), err})
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *renewer) okSince(t time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.results {
		if x.err == nil && x.at.After(t) {
			n++
		}
	}
	return n
}

func (r *renewer) count(ok bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.results {
		if (x.err == nil) == ok {
			n++
		}
	}
	return n
}

func (r *renewer) lastErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.results) - 1; i >= 0; i-- {
		if r.results[i].err != nil {
			return r.results[i].err
		}
	}
	return nil
}

// testOfflineDetails forces the proxy offline (its health checks still
// pass: no cut needed) to check what the cut test does not.
func testOfflineDetails(t *testing.T, cp *testenv.ControlPlane, edgeHost *testenv.Host) {
	const node = "edge-2"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: edgeHost, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline})
	e.waitHealthy(true, 30*time.Second)
	kubelet, _ := e.client(kubeletUA)
	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createWorkload(ctx, t, cp.Client, node, "pod-x", "pod-y")
	for _, p := range []string{"pod-x", "pod-y"} {
		if _, err := kubelet.CoreV1().Pods(workNS).Get(ctx, p, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A write after the pods', so that the list's resourceVersion is
	// above every pod's: the cache's largest resourceVersion reaching it
	// shows the list (cached asynchronously) was written.
	if _, err := cp.Client.CoreV1().ConfigMaps(workNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-pods"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	list, err := kubelet.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	listRV := localapi.ParseRV(list.ResourceVersion)
	for _, p := range list.Items {
		if localapi.ParseRV(p.ResourceVersion) >= listRV {
			t.Fatalf("pod %s at resourceVersion %s, not below the list's %s", p.Name, p.ResourceVersion, list.ResourceVersion)
		}
	}
	testenv.EventuallyNoError(t, "the cache at the list's resourceVersion", func() error {
		if info, _ := e.Store.Info("kubelet", podsGVR); info.MaxRV < listRV {
			return fmt.Errorf("cache at resourceVersion %d, the list's is %d", info.MaxRV, listRV)
		}
		return nil
	})

	offline.set(true)
	// A watch offline neither returns at once (a watch storm) nor lives
	// past its timeoutSeconds.
	start := time.Now()
	w, err := kubelet.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, TimeoutSeconds: ptr.To[int64](2)})
	if err != nil {
		t.Fatal(err)
	}
	for ev := range w.ResultChan() {
		t.Errorf("event on an offline watch: %s", ev.Type)
	}
	// Not before its timeout; after it, within a bound generous for a
	// loaded machine but far below the test's own deadline, where a watch
	// that ignored its timeout would end.
	if took := time.Since(start); took < 1900*time.Millisecond || took > 30*time.Second {
		t.Errorf("offline watch with timeoutSeconds=2 ended after %v", took)
	}
	// A resource this component never read: 503, not a made-up answer.
	_, err = kubelet.CoreV1().Services(workNS).List(ctx, metav1.ListOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Errorf("list of never-cached services: %v, want 503", err)
	}

	// Two updates of pod-x: the later replaces the earlier. A patch of
	// pod-y, then its status written by someone else upstream: obsolete.
	if err := updatePodStep(ctx, kubelet, "pod-x", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := patchPodStep(ctx, kubelet, "pod-y", "k1"); err != nil {
		t.Fatal(err)
	}
	if err := updatePodStep(ctx, kubelet, "pod-x", "b"); err != nil {
		t.Fatal(err)
	}
	// managedFields keep whole seconds: the admin's write comes in a
	// later second than the queued patch.
	queued := time.Now()
	testenv.Eventually(t, "the next second", func() bool {
		return time.Now().Truncate(time.Second).After(queued.Truncate(time.Second))
	})
	if _, err := patchPodStep(ctx, cp.Client, "pod-y", "by-admin"); err != nil {
		t.Fatal(err)
	}
	offline.set(false)
	testenv.EventuallyNoError(t, "the queue replayed", func() error {
		if n := e.Proxy.queue.Len(); n != 0 {
			return fmt.Errorf("%d queued", n)
		}
		return nil
	})
	applied := e.metric("tether_edge_apiserver_queue_replayed_total", "result", "applied")
	obsolete := e.metric("tether_edge_apiserver_queue_replayed_total", "result", "obsolete")
	if applied != 1 || obsolete != 2 {
		t.Errorf("replayed %v applied, %v obsolete; want 1 and 2\n%s", applied, obsolete, e.logs.String())
	}
	x, _ := cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-x", metav1.GetOptions{})
	y, _ := cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-y", metav1.GetOptions{})
	if podStep(x) != "b" || podStep(y) != "by-admin" {
		t.Errorf("upstream steps: pod-x %q (want b), pod-y %q (want by-admin)", podStep(x), podStep(y))
	}
}

// testSlowCloud puts a TCP proxy that delays every chunk by 400 ms each
// way (in the cloud namespace, in front of the apiserver) between the edge
// and the apiserver, and checks that the health checks, with their
// default timeout and thresholds, never call it unhealthy.
func testSlowCloud(t *testing.T, cp *testenv.ControlPlane, cloud, edgeHost *testenv.Host) {
	const delay = 400 * time.Millisecond
	api, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := cloud.Listen("tcp", net.JoinHostPort(cloud.Addr.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serveDelayed(t, ln, api.Host, delay, cloud.DialContext)

	kp, err := cp.CA.NodeCert("edge-slow")
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, edgeSpec{net: edgeHost, server: "https://" + ln.Addr().String(), node: "edge-slow", cert: kp.TLS, ca: cp.CA,
		health: upstream.HealthOptions{Interval: 500 * time.Millisecond}}) // default timeout (5 s) and thresholds
	e.waitHealthy(true, 30*time.Second)
	changed := e.Proxy.up.Changed()

	c, _ := e.client(kubeletUA)
	start := time.Now()
	if _, err := c.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 2*delay {
		t.Fatalf("a request took %v: the link is not slow", took)
	}
	// Many probes over the slow link, each needing more than 2*delay:
	// as many as the failure threshold several times over.
	const probes = 16
	before := e.metric("tether_edge_apiserver_upstream_probes_total", "result", "ok")
	testenv.EventuallyWithin(t, 2*time.Minute, fmt.Sprintf("%d probes passed over the slow link", probes), func() bool {
		return e.metric("tether_edge_apiserver_upstream_probes_total", "result", "ok")-before >= probes
	})
	select {
	case <-changed:
		t.Fatalf("a slow but answering apiserver was declared unhealthy: %+v", e.Ups.Status())
	default:
	}
	if n := e.metric("tether_edge_apiserver_upstream_probes_total", "result", "fail"); n != 0 {
		t.Errorf("%v probes failed", n)
	}
	ok := e.metric("tether_edge_apiserver_upstream_probes_total", "result", "ok")
	t.Logf("%v probes passed over a link with %v each way", ok, delay)
}

// serveDelayed relays connections from ln to target until ln is closed,
// delaying every chunk by d in each direction (added latency, not reduced
// bandwidth). The connections it relays are closed when the test ends
// (after the cleanups registered later, such as a proxy's stop): the slow
// link goes away, and with it what was still open over it.
func serveDelayed(t *testing.T, ln net.Listener, target string, d time.Duration, dial func(context.Context, string, string) (net.Conn, error)) {
	var mu sync.Mutex
	var open []net.Conn
	ended := false
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			c.Close()
			return false
		}
		open = append(open, c)
		return true
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		ended = true
		for _, c := range open {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !track(c) {
				return
			}
			go func() {
				u, err := dial(context.Background(), "tcp", target)
				if err != nil {
					c.Close()
					return
				}
				if !track(u) {
					c.Close()
					return
				}
				go pipeDelayed(u, c, d)
				pipeDelayed(c, u, d)
			}()
		}
	}()
}

func pipeDelayed(dst, src net.Conn, d time.Duration) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	if tc, ok := dst.(interface{ CloseWrite() error }); ok {
		tc.CloseWrite()
	} else {
		dst.Close()
	}
}
