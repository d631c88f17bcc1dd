package edgetunnel

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// AddrSource lists the node's own addresses.
type AddrSource interface {
	Addrs() ([]netip.Addr, error)
}

// InterfaceAddrs is the AddrSource of the host's network interfaces.
type InterfaceAddrs struct{}

var _ AddrSource = InterfaceAddrs{}

func (InterfaceAddrs) Addrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	var out []netip.Addr
	for _, ifa := range ifas {
		if n, ok := ifa.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, nil
}

const (
	// addrsMaxAge: the node's addresses are re-read at least this often.
	addrsMaxAge = 30 * time.Second
	// addrsMinAge: a destination not in the list re-reads the addresses
	// (an address added a moment ago is allowed at once), but no more
	// often than this, so refused requests cannot make us spin.
	addrsMinAge = time.Second
)

// allowList decides which destinations the edge dials, by two rules
// decided on the destination, in this order:
//
//  1. loopback or one of the node's own addresses (which include cni0's,
//     inside the pod range): on --allow-ports only, so that a pod range
//     is never a way to host services listening on the wildcard;
//  2. an address inside the node's own pod ranges that a pod of this node
//     holds (not hostNetwork, not finished): on that pod's allowed ports
//     (its tether.io/tunnel-ports annotation, else --allow-pod-ports).
//
// Anything else is refused.
type allowList struct {
	ports []uint16
	src   AddrSource
	clock clock.PassiveClock
	log   *slog.Logger
	// pods knows the node's pod ranges and pods; nil: rule 2 is off.
	pods PodSource
	// podPorts is --allow-pod-ports, for pods without the annotation.
	podPorts PodPorts

	mu      sync.Mutex
	addrs   map[netip.Addr]bool
	fetched time.Time
	// badAnnotations are the pods (UID) whose malformed annotation
	// (value) was logged, so that it is logged once per pod and value.
	badAnnotations map[types.UID]string
}

// check returns "" when dest is allowed, and otherwise why not.
func (a *allowList) check(dest netip.AddrPort) string {
	addr := dest.Addr().Unmap().WithZone("")
	if addr.IsLoopback() || a.isLocal(addr) {
		if !slices.Contains(a.ports, dest.Port()) {
			return fmt.Sprintf("port %d is not in --allow-ports", dest.Port())
		}
		return ""
	}
	if reason, inRange := a.checkPod(addr, dest.Port()); inRange {
		return reason
	}
	if !slices.Contains(a.ports, dest.Port()) {
		return fmt.Sprintf("port %d is not in --allow-ports", dest.Port())
	}
	return fmt.Sprintf("%s is not an address of this node nor in its pod ranges", addr)
}

// checkPod applies rule 2 to an address that is not the node's own:
// inRange is false when addr is outside the node's pod ranges (or they
// are not known), and then the rule says nothing. It never waits: pods
// not known yet are refused.
func (a *allowList) checkPod(addr netip.Addr, port uint16) (reason string, inRange bool) {
	if a.pods == nil {
		return "", false
	}
	ranges, ok := a.pods.PodRanges()
	if !ok || !slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return p.Contains(addr) }) {
		return "", false
	}
	pods, synced := a.pods.PodsByIP(addr)
	if !synced {
		return fmt.Sprintf("%s is in this node's pod range but its pods are not known yet", addr), true
	}
	i := slices.IndexFunc(pods, func(p *corev1.Pod) bool { return eligible(p, addr) })
	if i < 0 {
		return fmt.Sprintf("%s is in this node's pod range but no pod of this node has it", addr), true
	}
	pod := pods[i]
	if !slices.Contains(a.portsOf(pod), port) {
		return fmt.Sprintf("%s is not an allowed port of pod %s/%s (declare it in the pod's ports or its %s annotation)",
			netip.AddrPortFrom(addr, port), pod.Namespace, pod.Name, AnnotationTunnelPorts), true
	}
	return "", true
}

// eligible reports whether the edge may dial pod at addr: a pod of its
// own network (not hostNetwork), not finished, that lists addr in its
// status.
func eligible(pod *corev1.Pod, addr netip.Addr) bool {
	if pod == nil || pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	return slices.Contains(PodIPs(pod), addr)
}

// PodIPs are the addresses in a pod's status.podIPs (status.podIP when
// that is empty); unparsable entries are left out.
func PodIPs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	for _, ip := range pod.Status.PodIPs {
		add(ip.IP)
	}
	if len(out) == 0 {
		add(pod.Status.PodIP)
	}
	return out
}

// portsOf returns the ports the edge dials on pod: those its annotation
// names, else those --allow-pod-ports gives it.
func (a *allowList) portsOf(pod *corev1.Pod) []uint16 {
	if v, ok := pod.Annotations[AnnotationTunnelPorts]; ok {
		ports, bad := parseTunnelPorts(v, pod)
		if len(bad) > 0 {
			a.logBadAnnotation(pod, v, bad)
		}
		return ports
	}
	if a.podPorts.Declared {
		return declaredPorts(pod)
	}
	return a.podPorts.Ports
}

// maxBadAnnotations bounds the pods whose malformed annotation is
// remembered as logged; past it the memory starts over.
const maxBadAnnotations = 1024

// logBadAnnotation logs a malformed annotation once per pod and value.
func (a *allowList) logBadAnnotation(pod *corev1.Pod, value string, bad []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.badAnnotations[pod.UID]; ok && v == value {
		return
	}
	if a.badAnnotations == nil || len(a.badAnnotations) >= maxBadAnnotations {
		a.badAnnotations = map[types.UID]string{}
	}
	a.badAnnotations[pod.UID] = value
	a.log.Warn("ignoring entries of a pod's "+AnnotationTunnelPorts+" annotation: neither a port number nor the name of a TCP port the pod declares",
		"pod", pod.Namespace+"/"+pod.Name, "annotation", value, "ignored", bad)
}

func (a *allowList) isLocal(addr netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	age := a.clock.Since(a.fetched)
	if a.addrs == nil || age >= addrsMaxAge || (!a.addrs[addr] && age >= addrsMinAge) {
		a.refresh()
	}
	return a.addrs[addr]
}

// refresh re-reads the addresses; on failure it keeps the old ones.
func (a *allowList) refresh() {
	a.fetched = a.clock.Now()
	list, err := a.src.Addrs()
	if err != nil {
		a.log.Warn("cannot read the node's addresses; keeping the previous list", "err", err)
		if a.addrs == nil {
			a.addrs = map[netip.Addr]bool{}
		}
		return
	}
	m := make(map[netip.Addr]bool, len(list))
	for _, ad := range list {
		m[ad.Unmap().WithZone("")] = true
	}
	a.addrs = m
}
