package accept

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter returns the series for listener of the counter named name
// (tether_gateway_accept_errors_total, tether_edge_accept_errors_total: each
// program has its own), registering the counter with reg the first time:
// every part of a program that registers with one reg shares it. A nil reg
// gives a nil Counter (nothing counted).
func Counter(reg prometheus.Registerer, name, listener string) (prometheus.Counter, error) {
	if reg == nil {
		return nil, nil
	}
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: name,
		Help: "Failed accepts (reads, for UDP) by listener, each retried after a backoff without stopping the process.",
	}, []string{"listener"})
	if err := reg.Register(v); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("register %s: %w", name, err)
		}
		existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return nil, fmt.Errorf("register %s: another collector has its name", name)
		}
		v = existing
	}
	return v.WithLabelValues(listener), nil
}
