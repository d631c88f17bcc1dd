package promreg

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegister(t *testing.T) {
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	b := prometheus.NewGauge(prometheus.GaugeOpts{Name: "b", Help: "b"})
	if err := Register(nil, a, b); err != nil {
		t.Fatalf("nil registerer: %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, a, b); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 2 || mfs[0].GetName() != "a_total" || mfs[1].GetName() != "b" {
		t.Fatalf("gathered %v, want a_total and b", mfs)
	}

	// The first error is returned; the collectors before it stay registered.
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c_total", Help: "c"})
	d := prometheus.NewCounter(prometheus.CounterOpts{Name: "d_total", Help: "d"})
	err = Register(reg, c, a, d)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) || are.ExistingCollector != a {
		t.Fatalf("registering a again: %v, want AlreadyRegisteredError for a", err)
	}
	if !reg.Unregister(c) {
		t.Error("c, before the failure, was not registered")
	}
	if reg.Unregister(d) {
		t.Error("d, after the failure, was registered")
	}
}
