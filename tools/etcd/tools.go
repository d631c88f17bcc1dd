//go:build tools

// Package tools pins etcd, the store of the real kube-apiserver that
// Tether's integration tests run. Built from its server module.
package tools

import _ "go.etcd.io/etcd/server/v3"
