package config

import (
	"flag"
	"io"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestQuantity(t *testing.T) {
	var q resource.Quantity
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var(Quantity{&q}, "size", "")
	if err := fs.Parse([]string{"--size", "512Mi"}); err != nil || q.Value() != 512<<20 {
		t.Errorf("512Mi: %v, %v", q.Value(), err)
	}
	for _, bad := range []string{"-1Gi", "lots", ""} {
		if err := fs.Parse([]string{"--size", bad}); err == nil {
			t.Errorf("--size %q accepted: %v", bad, q.String())
		}
	}
	if q.Value() != 512<<20 {
		t.Errorf("a refused value changed the flag to %s", q.String())
	}
}
