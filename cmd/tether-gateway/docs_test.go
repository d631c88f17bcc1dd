package main

import (
	"flag"
	"testing"

	"github.com/tether-edge/tether/gateway"
	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/internal/docgen"
)

var update = flag.Bool("update", false, "write the generated documentation (docs/reference/flags.md's table, packaging/config/gateway.yaml) instead of checking it")

// program is what docs/reference/flags.md's "tether-gateway flags" table and
// packaging/config/gateway.yaml are generated from: the flags, their help
// and the defaults, as --help shows them.
func program() (docgen.Program, []docgen.Flag, error) {
	cfg := gateway.DefaultConfig()
	fs := flagSet(&cfg)
	flags, err := docgen.Flags(fs, cfg)
	return docgen.Program{
		Name:       "tether-gateway",
		Flags:      fs,
		Config:     cfg,
		README:     "../../docs/reference/flags.md",
		ConfigFile: "../../packaging/config/gateway.yaml",
		ConfigHeader: `
# tether-gateway settings: /etc/tether/gateway.yaml. Keys are tether-gateway's
# flag names (` + "`tether-gateway --help`" + ` explains each, as below); a flag on the
# command line overrides the key. An unknown key is an error, never ignored.
# This file is generated from the flags (make generate): edit the flags'
# help in gateway/config.go, not this file.
#
# Every key is commented out and shows an example or its default. Set at
# least kubeconfig and client-ca (and tls-cert and tls-key, or server-name,
# or acme-domain), then start the service:
#   systemctl enable --now tether-gateway
# Check it: ` + "`journalctl -u tether-gateway`, `tetherctl status`" + `.`,
		Sections: []docgen.Section{
			{Heading: "Cluster", Keys: []string{"kubeconfig", "kube-api-qps", "kube-api-burst", "client-ca"}},
			{Heading: "Serving certificate: files, the gateway's own CA, or ACME", Keys: []string{"tls-cert", "tls-key", "data-dir", "server-name",
				"acme-domain", "acme-ca", "acme-email", "acme-ca-root", "acme-storage", "acme-http-listen"}},
			{Heading: "Tunnels and routing", Keys: []string{"tunnel-listen", "proxy-port", "allowed-sources", "edge-ports", "edge-selector", "mode", "vip-cidr", "edge-cidrs", "max-addresses-per-node",
				"edge-pod-cidrs", "widest-pod-cidr", "edge-services", "edge-service-cidrs",
				"netrules", "resync-period", "cleanup-on-exit"}},
			{Heading: "DNS", Keys: []string{"dns-listen", "dns-zone", "dns-ttl", "dns-cloud-nodes", "hosts-configmap"}},
			{Heading: "Node pools and service topology", Keys: []string{"delegated-heartbeat-taint", "delegated-heartbeat-taint-renewals", "node-autonomy", "pool-lease-duration", "pool-feed", "pool-resources", "enable-update-trigger"}},
			{Heading: "Limits", Keys: []string{"max-streams-per-edge", "max-service-streams-per-edge", "service-streams-per-second", "max-handshakes", "max-receive-memory", "udp-buffer", "memory-limit", "idle-timeout", "stream-idle-timeout", "shutdown-grace"}},
			{Heading: "Process", Keys: []string{"admin-listen", "profiling", "replica", "log-level", "log-format"}},
		},
		Rest: "Other settings",
		Examples: map[string]string{
			"kubeconfig":         "/etc/tether/gateway.kubeconfig",
			"client-ca":          "/etc/tether/cluster-ca.crt",
			"tls-cert":           "/etc/tether/gateway.crt",
			"tls-key":            "/etc/tether/gateway.key",
			"server-name":        "[gateway.example.com, 203.0.113.10]",
			"acme-domain":        "[gateway.example.com]",
			"acme-email":         "ops@example.com",
			"acme-ca-root":       "/etc/tether/acme-ca-root.crt",
			"dns-zone":           "[edge.example.internal]",
			"vip-cidr":           "100.64.0.0/16",
			"edge-cidrs":         "[192.168.0.0/16, 10.100.0.0/16]",
			"edge-pod-cidrs":     "[10.244.128.0/17]",
			"edge-service-cidrs": "[172.20.0.0/16]",
			"hosts-configmap":    "kube-system/tether-nodes",
			"memory-limit":       "900Mi",
			"replica":            "gw-1",
		},
		Notes: map[string]string{
			"kubeconfig": `On a gateway host: the user "tether-gateway", which packaging/kubernetes/gateway-rbac.yaml binds; the in-cluster service account exists only in a pod.`,
			"dns-listen": `On a host where systemd-resolved holds port 53, give the VPC address, such as "10.0.0.5:53".`,
		},
	}, flags, err
}

// TestGeneratedDocsUpToDate fails when docs/reference/flags.md's
// tether-gateway flag table or packaging/config/gateway.yaml differs from what the flags say
// (run `make generate`); with -update it writes them. The config file must
// load as it is and with every key uncommented.
func TestGeneratedDocsUpToDate(t *testing.T) {
	p, flags, err := program()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Generate(*update); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckConfigLoads(flags, t.TempDir(), func(path string) error {
		cfg := gateway.DefaultConfig()
		return config.LoadFile(path, &cfg)
	}); err != nil {
		t.Error(err)
	}
}
