// Package promreg registers a part's Prometheus collectors with the
// program's registry, if it has one: every part takes an optional
// prometheus.Registerer (nil in most tests) and registers its collectors
// all at once when it is built, failing on the first that cannot be.
//
// It is a leaf: every layer may import it.
package promreg

import "github.com/prometheus/client_golang/prometheus"

// Register registers cs with reg, in order, and returns the first error
// (such as prometheus.AlreadyRegisteredError), leaving the collectors
// before it registered. A nil reg registers nothing and returns nil.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
