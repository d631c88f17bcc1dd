// Command tether-gateway runs in the cloud: edge nodes behind NAT dial it
// over QUIC, and it relays cloud clients' TCP connections for those nodes
// through their tunnels, TLS untouched.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/tether-edge/tether/gateway"
	"github.com/tether-edge/tether/internal/cli"
	"github.com/tether-edge/tether/internal/config"
)

// docs/reference/flags.md's tether-gateway table and packaging/config/gateway.yaml are
// generated from registerFlags by TestGeneratedDocsUpToDate (docs_test.go),
// which fails when they differ from it.
//go:generate go test -count=1 -run TestGeneratedDocsUpToDate . -args -update

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg := gateway.DefaultConfig()
	fs := flag.NewFlagSet("tether-gateway", flag.ContinueOnError)
	registerFlags(fs, &cfg)
	return cli.Main(cli.Program{
		Name:        "tether-gateway",
		Intro:       intro,
		Flags:       fs,
		Config:      &cfg,
		LogLevel:    &cfg.LogLevel,
		LogFormat:   &cfg.LogFormat,
		MemoryLimit: &cfg.MemoryLimit,
		Run: func(ctx context.Context, log *slog.Logger) error {
			cfg.Logger = log
			return gateway.Run(ctx, cfg)
		},
	}, args)
}

func registerFlags(fs *flag.FlagSet, c *gateway.Config) {
	fs.String(config.FlagName, "", "read settings from this YAML `file` first (keys are these flag names; unknown keys are an error); flags on the command line override it. The packages pass /etc/tether/gateway.yaml")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig `file` used to watch Nodes (default: the in-cluster service account)")
	fs.Float64Var(&c.KubeAPIQPS, "kube-api-qps", c.KubeAPIQPS, "average `requests` per second of each of two budgets of the Kubernetes client (client-go's default is 5): one for delegated heartbeats, one for everything else (taints, VIPs, election records, update trigger), so at most twice this in all. Each offline node whose heartbeat its pool's leader delegates costs one request every 10 s (an update of its Lease from the gateway's informer), so 100 carries about 1,000 such nodes per replica; a renewal that would wait over a second for a token is answered unavailable at once. kube-apiserver's API Priority and Fairness still protects the server")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, "`requests` each budget of --kube-api-qps may send at once above its rate, as when a site goes offline and the renewals and taints of its nodes arrive together (client-go's default is 10)")
	fs.StringVar(&c.TunnelListen, "tunnel-listen", c.TunnelListen, "UDP `address` of the QUIC listener that edges dial")
	fs.IntVar(&c.ProxyPort, "proxy-port", c.ProxyPort, "TCP `port` of the transparent listener, on all addresses (IPv4 and IPv6), where DNAT sends connections for edge nodes. A client that dials this port directly is routed by TLS SNI or HTTP Host (a node name, bare or under a --dns-zone) to that node's port 10250")
	fs.StringVar(&c.ClientCA, "client-ca", c.ClientCA, "PEM `file` with the CA certificate(s) that sign the edges' node client certificates (CN=system:node:<name>, O=system:nodes), such as the cluster CA; read again when it changes; required")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM `file` with the gateway's serving certificate (and its chain), which edges verify with their --gateway-ca; read again when it changes. Without --tls-cert and --tls-key the gateway's own CA in --data-dir issues and renews it")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM `file` with the private key of --tls-cert; may be the same file; read again when it changes")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "`directory` of the self-managed CA (used without --tls-cert/--tls-key and --acme-domain), and of the ACME state with --acme-storage=dir (acme/): ca.crt, which edges need as their --gateway-ca (`tetherctl ca` prints it), ca.key, and the serving certificate it issues and renews. Give replicas the same CA by copying ca.crt and ca.key into each one's directory before its first start")
	fs.Var(config.NewStringList(&c.ServerNames), "server-name", "DNS `name`s and IP addresses (comma-separated or repeated) the self-managed serving certificate is issued for: what edges dial (their --gateway or --gateway-server-name); default the host name")
	fs.Var(config.NewStringList(&c.ACMEDomains), "acme-domain", "ACME mode: DNS `name`s (comma-separated or repeated) edges dial, for which an ACME CA (--acme-ca) issues the serving certificate and the gateway renews it; giving it accepts the CA's subscriber agreement. Validation is HTTP-01: the CA must reach --acme-http-listen as TCP port 80 of each name's address. Excludes --tls-cert/--tls-key")
	fs.StringVar(&c.ACMECA, "acme-ca", c.ACMECA, "ACME directory `URL` (with --acme-domain)")
	fs.StringVar(&c.ACMEEmail, "acme-email", c.ACMEEmail, "contact `address` of the ACME account, for the CA's expiry and policy notices (with --acme-domain)")
	fs.StringVar(&c.ACMECARoot, "acme-ca-root", c.ACMECARoot, "PEM `file` with the CA certificate(s) that verify the ACME server's own HTTPS, for a private ACME CA (default: the system roots)")
	fs.StringVar(&c.ACMEStorage, "acme-storage", c.ACMEStorage, "`where` the ACME account, certificates and locks live: dir (--data-dir/acme) or secret:<namespace>/<name>, a Kubernetes Secret that replicas share so that they use one account and one certificate (needs get, create and update on it: packaging/kubernetes/gateway-rbac.yaml)")
	fs.StringVar(&c.ACMEHTTPListen, "acme-http-listen", c.ACMEHTTPListen, "TCP `address` of the listener that answers ACME HTTP-01 challenges (with --acme-domain); the CA dials port 80 of the domain's address, so forward that here if it is another port")
	fs.StringVar(&c.DNSListen, "dns-listen", c.DNSListen, "UDP and TCP `address` of the DNS server that answers edge node names; empty disables it")
	fs.Var(config.NewStringList(&c.DNSZones), "dns-zone", "DNS `zone`s (comma-separated or repeated) under which node names are answered (edge-1.<zone>) and accepted in TLS SNI and HTTP Host")
	fs.StringVar(&c.AdminListen, "admin-listen", c.AdminListen, "listen `address` of the admin HTTP endpoints /metrics, /healthz, /readyz (listeners up and Nodes synced) and /status (JSON: replica, edges, RTT, streams, bytes); empty disables them")
	fs.BoolVar(&c.Profiling, "profiling", c.Profiling, "also serve the Go runtime's profiles (CPU, heap, goroutines, execution trace) under /debug/pprof/ on the admin address; whoever reaches that address can read them and load the process, so keep it off or the address private")
	fs.StringVar(&c.Mode, "mode", c.Mode, "address `mode`: node-ip (cloud clients use the edge nodes' own InternalIPs, which the VPC routes to the gateway) or vip (each edge node gets a virtual IP from --vip-cidr, for sites that reuse the same private ranges)")
	fs.StringVar(&c.VIPCIDR, "vip-cidr", c.VIPCIDR, "`prefix` the edge nodes' virtual IPs come from; required with --mode=vip")
	fs.Var(config.NewStringList(&c.EdgeCIDRs), "edge-cidrs", "`prefixes` (comma-separated or repeated) the edge sites' node addresses lie in; in node-ip mode an edge node's address outside them is never redirected to it (default: any address that is not a cloud node's or the gateway host's)")
	fs.StringVar(&c.NetRules, "netrules", c.NetRules, "packet filter `backend` for the DNAT rules: auto (the one the host already uses), nftables, iptables, or none (send the traffic to --proxy-port some other way)")
	fs.StringVar(&c.EdgeSelector, "edge-selector", c.EdgeSelector, "label `selector` that tells edge nodes from cloud nodes")
	fs.Var(&c.EdgePorts, "edge-ports", "edge `ports` (comma-separated) whose traffic to an edge node's address is redirected to --proxy-port; the edges' --allow-ports decide what they accept")
	fs.DurationVar(&c.ResyncPeriod.Duration, "resync-period", c.ResyncPeriod.Duration, "re-apply the DNAT rules this often even without a Node change, repairing rules someone else flushed (drift)")
	fs.BoolVar(&c.EnableUpdateTrigger, "enable-update-trigger", c.EnableUpdateTrigger, "stamp openyurt.io/update-trigger on the EndpointSlices and Endpoints a Service's openyurt.io/topologyKeys change or a node's pool change affects, so that YurtHub edges filter them again (needs list/watch of Services and EndpointSlices/Endpoints, patch of them)")
	fs.BoolVar(&c.DelegatedHeartbeatTaint, "delegated-heartbeat-taint", c.DelegatedHeartbeatTaint, "taint node.openyurt.io/unschedulable=true:NoSchedule the nodes whose Lease renewals reach the cloud only through their pool's leader (openyurt.io/delegate-heartbeat), and clear the taint once they renew it themselves (needs patch of Nodes, list/watch of Leases in kube-node-lease)")
	fs.IntVar(&c.DelegatedHeartbeatTaintRenewals, "delegated-heartbeat-taint-renewals", c.DelegatedHeartbeatTaintRenewals, "taint a node after this many `n` delegated Lease renewals in a row (with --delegated-heartbeat-taint)")
	fs.BoolVar(&c.CleanupOnExit, "cleanup-on-exit", c.CleanupOnExit, "remove the DNAT rules and the VIP interface tether0 on exit (what Tether created, nothing else)")
	fs.DurationVar(&c.DNSTTL.Duration, "dns-ttl", c.DNSTTL.Duration, "TTL of DNS answers, positive and negative")
	fs.BoolVar(&c.DNSCloudNodes, "dns-cloud-nodes", c.DNSCloudNodes, "also answer the names of cloud (non-edge) nodes, with their own InternalIPs")
	fs.StringVar(&c.HostsConfigMap, "hosts-configmap", c.HostsConfigMap, "also keep `namespace/name`, a ConfigMap with \"<ip>\\t<node>\" lines (key tunnel-nodes), for CoreDNS's hosts plugin as OpenYurt's yurt-tunnel-dns uses it; needs RBAC to get, create and update that ConfigMap")
	fs.IntVar(&c.MaxStreamsPerEdge, "max-streams-per-edge", c.MaxStreamsPerEdge, "at most `n` connections relayed at once per edge; more wait a second, then are refused as overloaded. Keep it at most the edges' --max-streams")
	fs.IntVar(&c.MaxHandshakes, "max-handshakes", c.MaxHandshakes, "work on at most `n` tunnel handshakes at once; more wait, the newest first, and one that waited 3s is refused (its edge dials again in 2 to 4 s, 4 to 8 s after further refusals), so that thousands of edges dialling together, as in a cold start or restart, do not share the CPU so thinly that none finishes in time (README, Sizing). Waiting: tether_gateway_tunnel_handshakes_waiting. 0: no bound")
	fs.StringVar(&c.MemoryLimit, "memory-limit", c.MemoryLimit, "soft `limit` of the Go runtime's own memory (heap and stacks), a quantity such as 1Gi; near it the garbage collector runs more often (never taking more than about half the CPU) instead of letting the heap grow to twice what is live; it is never a reason to fail. Leave room above the working set (README, Sizing: give the gateway at least 150 KiB per edge; a limit near what it uses makes the collector run without pause); auto: 90 % of the memory limit of the process's cgroup (a container's resources.limits.memory, a unit's MemoryMax=), none without one; empty or 0: none; GOMEMLIMIT in the environment wins")
	fs.Var(config.Quantity{Q: &c.MaxReceiveMemory}, "max-receive-memory", "bound the memory that data edges sent and cloud clients have not read yet may take: each tunnel's QUIC receive window starts at 768KiB and grows with fast transfers up to 8MiB, and together they may grow by at most this `size` (such as 256Mi or 2Gi); a tunnel that finds it spent keeps its window, its transfers go on, slower on long paths. Worst case: tunnels x 768KiB + this (tunnel/README.md). 0: no bound (tunnels x 8MiB)")
	fs.Var(config.Quantity{Q: &c.UDPBuffer}, "udp-buffer", "`size` of the tunnel listener's UDP receive and send buffers (such as 32Mi), where datagrams wait while the gateway is busy, as in a cold start or restart of thousands of edges; set with SO_RCVBUFFORCE when the gateway has CAP_NET_ADMIN, else capped by the kernel at net.core.rmem_max and wmem_max (the gateway warns when it got less; README, Sizing). Drops: tether_gateway_tunnel_udp_drops_total. 0: quic-go's 7Mi")
	fs.DurationVar(&c.IdleTimeout.Duration, "idle-timeout", c.IdleTimeout.Duration, "close a tunnel silent for this `duration` (a tunnel's is the lower of this and the edge's, 15 s); edges send a keepalive every half of it and the gateway answers, so only a dead path is silent that long")
	fs.DurationVar(&c.StreamIdleTimeout.Duration, "stream-idle-timeout", c.StreamIdleTimeout.Duration, "close a relayed connection that moved no byte either way for this `duration` (the kubelet's own streaming limit is 4h); 0 disables it")
	fs.DurationVar(&c.ShutdownGrace.Duration, "shutdown-grace", c.ShutdownGrace.Duration, "on SIGTERM or SIGINT, let relayed connections finish for up to this `duration` before the tunnels are closed (edges then use the other replicas)")
	fs.StringVar(&c.Replica, "replica", c.Replica, "`name` of this replica on /status (default: the host name)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log `level`: debug, info, warn or error (debug also logs every routed or refused connection)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log `format`: text or json")
}

const intro = `
tether-gateway runs in the cloud. Edge nodes behind NAT dial it over QUIC
(mutual TLS; an edge is known by the node name in its client certificate).
It watches the cluster's Nodes, and relays each TCP connection that cloud
clients (kube-apiserver, metrics-server, Prometheus) open to an edge node's
address over its own stream in that node's tunnel. TLS stays end to end.

`
