package testenv

import (
	"slices"
	"testing"
)

// kubeProxyTable is a part of `nft list table ip kube-proxy` as kube-proxy
// 1.36 writes it: a Service without session affinity (its endpoints in
// its dnat map), one with affinity (a goto per endpoint chain), one
// without endpoints and one with an unnamed port.
const kubeProxyTable = `table ip kube-proxy {
	chain service-AOLSO2O4-tour/web/tcp/ {
		meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.10 . 8080, 1 : 10.244.2.10 . 8080 }
	}

	chain service-HVFWP5L3-ns5/svc5/tcp/p80 {
		ip daddr 172.30.0.45 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
		ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
		numgen random mod 2 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80, 1 : goto endpoint-XYZ12345-ns5/svc5/tcp/p80__10.180.0.4/80 }
	}

	chain endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 {
		meta l4proto tcp dnat to 10.180.0.3:80
	}

	chain service-2QRHZV4L-default/empty/tcp/https {
	}
}
`

func TestServiceEndpoints(t *testing.T) {
	for _, tc := range []struct {
		ns, name string
		want     []string
	}{
		{"tour", "web", []string{"10.244.1.10", "10.244.2.10"}},
		{"ns5", "svc5", []string{"10.180.0.3", "10.180.0.4"}},
		{"default", "empty", []string{}},
		{"default", "absent", nil},
	} {
		got := serviceEndpoints(kubeProxyTable, tc.ns, tc.name)
		if !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%s/%s: %q, want %q", tc.ns, tc.name, got, tc.want)
		}
	}
}
