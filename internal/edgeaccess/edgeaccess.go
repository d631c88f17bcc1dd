// Package edgeaccess is the mark on a Service that lets pods of edge
// nodes reach it (annotation tether.io/edge-access), read alike by the
// gateway, which dials only endpoints of marked Services, and by
// tether-edge, which redirects only connections to marked ClusterIPs and
// ports. It is a leaf: both programs import it.
package edgeaccess

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Annotation marks a Service for edge access: "true" opens every TCP port
// of the Service, a comma-separated list of port names or numbers opens
// those. Any other value opens nothing.
const Annotation = "tether.io/edge-access"

// Port returns the Service's TCP port numbered port when the Service is
// marked for it, and why not otherwise. ExternalName and headless
// Services are never marked: they have no ClusterIP.
func Port(svc *corev1.Service, port uint16) (corev1.ServicePort, string) {
	if svc == nil {
		return corev1.ServicePort{}, "no such Service"
	}
	mark, ok := svc.Annotations[Annotation]
	if !ok {
		return corev1.ServicePort{}, fmt.Sprintf("Service %s/%s has no %s annotation", svc.Namespace, svc.Name, Annotation)
	}
	if !hasClusterIP(svc) {
		return corev1.ServicePort{}, fmt.Sprintf("Service %s/%s has no cluster IP", svc.Namespace, svc.Name)
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Port == int32(port) && isTCP(p)
	})
	if i < 0 {
		return corev1.ServicePort{}, fmt.Sprintf("Service %s/%s has no TCP port %d", svc.Namespace, svc.Name, port)
	}
	sp := svc.Spec.Ports[i]
	if marks(mark, sp) {
		return sp, ""
	}
	return corev1.ServicePort{}, fmt.Sprintf("port %d of Service %s/%s is not among %s=%q", port, svc.Namespace, svc.Name, Annotation, mark)
}

// Ports returns the Service's marked TCP ports, in the order of its spec;
// none when it is not marked or has no ClusterIP.
func Ports(svc *corev1.Service) []corev1.ServicePort {
	mark, ok := svc.Annotations[Annotation]
	if !ok || !hasClusterIP(svc) {
		return nil
	}
	var out []corev1.ServicePort
	for _, sp := range svc.Spec.Ports {
		if isTCP(sp) && sp.Port > 0 && sp.Port < 1<<16 && marks(mark, sp) {
			out = append(out, sp)
		}
	}
	return out
}

func hasClusterIP(svc *corev1.Service) bool {
	return svc.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone
}

func isTCP(p corev1.ServicePort) bool { return p.Protocol == "" || p.Protocol == corev1.ProtocolTCP }

// marks reports whether the annotation's value mark opens sp.
func marks(mark string, sp corev1.ServicePort) bool {
	if strings.TrimSpace(mark) == "true" {
		return true
	}
	for f := range strings.SplitSeq(mark, ",") {
		f = strings.TrimSpace(f)
		if f != "" && (f == sp.Name || f == strconv.Itoa(int(sp.Port))) {
			return true
		}
	}
	return false
}
