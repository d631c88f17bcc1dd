package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/edgeaccess"
	"github.com/tether-edge/tether/internal/testenv"
)

// cloudServicePort is where the cloud host's HTTP server listens: the
// marked Service's targetPort.
const cloudServicePort = 8080

// TestPodsBothWaysServiceFromEdge: edge pods → cloud Services
// (docs/proposals/pods-both-ways.md §2). edge-1 runs a full kubelet on
// containerd and the real kube-proxy (nftables mode) through its
// tether-edge, which runs with --edge-services. A cloud host (the world's
// client, made a cloud Node by the admin) serves HTTP; a selectorless
// Service marked tether.io/edge-access, with an EndpointSlice naming that
// host on that Node, and an unmarked twin of it. A pod on edge-1 reaches
// the marked one by a name for its ClusterIP (hostAliases), through
// tether-edge's listener, a service stream and the gateway, which dials
// the endpoint; the same pod's request to the unmarked one is kube-proxy's
// as before, and the site cannot route to the cloud endpoint's answer.
//
// kube-proxy runs in its nftables mode, then in its iptables mode: the
// edge's table comes first beside either.
func TestPodsBothWaysServiceFromEdge(t *testing.T) {
	testenv.RequireRoot(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) { testServiceFromEdge(t, mode) })
	}
}

func testServiceFromEdge(t *testing.T, kubeProxyMode string) {
	w := world.New(t, bins, world.Options{RealKubelets: []string{"edge-1"}, PodCIDRs: true}, t.Logf)
	w.ApplyEdgeRBAC(t)
	gw := w.Gateways[0]
	gwCmd := w.StartGateway(t, gw, "--netrules", "nftables", "--edge-pod-cidrs="+world.EdgePodCIDRs.String(), "--edge-services")
	edge := w.Edge("edge-1")
	edgeCmd := w.StartEdge(t, edge, append(w.ProxyArgs(edge), "--edge-services")...)
	requireRunning := func(t *testing.T, what string) {
		t.Helper()
		if gw.Exited(gwCmd) {
			t.Fatalf("%s: tether-gateway exited: %s", what, lastLine(gw.Log(gwCmd)))
		}
		if edge.Host.Exited(edgeCmd) {
			t.Fatalf("%s: tether-edge exited: %s", what, lastLine(edge.Host.Log(edgeCmd)))
		}
	}
	w.StartRealKubelet(t, edge, world.RealKubeletOptions{})
	testenv.StartKubeProxyMode(t, edge.Host, edge.Name, "http://127.0.0.1:10261", kubeProxyMode)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := w.CP.Client

	// The cloud host: a Node the admin made (a cloud node: no edge label)
	// with the host's address, and an HTTP server that says whom it sees.
	cloud := w.Client
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cloud-1"}}
	node, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: cloud.Addr.String()}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ln, err := cloud.Listen("tcp", fmt.Sprintf(":%d", cloudServicePort))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(rw, "hello from the cloud to %s", host)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	// The marked Service and its unmarked twin, selectorless, each with
	// an EndpointSlice naming the cloud host on cloud-1.
	clusterIP := map[string]string{}
	for _, name := range []string{"marked", "unmarked", "edge-endpoint"} {
		addr, nodeName := cloud.Addr.String(), "cloud-1"
		if name == "edge-endpoint" {
			// A marked Service whose one endpoint is an edge's: the
			// gateway never dials an edge.
			addr, nodeName = edge.Host.Addr.String(), edge.Name
		}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(cloudServicePort)}}}}
		if name != "unmarked" {
			svc.Annotations = map[string]string{edgeaccess.Annotation: "true"}
		}
		if svc, err = c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		clusterIP[name] = svc.Spec.ClusterIP
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr}, NodeName: ptr.To(nodeName),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](cloudServicePort), Protocol: ptr.To(corev1.ProtocolTCP)}},
		}
		if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("cloud Services: marked %s, unmarked %s, both at %s:%d on cloud-1; marked %s at edge-1's own address",
		clusterIP["marked"], clusterIP["unmarked"], cloud.Addr, cloudServicePort, clusterIP["edge-endpoint"])

	// tether-edge has the marked ClusterIP in its rules, and only it.
	testenv.EventuallyNoError(t, "edge-1's table inet tether-edge to hold the marked ClusterIP", func() error {
		requireRunning(t, "edge-1's rules")
		out, err := edge.Host.Command(ctx, "nft", "list", "table", "inet", "tether-edge").CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft: %v: %s", err, out)
		}
		if !strings.Contains(string(out), clusterIP["marked"]+" . 80") {
			return fmt.Errorf("no %s . 80 in:\n%s", clusterIP["marked"], out)
		}
		if !strings.Contains(string(out), clusterIP["edge-endpoint"]+" . 80") {
			return fmt.Errorf("no %s . 80 in:\n%s", clusterIP["edge-endpoint"], out)
		}
		if strings.Contains(string(out), clusterIP["unmarked"]) {
			return fmt.Errorf("the unmarked ClusterIP %s is in:\n%s", clusterIP["unmarked"], out)
		}
		return nil
	})
	// kube-proxy has programmed the Services.
	testenv.EventuallyNoError(t, "edge-1's kube-proxy to program the ClusterIPs", func() error {
		list := []string{"nft", "list", "table", "ip", "kube-proxy"}
		if kubeProxyMode == "iptables" {
			list = []string{"iptables-save", "-t", "nat"}
		}
		out, err := edge.Host.Command(ctx, list[0], list[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft: %v: %s", err, out)
		}
		for _, ip := range clusterIP {
			if !strings.Contains(string(out), ip) {
				return fmt.Errorf("no %s in kube-proxy's table", ip)
			}
		}
		return nil
	})

	metric := func(h *testenv.Host, url, series string) float64 {
		t.Helper()
		m, err := world.Get(ctx, h, url)
		if err != nil {
			t.Fatalf("metrics %s: %v", url, err)
		}
		return world.Metric(m, series)
	}
	gwOK := func() float64 {
		return metric(gw, world.GatewayAdmin(gw, "/metrics"), `tether_gateway_edge_service_streams_total{result="ok"}`)
	}
	edgeStreams := func() float64 {
		m, err := world.Get(ctx, edge.Host, world.EdgeAdmin("/metrics"))
		if err != nil {
			t.Fatalf("metrics of edge-1: %v", err)
		}
		var sum float64
		for _, line := range strings.Split(m, "\n") {
			if strings.HasPrefix(line, "tether_edge_service_streams_total{") || strings.HasPrefix(line, "tether_edge_service_refusals_total{") {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				sum += v
			}
		}
		return sum
	}

	t.Run("Marked", func(t *testing.T) {
		before := gwOK()
		msg, phase := fetchFromPod(t, ctx, w, edge, "fetch-marked", clusterIP["marked"])
		if phase != corev1.PodSucceeded || !strings.HasSuffix(msg, "\r\n\r\nhello from the cloud to "+gw.Addr.String()) {
			t.Fatalf("pod fetching the marked Service: %s, %q; want Succeeded with the cloud's greeting to the gateway host %s", phase, msg, gw.Addr)
		}
		if after := gwOK(); after <= before {
			t.Errorf("tether_gateway_edge_service_streams_total{result=\"ok\"} = %v, was %v", after, before)
		}
	})

	// The gateway refuses a marked Service whose endpoint is an edge's;
	// tether-edge resets the pod's connection and counts the refusal.
	t.Run("EdgeEndpointRefused", func(t *testing.T) {
		series := `tether_edge_service_streams_total{result="no_endpoints"}`
		before := metric(edge.Host, world.EdgeAdmin("/metrics"), series)
		msg, phase := fetchFromPod(t, ctx, w, edge, "fetch-edge-endpoint", clusterIP["edge-endpoint"])
		if phase != corev1.PodFailed || strings.Contains(msg, "hello") {
			t.Fatalf("pod fetching a marked Service whose endpoint is an edge's: %s, %q; want Failed", phase, msg)
		}
		if after := metric(edge.Host, world.EdgeAdmin("/metrics"), series); after <= before {
			t.Errorf("%s = %v, was %v", series, after, before)
		}
	})

	t.Run("Unmarked", func(t *testing.T) {
		before := edgeStreams()
		msg, phase := fetchFromPod(t, ctx, w, edge, "fetch-unmarked", clusterIP["unmarked"])
		if phase != corev1.PodFailed {
			t.Fatalf("pod fetching the unmarked Service: %s, %q; want Failed (kube-proxy's endpoint is the cloud's, which the site does not route to)", phase, msg)
		}
		if after := edgeStreams(); after != before {
			t.Errorf("the unmarked Service's connection reached tether-edge's listener (its counters went from %v to %v)", before, after)
		}
	})
}

// fetchFromPod runs a busybox pod on e that asks http://<name>/ once,
// name being a hostAliases entry for clusterIP, and writes the answer (or
// nc's error) to its termination message; it returns the message and the
// pod's final phase, Succeeded when the cloud's server answered.
func fetchFromPod(t *testing.T, ctx context.Context, w *world.World, e *world.Edge, name, clusterIP string) (string, corev1.PodPhase) {
	t.Helper()
	c := w.CP.Client.CoreV1()
	_, err := c.ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create service account: %v", err)
	}
	host := name + ".cloud.test"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      e.Name,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			DNSPolicy:                     corev1.DNSDefault,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			HostAliases:                   []corev1.HostAlias{{IP: clusterIP, Hostnames: []string{host}}},
			Containers: []corev1.Container{{
				Name: "main", Image: testenv.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				// The answer, or nc's error, is the termination message.
				// (Debian's static busybox wget crashes; its nc resolves
				// through /etc/hosts.)
				Command: []string{"sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\nHost: %[1]s\r\n\r\n' | nc -w 10 %[1]s 80 >/tmp/out 2>/tmp/err; rc=$?; `+
					`cat /tmp/out /tmp/err > /dev/termination-log; [ $rc = 0 ] && grep -q 'hello from the cloud' /tmp/out`, host)},
			}},
		},
	}
	if _, err := c.Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	testenv.EventuallyWithin(t, 2*time.Minute, "pod "+name+" to finish", func() bool {
		p, err := c.Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		pod = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	var msg string
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Terminated != nil {
			msg = cs.State.Terminated.Message
		}
	}
	t.Logf("pod %s on %s fetched http://%s/ (%s): %s, %q", name, e.Name, host, clusterIP, pod.Status.Phase, msg)
	return msg, pod.Status.Phase
}

// lastLine is the last line of a log.
func lastLine(log string) string {
	log = strings.TrimSpace(log)
	return log[strings.LastIndexByte(log, '\n')+1:]
}
