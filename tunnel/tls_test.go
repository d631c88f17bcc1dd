package tunnel

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"testing"
)

func TestNodeName(t *testing.T) {
	for _, tc := range []struct {
		cn   string
		orgs []string
		want string
	}{
		{"system:node:edge-1", []string{"system:nodes"}, "edge-1"},
		{"system:node:shop-17.example", []string{"tether:edges", "system:nodes"}, "shop-17.example"},
		{"edge-1", []string{"system:nodes"}, ""},
		{"system:node:edge-1", nil, ""},
		{"system:node:edge-1", []string{"system:masters"}, ""},
		{"system:node:", []string{"system:nodes"}, ""},
		{"system:node:Edge_1", []string{"system:nodes"}, ""},
	} {
		cert := &x509.Certificate{Subject: pkix.Name{CommonName: tc.cn, Organization: tc.orgs}}
		got, err := NodeName(cert)
		if tc.want == "" {
			if !errors.Is(err, ErrNotANode) {
				t.Errorf("NodeName(%q, %v) = %q, %v; want ErrNotANode", tc.cn, tc.orgs, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NodeName(%q, %v) = %q, %v; want %q", tc.cn, tc.orgs, got, err, tc.want)
		}
	}
}
