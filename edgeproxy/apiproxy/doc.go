// Package apiproxy is tether-edge's kube-apiserver proxy: the apiserver of
// the node's components (kubelet, kube-proxy, coredns, flanneld), on
// 127.0.0.1:10261 in plain HTTP. It relays them to the cloud apiservers
// with the node's credentials (package upstream), keeps what they read in
// a bbolt cache (package cache), and while the cloud is unreachable
// answers them from that cache: reads, watches held open, the node's
// Lease renewed locally, pod and node status writes queued and replayed
// in order when the cloud is back (package writequeue).
//
// With PodOptions it also serves the node's pods on a listener of their
// own (tether-edge's --pod-api-listen, podapi.go): relayed with each
// pod's own token, never as the node, and offline answered only with
// what that token's identity read online (package podcache).
//
// README.md describes the data flow, how a request is classified, the
// behaviour of each kind of request online and offline, and the
// invariants.
package apiproxy
