// Package retired is the one home of a retired node identity: the record
// the operator writes (`tetherctl node retire NAME`), its format, and the
// watcher through which the gateway reads it.
//
// The record is the ConfigMap tether-retired-nodes in tether-system. Each
// key of its data is a node name; its value, the time of the retirement
// in RFC 3339 (UTC, whole seconds). A node's identity is retired up to
// that time: a certificate that names the node (CN=system:node:<name>)
// and was issued (NotBefore) at or before it is retired, and one issued
// after it, as for a new machine onboarded under the same name, is not.
// A value that does not parse retires every certificate of the name
// (fail closed). Nodes cannot write the record: they may only read
// ConfigMaps in tether-system (pool-rbac.yaml).
//
// Who reads it (docs/design.md, "Retired nodes"):
//   - the gateway (Watcher): a retired certificate gets no tunnel, and a
//     live tunnel whose certificate becomes retired is closed at once;
//     the routes, election records and delegated heartbeats an edge has
//     all ride its tunnel;
//   - kube-apiserver, through the admission policy tether-retired-nodes
//     (packaging/kubernetes/node-admission.yaml, this ConfigMap as its
//     parameter): a node identity whose name is retired may not create
//     its Node nor a CertificateSigningRequest. kube-apiserver cannot tell
//     two certificates of one name apart, so there the whole name is
//     retired.
package retired

import (
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Where the record is.
const (
	Namespace = "tether-system"
	ConfigMap = "tether-retired-nodes"
)

// Set is the retired node names, each with its time of retirement.
type Set map[string]time.Time

// forever is the time of a record that does not parse: every certificate
// of the name was issued before it.
var forever = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// FromConfigMap reads the set of cm (nil: none). A value that does not
// parse retires the name for good, and is reported in err.
func FromConfigMap(cm *corev1.ConfigMap) (Set, error) {
	s := Set{}
	if cm == nil {
		return s, nil
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(cm.Data)) {
		at, err := Parse(cm.Data[name])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s/%s: node %s: %w (every certificate of the name is retired)", Namespace, ConfigMap, name, err))
			at = forever
		}
		s[name] = at
	}
	return s, errors.Join(errs...)
}

// Retires reports whether cert, a certificate of node, is retired: the
// node is in the set and cert was issued at or before its retirement.
func (s Set) Retires(node string, cert *x509.Certificate) bool {
	at, ok := s[node]
	return ok && cert != nil && !cert.NotBefore.After(at)
}

// Format is the record's form of a time of retirement.
func Format(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

// Parse reads a time of retirement.
func Parse(v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("time of retirement %q: want RFC 3339 such as 2026-11-29T01:50:00Z", v)
	}
	return t, nil
}
