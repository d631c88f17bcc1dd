package config

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Quantity makes a resource.Quantity a flag (fs.Var(config.Quantity{&q},
// ...)): a size as Kubernetes writes it, such as 512Mi, 1Gi or 1073741824.
// In the YAML file the same field takes the same text.
type Quantity struct{ Q *resource.Quantity }

func (v Quantity) String() string {
	if v.Q == nil {
		return ""
	}
	return v.Q.String()
}

// Set parses a quantity; a negative one is an error.
func (v Quantity) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q: want a size such as 512Mi or 1Gi", s)
	}
	if q.Sign() < 0 {
		return fmt.Errorf("%q: want a size of 0 or more", s)
	}
	*v.Q = q
	return nil
}
