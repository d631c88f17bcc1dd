package edgetunnel

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// PodSource is what the allow list knows of this node's pods (package
// edgeproxy/nodepods reads them through the apiserver proxy). Its
// methods never block: what is not known yet is said so, and the pod
// rule then refuses.
type PodSource interface {
	// PodRanges returns the node's own pod ranges (its Node's
	// spec.podCIDRs, else spec.podCIDR); ok is false until the Node has
	// been read.
	PodRanges() (ranges []netip.Prefix, ok bool)
	// PodsByIP returns the pods bound to this node (spec.nodeName) whose
	// status lists ip; synced is false until the pods have been read.
	PodsByIP(ip netip.Addr) (pods []*corev1.Pod, synced bool)
}

// AnnotationTunnelPorts on a pod names the ports of that pod the edge
// dials for the cloud: "none", or a comma-separated list of port numbers
// and names of TCP ports the pod declares. It replaces --allow-pod-ports
// for that pod.
const AnnotationTunnelPorts = "tether.io/tunnel-ports"

// PodPorts is --allow-pod-ports: the ports of a pod without the
// annotation that the edge dials.
type PodPorts struct {
	// Declared: the TCP ports the pod declares in its containers' and
	// init containers' ports.
	Declared bool
	// Ports, when not Declared: these ports (none when empty).
	Ports []uint16
}

// DefaultPodPorts is --allow-pod-ports's default, "declared".
var DefaultPodPorts = PodPorts{Declared: true}

// ParsePodPorts parses --allow-pod-ports: "declared", "none", or a
// comma-separated list of port numbers.
func ParsePodPorts(s string) (PodPorts, error) {
	switch strings.TrimSpace(s) {
	case "declared":
		return PodPorts{Declared: true}, nil
	case "none":
		return PodPorts{}, nil
	case "":
		return PodPorts{}, errors.New(`empty: give "declared", "none" or a comma-separated list of ports`)
	}
	var p PodPorts
	for _, f := range strings.Split(s, ",") {
		n, err := parsePort(strings.TrimSpace(f))
		if err != nil {
			return PodPorts{}, fmt.Errorf(`%q: %w (give "declared", "none" or a comma-separated list of ports)`, f, err)
		}
		if !slices.Contains(p.Ports, n) {
			p.Ports = append(p.Ports, n)
		}
	}
	return p, nil
}

// String is p as ParsePodPorts reads it.
func (p PodPorts) String() string {
	switch {
	case p.Declared:
		return "declared"
	case len(p.Ports) == 0:
		return "none"
	}
	s := make([]string, len(p.Ports))
	for i, n := range p.Ports {
		s[i] = strconv.Itoa(int(n))
	}
	return strings.Join(s, ",")
}

// parsePort reads a port number, 1 to 65535.
func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("not a port number")
	}
	return uint16(n), nil
}

// parseTunnelPorts reads a pod's tether.io/tunnel-ports annotation into
// ports; names are resolved through the TCP ports the pod declares.
// Entries that are neither a number nor such a name are returned in bad
// and otherwise ignored.
func parseTunnelPorts(v string, pod *corev1.Pod) (ports []uint16, bad []string) {
	if strings.TrimSpace(v) == "none" {
		return nil, nil
	}
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if n, err := parsePort(f); err == nil {
			ports = append(ports, n)
			continue
		}
		found := false
		forEachTCPPort(pod, func(cp corev1.ContainerPort) {
			if cp.Name == f {
				ports = append(ports, uint16(cp.ContainerPort))
				found = true
			}
		})
		if !found {
			bad = append(bad, f)
		}
	}
	return ports, bad
}

// declaredPorts are the TCP ports a pod declares.
func declaredPorts(pod *corev1.Pod) []uint16 {
	var out []uint16
	forEachTCPPort(pod, func(cp corev1.ContainerPort) { out = append(out, uint16(cp.ContainerPort)) })
	return out
}

// forEachTCPPort calls f with each TCP port (protocol TCP or empty) of
// the pod's containers and init containers (restartable sidecars serve;
// other init containers' ports are declared too, and Prometheus's pod
// role lists them alike).
func forEachTCPPort(pod *corev1.Pod, f func(corev1.ContainerPort)) {
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				if (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) && cp.ContainerPort > 0 && cp.ContainerPort <= 65535 {
					f(cp)
				}
			}
		}
	}
}
