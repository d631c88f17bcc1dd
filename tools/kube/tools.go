//go:build tools

// Package tools pins the Kubernetes components that Tether's tests run for
// real: kube-apiserver (the control plane every integration test talks to),
// kube-proxy (the real peer of the service-topology filter) and
// kube-controller-manager (its node lifecycle controller judges node
// heartbeats), kubectl (finds tetherctl as its plugin kubectl-tether),
// kubemark (the kubelet's own code with a fake runtime: the hollow node every
// e2e kubelet is) and the kubelet itself (with containerd, where containers
// matter).
// They are built from the k8s.io/kubernetes module, never
// downloaded as binaries.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubemark"
)
