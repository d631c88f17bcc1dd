package nodepods

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/testenv"
)

func TestRanges(t *testing.T) {
	for _, tc := range []struct {
		spec corev1.NodeSpec
		want []string
	}{
		{corev1.NodeSpec{PodCIDR: "10.244.3.0/24", PodCIDRs: []string{"10.244.3.0/24", "fd00:10:244:3::/64"}}, []string{"10.244.3.0/24", "fd00:10:244:3::/64"}},
		{corev1.NodeSpec{PodCIDR: "10.244.4.0/24"}, []string{"10.244.4.0/24"}},
		{corev1.NodeSpec{PodCIDRs: []string{"10.244.5.9/24", "bogus"}}, []string{"10.244.5.0/24"}},
		{corev1.NodeSpec{}, nil},
	} {
		var got []string
		for _, p := range Ranges(&corev1.Node{Spec: tc.spec}) {
			got = append(got, p.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Ranges(%+v) = %v, want %v", tc.spec, got, tc.want)
		}
	}
}

// TestPodsAgainstKubeAPIServer runs the informers as a node identity
// against a real kube-apiserver (Node and RBAC authorizers, no RBAC
// granted to nodes): the node reads its own Node's ranges and its own
// pods by address, follows their changes, and never sees another
// node's pods.
func TestPodsAgainstKubeAPIServer(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := cp.Client.CoreV1()
	for name, cidrs := range map[string][]string{"edge-1": {"10.244.3.0/24", "fd00:10:244:3::/64"}, "edge-2": {"10.244.9.0/24"}} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs}}
		if _, err := admin.Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const ns = "shop"
	if _, err := admin.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// runPod creates a running pod on node with the given addresses.
	runPod := func(name, node string, ips ...string) *corev1.Pod {
		t.Helper()
		p, err := admin.Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = ips[0]
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		if p, err = admin.Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	web := runPod("web", "edge-1", "10.244.3.7", "fd00:10:244:3::7")
	runPod("other", "edge-2", "10.244.9.7")

	_, cfg, _ := cp.NodeClient(t, "edge-1")
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The Node authorizer allows what the informers ask, and not more:
	// no RBAC lets a node list every pod or read another node.
	if _, err := client.Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a node listing every pod: %v, want forbidden", err)
	}
	if _, err := client.Nodes().Get(ctx, "edge-2", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a node reading another Node: %v, want forbidden", err)
	}

	p := New("edge-1", client)
	if _, ok := p.PodRanges(); ok {
		t.Error("ranges known before the informers ran")
	}
	if _, synced := p.PodsByIP(netip.MustParseAddr("10.244.3.7")); synced {
		t.Error("pods known before the informers ran")
	}
	ictx, stop := context.WithCancel(ctx)
	p.Start(ictx)
	defer func() { stop(); p.Shutdown() }()
	testenv.Eventually(t, "the informers sync", p.HasSynced)

	ranges, ok := p.PodRanges()
	if want := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")}; !ok || !slices.Equal(ranges, want) {
		t.Errorf("PodRanges() = %v, %v; want %v", ranges, ok, want)
	}
	names := func(ip string) []string {
		pods, synced := p.PodsByIP(netip.MustParseAddr(ip))
		if !synced {
			t.Errorf("PodsByIP(%s): not synced", ip)
		}
		var out []string
		for _, pod := range pods {
			out = append(out, pod.Name)
			if len(pod.ManagedFields) != 0 || pod.Spec.Containers[0].Image != "" {
				t.Errorf("pod %s kept more than the allow list reads", pod.Name)
			}
			if len(pod.Spec.Containers[0].Ports) != 1 || pod.Spec.Containers[0].Ports[0].ContainerPort != 8080 {
				t.Errorf("pod %s lost its ports: %+v", pod.Name, pod.Spec.Containers)
			}
		}
		return out
	}
	for ip, want := range map[string][]string{"10.244.3.7": {"web"}, "fd00:10:244:3::7": {"web"}, "::ffff:10.244.3.7": {"web"}, "10.244.9.7": nil, "10.244.3.8": nil} {
		if got := names(ip); !slices.Equal(got, want) {
			t.Errorf("PodsByIP(%s) = %v, want %v", ip, got, want)
		}
	}

	// A new address is followed, the old one forgotten; a deleted pod
	// is gone.
	web.Status.PodIPs = []corev1.PodIP{{IP: "10.244.3.8"}}
	web.Status.PodIP = "10.244.3.8"
	if _, err := admin.Pods(ns).UpdateStatus(ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the new address", func() bool { return slices.Equal(names("10.244.3.8"), []string{"web"}) })
	if got := names("10.244.3.7"); got != nil {
		t.Errorf("the old address still gives %v", got)
	}
	runPod("late", "edge-1", "10.244.3.20")
	testenv.Eventually(t, "a new pod", func() bool { return slices.Equal(names("10.244.3.20"), []string{"late"}) })
	if err := admin.Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the deleted pod gone", func() bool { return names("10.244.3.8") == nil })
}

// TestTrimPod: the trimmed pod keeps every field the allow list reads.
func TestTrimPod(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1", ResourceVersion: "7",
			Annotations: map[string]string{"tether.io/tunnel-ports": "metrics", "other": "x"}, Labels: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.PodSpec{NodeName: "edge-1", HostNetwork: true,
			Containers: []corev1.Container{{Name: "app", Image: "img", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}}},
				{Name: "noports", Image: "img"}},
			InitContainers: []corev1.Container{{Name: "proxy", Image: "img", RestartPolicy: &always,
				Ports: []corev1.ContainerPort{{Name: "envoy", ContainerPort: 15090, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.3.7", PodIPs: []corev1.PodIP{{IP: "10.244.3.7"}}},
	}
	obj, err := trimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1", ResourceVersion: "7",
			Annotations: map[string]string{"tether.io/tunnel-ports": "metrics"}},
		Spec: corev1.PodSpec{NodeName: "edge-1", HostNetwork: true,
			Containers:     []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}}}},
			InitContainers: []corev1.Container{{Name: "proxy", Ports: []corev1.ContainerPort{{Name: "envoy", ContainerPort: 15090, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.3.7", PodIPs: []corev1.PodIP{{IP: "10.244.3.7"}}},
	}
	if diff := cmp.Diff(want, obj); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// The Node is kept to its pod ranges and InternalIP addresses, which the
// edge's service rules send pods' connections to.
func TestTrimNodeInternalIPs(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Labels: map[string]string{"a": "b"}},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.3.0/24"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "edge-1"}, {Type: corev1.NodeInternalIP, Address: "192.168.50.10"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.9"}, {Type: corev1.NodeInternalIP, Address: "fd00:50::10"},
		}}}
	got, err := trimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.3.0/24"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "192.168.50.10"}, {Type: corev1.NodeInternalIP, Address: "fd00:50::10"}}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trimNode (-want +got):\n%s", diff)
	}
}
