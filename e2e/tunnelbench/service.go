package main

// The service mode (issue 31): a client in the stand-in pod's network
// namespace on the edge host reaches a cloud Service marked for edge
// access by its ClusterIP, through the edge's rules (table inet
// tether-edge), tether-edge's service listener, a service stream and the
// gateway, which dials the Service's endpoint: the direct mode's stand-in
// on a cloud host. Beside it, pod-direct: the same client to the same
// stand-in by its address, routed out of the site as a CNI routes a
// pod's traffic (the edge host forwards, the site router masquerades),
// without Tether.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/edgeaccess"
	"github.com/tether-edge/tether/internal/testenv"
)

const (
	svcMode       = "service"
	podDirectMode = "pod-direct"
	// svcName is the marked Service and its EndpointSlice, in namespace
	// default; cloudNodeName the Node the admin makes for the cloud host
	// that serves it.
	svcName       = "tunnelbench-svc"
	cloudNodeName = "cloud-stand-in"
	// edgeServicePort is tether-edge's default --service-listen port.
	edgeServicePort = 10271
	// svcRate is the gateway's --service-streams-per-second in the
	// bench: far above the rates this bench reaches, so that it measures
	// the path rather than the gateway's bound on an edge's new
	// connections (100 a second by default, which refuses the rest).
	svcRate = 100000
)

// startService makes, as the admin, a cloud Node for host (its address
// as InternalIP, no edge label), a selectorless Service marked
// tether.io/edge-access with a ClusterIP and the stand-in's port, and an
// EndpointSlice whose one ready endpoint is host's stand-in on that
// Node. It returns the Service's ClusterIP and port.
func startService(ctx context.Context, w *world.World, host *testenv.Host) (netip.AddrPort, error) {
	c := w.CP.Client
	node, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cloudNodeName}}, metav1.CreateOptions{})
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("create node %s: %w", cloudNodeName, err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host.Addr.String()}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("set the addresses of node %s: %w", cloudNodeName, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: "default", Annotations: map[string]string{edgeaccess.Annotation: "true"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: world.KubeletPort,
			TargetPort: intstr.FromInt32(world.KubeletPort), Protocol: corev1.ProtocolTCP}}},
	}
	if svc, err = c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("create service %s: %w", svcName, err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("service %s: ClusterIP %q: %w", svcName, svc.Spec.ClusterIP, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svcName + "-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host.Addr.String()}, NodeName: ptr.To(cloudNodeName),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](world.KubeletPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("create endpoint slice %s: %w", slice.Name, err)
	}
	return netip.AddrPortFrom(ip, uint16(world.KubeletPort)), nil
}

// openPodDirect lets the pod namespace of e reach the cloud directly, for
// the pod-direct mode: e's host forwards the pod's packets to the site
// router, which masquerades them as it does the site's own and routes
// e's pod range back to e's host. The marked ClusterIP is redirected on
// e's host before any of this, so the service mode is unchanged by it.
func openPodDirect(s *testenv.Session, e *world.Edge) error {
	if err := e.Host.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		return fmt.Errorf("ip_forward on %s: %w", e.Name, err)
	}
	e.Site.Router().Run(s, "ip", "route", "replace", e.PodCIDR.String(), "via", e.Host.Addr.String())
	return nil
}

// dialTo is a dial function from h that connects to addr whatever the
// address asked: the client names the stand-in by its own address (its
// certificate's), the connection goes to the Service's ClusterIP, as a
// DNS name resolving to the ClusterIP would.
func dialTo(h *testenv.Host, addr netip.AddrPort) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		return h.DialContext(ctx, network, net.JoinHostPort(addr.Addr().String(), strconv.Itoa(int(addr.Port()))))
	}
}

// svcCounters are the counters printed after the run, which tell that
// the service mode's connections took the service path and what was
// refused: tether-edge's and tether-gateway's.
var svcCounters = []string{
	"tether_edge_service_streams_total", "tether_edge_service_refusals_total",
	"tether_gateway_edge_service_streams_total", "tether_gateway_edge_service_refusals_total",
}

// nonZero is the samples of the counter name in a Prometheus text
// exposition whose value is not zero, as "name{labels} value", in the
// exposition's order; "name: none" when there is none.
func nonZero(exposition, name string) []string {
	var out []string
	for _, line := range strings.Split(exposition, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err != nil || v == 0 {
			continue
		}
		out = append(out, line)
	}
	if len(out) == 0 {
		return []string{name + ": none"}
	}
	return out
}

// printServiceCounters prints the non-zero samples of svcCounters from
// e's and gw's /metrics.
func printServiceCounters(ctx context.Context, gw *testenv.Host, e *world.Edge) {
	edgeM, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
	if err != nil {
		fmt.Printf("service counters: %s /metrics: %v\n", e.Name, err)
		return
	}
	gwM, err := world.Get(ctx, gw, world.GatewayAdmin(gw, "/metrics"))
	if err != nil {
		fmt.Printf("service counters: %s /metrics: %v\n", gw.Label, err)
		return
	}
	fmt.Printf("service counters (%s, %s; every request of the service mode, warm-ups included):\n", e.Name, gw.Label)
	for _, name := range svcCounters {
		m := edgeM
		if strings.HasPrefix(name, "tether_gateway_") {
			m = gwM
		}
		for _, l := range nonZero(m, name) {
			fmt.Printf("  %s\n", l)
		}
	}
}
