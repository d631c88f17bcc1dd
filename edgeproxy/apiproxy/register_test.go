package apiproxy

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestRegisterOffline starts a kubelet-like client online, registering
// its Node and CSINode through the proxy, then offline and after a
// restart of the proxy offline: a create of its own cached Node is
// answered 409 AlreadyExists (protobuf or JSON body) and the get that
// follows is served; a create of another node, or by a component that
// never cached the Node, is refused (503); the CSINode is served from
// what the online writes left in the cache; an own CSINode the cache
// lacks is refused (503), never 404.
func TestRegisterOffline(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "edge-register"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline})
	e.waitHealthy(true, 30*time.Second)
	// kubelet sends protobuf (--kube-api-content-type); a JSON client too.
	kubelet := e.clientWith(kubeletUA, runtime.ContentTypeProtobuf)

	// Online: the Node and the CSINode are created (and the CSINode
	// updated) by the kubelet; their answers are cached, not only relayed.
	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("register the node online: %v", err)
	}
	csi, err := kubelet.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the CSINode online: %v", err)
	}
	csi.Annotations = map[string]string{"storage.alpha.kubernetes.io/migrated-plugins": "kubernetes.io/test"}
	if csi, err = kubelet.StorageV1().CSINodes().Update(ctx, csi, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update the CSINode online: %v", err)
	}
	// Its Lease controller creates the node Lease (a kubelet cut before
	// its first renewal has sent no other write of it).
	lease, err := kubelet.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the node Lease online: %v", err)
	}
	testenv.EventuallyNoError(t, "the online writes in the kubelet's cache", func() error {
		if l, err := e.Store.Get("kubelet", leasesGVR, corev1.NamespaceNodeLease, node); err != nil || l == nil {
			return fmt.Errorf("lease: %v, %v", l, err)
		}
		n, err := e.Store.Get("kubelet", nodesGVR, "", node)
		if err != nil || n == nil {
			return fmt.Errorf("node: %v, %v", n, err)
		}
		c, err := e.Store.Get("kubelet", csiNodesGVR, "", node)
		if err != nil || c == nil || c.RV != localapi.ParseRV(csi.ResourceVersion) {
			return fmt.Errorf("csinode: %v, %v; want rv %s", c, err, csi.ResourceVersion)
		}
		return nil
	})

	// A CSINode of another node in kube-proxy's cache: csinodes are
	// cached for it, its own node's CSINode is not.
	other, err := localapi.DecodeObject([]byte(`{"kind":"CSINode","apiVersion":"storage.k8s.io/v1","metadata":{"name":"edge-other","resourceVersion":"5"}}`), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Store.Put("kube-proxy", csiNodesGVR, other); err != nil {
		t.Fatal(err)
	}
	e.Store.Sync()

	check := func(phase string) {
		t.Helper()
		kubelet := e.clientWith(kubeletUA, runtime.ContentTypeProtobuf)
		kubeletJSON := e.clientWith(kubeletUA, runtime.ContentTypeJSON)
		kubeProxy := e.clientWith("kube-proxy/v1.36.3", runtime.ContentTypeProtobuf)
		for name, c := range map[string]kubernetes.Interface{"protobuf": kubelet, "json": kubeletJSON} {
			_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
			var se *apierrors.StatusError
			if !errors.As(err, &se) || !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s: create of the own node (%s body): %v, want 409 AlreadyExists", phase, name, err)
			}
			st := se.ErrStatus
			if st.Code != 409 || st.Details == nil || st.Details.Name != node || st.Details.Kind != "nodes" || st.Details.Group != "" ||
				st.Message != fmt.Sprintf("nodes %q already exists", node) {
				t.Errorf("%s: the 409 is not the apiserver's: %+v", phase, st)
			}
		}
		// What kubelet does after the 409: it reads the Node.
		if n, err := kubelet.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil || n.Name != node {
			t.Errorf("%s: get of the node after the 409: %v", phase, err)
		}
		if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-other"}}, metav1.CreateOptions{}); !apierrors.IsServiceUnavailable(err) {
			t.Errorf("%s: create of another node: %v, want 503", phase, err)
		}
		if _, err := kubeProxy.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); !apierrors.IsServiceUnavailable(err) {
			t.Errorf("%s: create of the own node by a component that never cached it: %v, want 503", phase, err)
		}
		got, err := kubelet.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil || got.ResourceVersion != csi.ResourceVersion || got.Annotations["storage.alpha.kubernetes.io/migrated-plugins"] != "kubernetes.io/test" {
			t.Errorf("%s: the CSINode from the cache: %+v, %v; want the online update's answer", phase, got, err)
		}
		if _, err := kubeProxy.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{}); !apierrors.IsServiceUnavailable(err) {
			t.Errorf("%s: get of the own CSINode the cache lacks: %v, want 503 (a 404 has kubelet create it, and exit)", phase, err)
		}
		// Another object the cache lacks is still not found.
		if _, err := kubeProxy.StorageV1().CSINodes().Get(ctx, "edge-third", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: get of another uncached CSINode: %v, want 404", phase, err)
		}
		if _, err := kubelet.StorageV1().CSINodes().Update(ctx, got, metav1.UpdateOptions{}); !apierrors.IsServiceUnavailable(err) {
			t.Errorf("%s: update of the CSINode offline: %v, want 503", phase, err)
		}
		// The Lease controller's first step: the Lease it created online.
		if l, err := kubelet.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{}); err != nil || l.UID != lease.UID {
			t.Errorf("%s: get of the node Lease: %v, %v; want the one created online", phase, l, err)
		}
	}
	offline.set(true)
	check("offline")
	if n := e.metric("tether_edge_apiserver_requests_total", "component", "kubelet", "verb", "create", "served", "local"); n != 2 {
		t.Errorf("%v kubelet creates answered locally, want 2 (a 409 for each body)", n)
	}
	e = e.restart()
	check("restarted offline")
}

// clientWith is a client of the proxy that sends its bodies in
// contentType.
func (e *edge) clientWith(userAgent, contentType string) kubernetes.Interface {
	_, cfg := e.client(userAgent)
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = contentType
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}
