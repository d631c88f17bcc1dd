package main

import (
	"flag"
	"testing"

	"github.com/tether-edge/tether/edgeproxy"
	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/internal/docgen"
)

var update = flag.Bool("update", false, "write the generated documentation (docs/reference/flags.md's table, packaging/config/edge.yaml) instead of checking it")

// program is what docs/reference/flags.md's "tether-edge flags" table and
// packaging/config/edge.yaml are generated from: the flags, their help and
// the defaults, as --help shows them.
func program() (docgen.Program, []docgen.Flag, error) {
	cfg := edgeproxy.DefaultConfig()
	fs := flag.NewFlagSet("tether-edge", flag.ContinueOnError)
	registerFlags(fs, &cfg)
	flags, err := docgen.Flags(fs, cfg)
	return docgen.Program{
		Name:       "tether-edge",
		Flags:      fs,
		Config:     cfg,
		README:     "../../docs/reference/flags.md",
		ConfigFile: "../../packaging/config/edge.yaml",
		ConfigHeader: `
# tether-edge settings: /etc/tether/edge.yaml. Keys are tether-edge's flag
# names (` + "`tether-edge --help`" + ` explains each, as below); a flag on the command
# line overrides the key. An unknown key is an error, never ignored.
# This file is generated from the flags (make generate): edit the flags'
# help in cmd/tether-edge, not this file.
#
# Every key is commented out and shows an example or its default. Set the
# tunnel (gateway, cert, key) and/or the kube-apiserver proxy (kubeconfig,
# or server-addr with cert and key), then start the service:
#   systemctl enable --now tether-edge
# Check it: ` + "`journalctl -u tether-edge`, `curl 127.0.0.1:10267/status`" + `.`,
		Sections: []docgen.Section{
			{Heading: "Tunnel to the gateways", Keys: []string{"gateway", "gateway-ca", "gateway-server-name", "cert", "key", "bootstrap-kubeconfig",
				"node-name", "allow-ports", "allow-pod-ports", "max-streams", "edge-services", "service-listen", "max-service-streams"}},
			{Heading: "kube-apiserver proxy (kubelet, kube-proxy, coredns use it as their apiserver)", Keys: []string{"kubeconfig", "server-addr", "server-ca",
				"apiserver-listen", "cache-components", "topology-components", "health-check-interval", "health-check-timeout",
				"unhealthy-threshold", "healthy-threshold"}},
			{Heading: "Node pool (nodes labelled apps.openyurt.io/nodepool=<pool>)", Keys: []string{"pool", "pool-listen", "pool-ca", "pool-resources",
				"pool-lease-duration", "pool-renew-deadline", "pool-retry-period"}},
			{Heading: "Pods' API access (pods of this node reach kube-apiserver with their own tokens)", Keys: []string{"pod-api-listen",
				"pod-api-cert", "pod-api-key", "pod-api-address"}},
			{Heading: "Process", Keys: []string{"admin-listen", "profiling", "data-dir", "cache-max-size", "cert-check-interval", "memory-limit",
				"log-level", "log-format"}},
		},
		Rest: "Other settings",
		Examples: map[string]string{
			"gateway":              "[gateway.example.com:10262]",
			"gateway-ca":           "/etc/tether/gateway-ca.crt",
			"gateway-server-name":  "gateway.example.com",
			"cert":                 "/var/lib/kubelet/pki/kubelet-client-current.pem",
			"key":                  "/var/lib/kubelet/pki/kubelet-client-current.pem",
			"bootstrap-kubeconfig": "/etc/tether/bootstrap-kubeconfig",
			"node-name":            "edge-1",
			"kubeconfig":           "/etc/kubernetes/kubelet.conf",
			"server-addr":          "[https://10.0.0.10:6443, https://10.0.0.11:6443]",
			"server-ca":            "/etc/kubernetes/pki/ca.crt",
			"pool":                 "shop-17",
			"pool-ca":              "/etc/kubernetes/pki/ca.crt",
			"pod-api-listen":       ":10268",
			"pod-api-cert":         "/etc/tether/pod-api.crt",
			"pod-api-key":          "/etc/tether/pod-api.key",
			"pod-api-address":      "[192.168.1.20]",
		},
		Notes: map[string]string{
			"data-dir":             "The unit makes it tether-edge's only writable path.",
			"bootstrap-kubeconfig": "Make the token short-lived: it may request a certificate for any node name.",
		},
	}, flags, err
}

// TestGeneratedDocsUpToDate fails when docs/reference/flags.md's
// tether-edge flag table or packaging/config/edge.yaml differs from what the flags say (run `make
// generate`); with -update it writes them. The config file must load as it
// is and with every key uncommented.
func TestGeneratedDocsUpToDate(t *testing.T) {
	p, flags, err := program()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Generate(*update); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckConfigLoads(flags, t.TempDir(), func(path string) error {
		cfg := edgeproxy.DefaultConfig()
		return config.LoadFile(path, &cfg)
	}); err != nil {
		t.Error(err)
	}
}
