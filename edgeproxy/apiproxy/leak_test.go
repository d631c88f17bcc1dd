package apiproxy

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/edgeproxy/filter"
	"github.com/tether-edge/tether/internal/testenv"
)

// testProxyLeavesNothing runs a proxy with the topology filter against
// cp under a leak check: gets, lists, watches that end (by their timeout,
// by the client, with the proxy), a filtered watch that re-sends after a
// filter change, and an informer. Once the proxy has stopped and the
// clients are gone, so are the proxy's goroutines, its connections to the
// apiserver and to its clients, and its cache file.
func testProxyLeavesNothing(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, admin kubernetes.Interface) {
	testenv.CheckLeaks(t)
	const node = "leak-check"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, topology: true})
	e.waitHealthy(true, 30*time.Second)
	kubelet, _ := e.client(kubeletUA)
	kubeProxy, _ := e.client(kubeProxyUA)

	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Labels: map[string]string{filter.LabelNodePool: "p1"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kubelet.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	pods, err := kubelet.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	// A watch that ends by its timeout, and one the client stops.
	w, err := kubelet.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node,
		ResourceVersion: pods.ResourceVersion, TimeoutSeconds: ptr.To[int64](1)})
	if err != nil {
		t.Fatal(err)
	}
	for range w.ResultChan() {
	}
	w, err = kubelet.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node,
		ResourceVersion: pods.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()

	// A filtered watch, sent its slice again when the Service's topology
	// annotation changes, then stopped.
	l, err := kubeProxy.DiscoveryV1().EndpointSlices(topoNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := kubeProxy.DiscoveryV1().EndpointSlices(topoNS).Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer patchService(t, ctx, admin, "plain", "")
	waitResent(t, fw, "plain", func(i int) {
		patchService(t, ctx, admin, "plain", []string{filter.KeyNodePool, filter.KeyHostname}[i%2])
	})
	fw.Stop()

	// An informer, synced and shut down.
	factory := informers.NewSharedInformerFactoryWithOptions(kubelet, 0, informers.WithNamespace(topoNS))
	inf := factory.Core().V1().Services().Informer()
	ictx, stop := context.WithTimeout(ctx, time.Minute)
	factory.Start(ictx.Done())
	if !cache.WaitForCacheSync(ictx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync through the proxy")
	}
	stop()
	factory.Shutdown()

	// A watch still open when the proxy stops.
	w, err = kubelet.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node,
		ResourceVersion: pods.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	e.stop()
	for range w.ResultChan() {
	}
}

// waitResent waits for a MODIFIED of svc's slice on w.
//
// change(i) changes the Service's annotation, to a value other than the
// one before: the filter re-sends once its own informers have seen the
// change, and one made before they have synced (or that another test's
// leftover value made no change) passes unseen; so the change is made
// again, alternating values, every 5 s without a re-send, for up to 30 s.
func waitResent(t *testing.T, w watch.Interface, svc string, change func(i int)) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for i := 0; ; i++ {
		change(i)
		again := time.After(5 * time.Second)
		for waiting := true; waiting; {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatalf("watch ended waiting for %s's slice", svc)
				}
				if s, isSlice := ev.Object.(*discoveryv1.EndpointSlice); isSlice && ev.Type == watch.Modified &&
					s.Labels[discoveryv1.LabelServiceName] == svc {
					return
				}
			case <-again:
				waiting = false
			case <-timeout:
				t.Fatalf("no MODIFIED of %s's slice within 30 s of changing its topology annotation %d times", svc, i+1)
			}
		}
	}
}
