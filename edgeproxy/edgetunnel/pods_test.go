package edgetunnel

import (
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakePods is a PodSource with settable ranges and pods. Like the real
// one, it answers only with pods of this node; unlike it, it does not
// leave out hostNetwork or finished pods, which the allow list must.
type fakePods struct {
	ranges      []netip.Prefix
	rangesKnown bool
	pods        []*corev1.Pod
	synced      bool
}

var _ PodSource = (*fakePods)(nil)

func (f *fakePods) PodRanges() ([]netip.Prefix, bool) { return f.ranges, f.rangesKnown }

func (f *fakePods) PodsByIP(ip netip.Addr) ([]*corev1.Pod, bool) {
	var out []*corev1.Pod
	for _, p := range f.pods {
		if slices.Contains(PodIPs(p), ip) {
			out = append(out, p)
		}
	}
	return out, f.synced
}

// testPod is a running pod of this node with the given addresses and
// containers.
func testPod(ns, name string, ips []string, containers ...corev1.Container) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name)},
		Spec:       corev1.PodSpec{NodeName: "edge-1", Containers: containers},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

func ctr(name string, ports ...corev1.ContainerPort) corev1.Container {
	return corev1.Container{Name: name, Image: "img", Ports: ports}
}

func port(name string, n int32, proto corev1.Protocol) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: n, Protocol: proto}
}

// podAllowList is an allow list of a node with the host addresses
// 192.168.1.10 and 10.244.3.1 (cni0, inside the pod range 10.244.3.0/24)
// and fd00:10:244:3::/64, --allow-ports 10250,10255.
func podAllowList(t *testing.T, pods *fakePods, podPorts PodPorts) (*allowList, func(dest, want string)) {
	t.Helper()
	var list atomic.Pointer[[]netip.Addr]
	host := []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("10.244.3.1"), netip.MustParseAddr("fd00:10:244:3::1")}
	list.Store(&host)
	a := &allowList{ports: []uint16{10250, 10255}, src: fakeAddrs{&list}, clock: clocktesting.NewFakePassiveClock(time.Now()),
		log: slog.New(slog.DiscardHandler), podPorts: podPorts}
	if pods != nil {
		a.pods = pods
	}
	check := func(dest, want string) {
		t.Helper()
		got := a.check(netip.MustParseAddrPort(dest))
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("check(%s) = %q, want %q", dest, got, want)
		}
	}
	return a, check
}

func TestAllowPodPorts(t *testing.T) {
	// web declares 8080 (protocol left empty), 9090 and a UDP port in its
	// containers, and 15090 in a restartable init container (a sidecar).
	always := corev1.ContainerRestartPolicyAlways
	web := testPod("shop", "web", []string{"10.244.3.7", "fd00:10:244:3::7"},
		ctr("app", port("http", 8080, ""), port("dns", 53, corev1.ProtocolUDP)),
		ctr("exporter", port("metrics", 9090, corev1.ProtocolTCP)))
	web.Spec.InitContainers = []corev1.Container{ctr("proxy", port("envoy-prom", 15090, corev1.ProtocolTCP))}
	web.Spec.InitContainers[0].RestartPolicy = &always
	// hook's annotation replaces what it declares: a name, a number it
	// does not declare, and entries that are neither.
	hook := testPod("shop", "hook", []string{"10.244.3.8"},
		ctr("app", port("https", 8443, ""), port("metrics", 9090, ""), port("admin", 7000, "")))
	hook.Annotations = map[string]string{AnnotationTunnelPorts: "https, 3000,nosuch,70000, dns"}
	hook.Spec.Containers[0].Ports = append(hook.Spec.Containers[0].Ports, port("dns", 5353, corev1.ProtocolUDP))
	closed := testPod("shop", "closed", []string{"10.244.3.9"}, ctr("app", port("http", 8080, "")))
	closed.Annotations = map[string]string{AnnotationTunnelPorts: "none"}
	hostNet := testPod("kube-system", "agent", []string{"10.244.3.10"}, ctr("agent", port("http", 8080, "")))
	hostNet.Spec.HostNetwork = true
	done := testPod("batch", "job-1", []string{"10.244.3.11"}, ctr("job", port("http", 8080, "")))
	done.Status.Phase = corev1.PodSucceeded
	failed := testPod("batch", "job-2", []string{"10.244.3.11"}, ctr("job", port("http", 8080, "")))
	failed.Status.Phase = corev1.PodFailed
	// A pod whose status names another node's range (its kubelet lied,
	// or a stale object): that address is not this node's to dial.
	stray := testPod("shop", "stray", []string{"10.244.9.7"}, ctr("app", port("http", 8080, "")))
	// A finished pod and a running one with the same address: the
	// running one decides.
	reused := testPod("batch", "job-3", []string{"10.244.3.12"}, ctr("job", port("http", 8080, "")))
	reused.Status.Phase = corev1.PodFailed
	current := testPod("shop", "api", []string{"10.244.3.12"}, ctr("app", port("grpc", 50051, "")))

	src := &fakePods{
		ranges:      []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")},
		rangesKnown: true, synced: true,
		pods: []*corev1.Pod{web, hook, closed, hostNet, done, failed, stray, reused, current},
	}

	t.Run("declared", func(t *testing.T) {
		a, check := podAllowList(t, src, DefaultPodPorts)
		check("10.244.3.7:8080", "")
		check("10.244.3.7:9090", "")
		check("10.244.3.7:15090", "")
		check("[fd00:10:244:3::7]:8080", "")
		check("[::ffff:10.244.3.7]:9090", "")
		check("10.244.3.7:22", "10.244.3.7:22 is not an allowed port of pod shop/web (declare it in the pod's ports or its tether.io/tunnel-ports annotation)")
		check("10.244.3.7:53", "not an allowed port of pod shop/web")    // UDP
		check("10.244.3.7:10250", "not an allowed port of pod shop/web") // --allow-ports is the node's
		check("10.244.3.12:50051", "")
		check("10.244.3.12:8080", "not an allowed port of pod shop/api")

		// The annotation replaces the declared ports; names resolve to
		// the declared TCP port, numbers need not be declared.
		check("10.244.3.8:8443", "")
		check("10.244.3.8:3000", "")
		check("10.244.3.8:9090", "not an allowed port of pod shop/hook")
		check("10.244.3.8:7000", "not an allowed port of pod shop/hook")
		check("10.244.3.8:5353", "not an allowed port of pod shop/hook") // "dns" is a UDP port
		if len(a.badAnnotations) != 1 || a.badAnnotations[hook.UID] == "" {
			t.Errorf("malformed annotations remembered as logged: %v, want hook's once", a.badAnnotations)
		}
		check("10.244.3.9:8080", "not an allowed port of pod shop/closed") // "none"

		check("10.244.3.10:8080", "10.244.3.10 is in this node's pod range but no pod of this node has it") // hostNetwork
		check("10.244.3.11:8080", "10.244.3.11 is in this node's pod range but no pod of this node has it") // finished
		check("10.244.3.13:8080", "10.244.3.13 is in this node's pod range but no pod of this node has it") // nobody's
		check("10.244.9.7:8080", "not in --allow-ports")                                                    // another node's range
		check("10.244.9.7:10250", "10.244.9.7 is not an address of this node")
	})
	t.Run("none", func(t *testing.T) {
		_, check := podAllowList(t, src, PodPorts{})
		check("10.244.3.7:8080", "not an allowed port of pod shop/web")
		check("10.244.3.8:8443", "") // the annotation still opens its ports
		check("10.244.3.8:3000", "")
	})
	t.Run("list", func(t *testing.T) {
		pp, err := ParsePodPorts("9100, 8080")
		if err != nil {
			t.Fatal(err)
		}
		_, check := podAllowList(t, src, pp)
		check("10.244.3.7:8080", "")
		check("10.244.3.7:9100", "") // listed, not declared
		check("10.244.3.7:9090", "not an allowed port of pod shop/web")
		check("10.244.3.8:8080", "not an allowed port of pod shop/hook") // the annotation replaces the flag
		check("10.244.3.8:8443", "")
	})
	t.Run("not known yet", func(t *testing.T) {
		unsynced := *src
		unsynced.synced = false
		_, check := podAllowList(t, &unsynced, DefaultPodPorts)
		check("10.244.3.7:8080", "10.244.3.7 is in this node's pod range but its pods are not known yet")
		check("10.244.3.1:10250", "") // the node rule does not wait for pods
		noNode := *src
		noNode.rangesKnown = false
		_, check = podAllowList(t, &noNode, DefaultPodPorts)
		check("10.244.3.7:8080", "not in --allow-ports")
		check("192.168.1.10:10250", "")
	})
	t.Run("no pod source", func(t *testing.T) {
		_, check := podAllowList(t, nil, DefaultPodPorts)
		check("10.244.3.7:8080", "not in --allow-ports")
		check("10.244.3.7:10250", "not an address of this node")
	})
}

// TestAllowPodRangeHostAddress: a host address inside the pod range (the
// bridge's, cni0 10.244.3.1) is the node's, on --allow-ports only, even
// when a pod claims it with a declared port.
func TestAllowPodRangeHostAddress(t *testing.T) {
	web := testPod("shop", "web", []string{"10.244.3.7"}, ctr("app", port("http", 8080, "")))
	claim := testPod("shop", "claim", []string{"10.244.3.1"}, ctr("app", port("http", 8080, ""), port("ssh", 22, "")))
	claim.Annotations = map[string]string{AnnotationTunnelPorts: "22,8080,10250"}
	src := &fakePods{ranges: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}, rangesKnown: true, synced: true,
		pods: []*corev1.Pod{web, claim}}
	for _, pp := range []PodPorts{DefaultPodPorts, {Ports: []uint16{22, 8080}}} {
		_, check := podAllowList(t, src, pp)
		check("10.244.3.7:8080", "") // the pod rule is on
		check("10.244.3.1:8080", "port 8080 is not in --allow-ports")
		check("10.244.3.1:22", "port 22 is not in --allow-ports")
		check("10.244.3.1:10250", "")
		check("10.244.3.1:10255", "")
		check("192.168.1.10:8080", "port 8080 is not in --allow-ports")
	}
}

func TestParsePodPorts(t *testing.T) {
	for in, want := range map[string]string{"declared": "declared", "none": "none", "9100": "9100", " 9100, 8080,9100": "9100,8080"} {
		p, err := ParsePodPorts(in)
		if err != nil || p.String() != want {
			t.Errorf("ParsePodPorts(%q) = %v, %v; want %s", in, p, err, want)
		}
	}
	for _, bad := range []string{"", "all", "0", "70000", "9100,", "http", "declared,9100"} {
		if _, err := ParsePodPorts(bad); err == nil {
			t.Errorf("ParsePodPorts(%q) accepted", bad)
		}
	}
}
