//go:build tools

// Package tools pins the Kubernetes components that Tether's tests run for
// real: kube-apiserver (the control plane every integration test talks to)
// and kube-proxy (the real peer of the service-topology filter). They are
// built from the k8s.io/kubernetes module, never downloaded as binaries.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
