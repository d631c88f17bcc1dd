// Command tether-edge runs on every edge node: it keeps the QUIC tunnel to
// the tether-gateway replicas, through which cloud clients reach this
// node's own ports (kubelet :10250 and others on the allow list), and it
// is the kube-apiserver of the node's components, caching what they read
// so that they keep working while the cloud is unreachable.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/tether-edge/tether/edgeproxy"
	"github.com/tether-edge/tether/internal/cli"
	"github.com/tether-edge/tether/internal/config"
)

// docs/reference/flags.md's tether-edge table and packaging/config/edge.yaml are
// generated from registerFlags by TestGeneratedDocsUpToDate (docs_test.go),
// which fails when they differ from it.
//go:generate go test -count=1 -run TestGeneratedDocsUpToDate . -args -update

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg := edgeproxy.DefaultConfig()
	fs := flag.NewFlagSet("tether-edge", flag.ContinueOnError)
	registerFlags(fs, &cfg)
	return cli.Main(cli.Program{
		Name:   "tether-edge",
		Intro:  intro,
		Flags:  fs,
		Config: &cfg,
		Run: func(ctx context.Context, log *slog.Logger) error {
			cfg.Logger = log
			return edgeproxy.Run(ctx, cfg)
		},
	}, args)
}

func registerFlags(fs *flag.FlagSet, cfg *edgeproxy.Config) {
	fs.String(config.FlagName, "", "read settings from this YAML `file` first (keys are these flag names; unknown keys are an error); flags on the command line override it. The packages pass /etc/tether/edge.yaml")
	fs.Var(config.NewStringList(&cfg.Gateway), "gateway", "the tether-gateway replicas, `host:port,...`: addresses and/or DNS names (port 10262 when none is given). A name is resolved every 30 s to all its addresses, and the edge keeps one QUIC connection to each. Without --gateway only the apiserver proxy runs, and the node pool only follows: its election record is written by the gateway")
	fs.StringVar(&cfg.GatewayCA, "gateway-ca", cfg.GatewayCA, "PEM `file` with the CA certificate(s) that verify the gateways' certificates (default: the system's roots); read again when it changes, for new connections")
	fs.StringVar(&cfg.GatewayServerName, "gateway-server-name", cfg.GatewayServerName, "`name` the gateways' certificates must hold (default: the host part of each --gateway entry)")
	fs.StringVar(&cfg.Cert, "cert", cfg.Cert, "PEM `file` with this node's client certificate (CN=system:node:<name>, O=system:nodes), such as the kubelet's /var/lib/kubelet/pki/kubelet-client-current.pem; read again when it changes, for new connections")
	fs.StringVar(&cfg.Key, "key", cfg.Key, "PEM `file` with the private key of --cert; may be the same file as --cert")
	fs.StringVar(&cfg.BootstrapKubeconfig, "bootstrap-kubeconfig", cfg.BootstrapKubeconfig, "kubeconfig `file` with bootstrap credentials (a short-lived bootstrap token): instead of --cert/--key, tether-edge generates its own key and obtains the node's client certificate through the CSR API (CN=system:node:<--node-name>, O=system:nodes, signer kubernetes.io/kube-apiserver-client-kubelet, which kube-controller-manager approves and signs as for a kubelet), keeps it in <--data-dir>/pki/tether-edge-client-current.pem and renews it, with the current certificate, at 70-90% of its life. A valid certificate already there is used without a new request. Needs --node-name; enables the apiserver proxy, toward this kubeconfig's server unless --server-addr is given. Excludes --cert, --key and --kubeconfig")
	fs.Var(&cfg.AllowPorts, "allow-ports", "the only `ports` (comma-separated) of this node, on its own addresses and loopback, that cloud clients may reach through the tunnel")
	fs.StringVar(&cfg.AllowPodPorts, "allow-pod-ports", cfg.AllowPodPorts, "the `ports` of this node's pods that cloud clients may reach through the tunnel, for a pod without the tether.io/tunnel-ports annotation (which, as \"none\" or a comma-separated list of port numbers and names of the pod's declared ports, replaces this for its pod): declared (the TCP ports the pod declares in its containers' and init containers' ports), none, or a comma-separated list of port numbers. declared is the default because those are the ports Prometheus's kubernetes_sd pod role scrapes and webhook and aggregated API Services name as targetPort; a pod listening on another port needs the annotation. Only addresses inside this node's own pod ranges (its Node's spec.podCIDRs) held by a running pod of this node qualify, never the node's own addresses (such as cni0's), and only with the apiserver proxy, through which the node's Node and pods are read")
	fs.IntVar(&cfg.MaxStreams, "max-streams", cfg.MaxStreams, "at most `n` connections relayed at once; more are refused as overloaded")
	fs.BoolVar(&cfg.EdgeServices, "edge-services", cfg.EdgeServices, "let this node's pods reach the cloud Services an operator marked with the tether.io/edge-access annotation, by ClusterIP or DNS name, through the tunnel. This node's nftables rules (table inet tether-edge, before kube-proxy's) send their connections to marked ClusterIPs and ports to --service-listen, which asks a gateway (run with --edge-services) to connect them to an endpoint of that Service. Needs --gateway, the apiserver proxy (the Services and this node's pod ranges are read through it) and CAP_NET_ADMIN; unmarked Services stay kube-proxy's")
	fs.StringVar(&cfg.ServiceListen, "service-listen", cfg.ServiceListen, "listen `address` (:port, every address) of the service listener with --edge-services; it admits only this node's pods (its pod ranges), loopback and the node's own addresses, and resets any other client")
	fs.IntVar(&cfg.MaxServiceStreams, "max-service-streams", cfg.MaxServiceStreams, "with --edge-services, at most `n` connections of this node's pods to cloud Services open toward one gateway replica; more go to another replica, or are reset. Keep it at most the gateways' --max-service-streams-per-edge, so that heartbeats and elections keep their own streams")
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "`name` of this node (default: the one in the client certificate; required with --bootstrap-kubeconfig); the gateway always knows the edge by its certificate; the apiserver proxy renews this node's Lease while the cloud is unreachable")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", cfg.Kubeconfig, "kubeconfig `file` the apiserver proxy reaches the cloud kube-apiserver with (such as the kubelet's own, with the node's client certificate); enables the proxy")
	fs.Var(config.NewStringList(&cfg.ServerAddr), "server-addr", "the cloud kube-apiservers, `https://host:port,...`, in priority order (the first healthy one serves), reached with --cert/--key and verified with --server-ca; enables the apiserver proxy. With --kubeconfig it replaces the kubeconfig's server")
	fs.StringVar(&cfg.ServerCA, "server-ca", cfg.ServerCA, "PEM `file` with the CA certificate(s) that verify the cloud kube-apiservers (default: the kubeconfig's certificate-authority, else the system's roots)")
	fs.StringVar(&cfg.APIServerListen, "apiserver-listen", cfg.APIServerListen, "listen `address` of the kube-apiserver proxy: plain HTTP for kubelet, kube-proxy and coredns on this node, which all act as the node through it (keep it on loopback)")
	fs.StringVar(&cfg.PodAPIListen, "pod-api-listen", cfg.PodAPIListen, "listen `address` of the pod API listener (TLS; :10268, YurtHub's port for the same job), through which this node's pods that use in-cluster config reach kube-apiserver with their own service-account tokens, never as the node; the kubelet is shown the Service default/kubernetes at --pod-api-address and this port, so that pods started after it is set dial it. A token the kubelet obtained through tether-edge is served, while the cloud is unreachable, the gets and lists it made online (pod-api-cache.db in --data-dir); other tokens are relayed online only. Needs --pod-api-cert and --pod-api-key. Empty disables it")
	fs.StringVar(&cfg.PodAPICert, "pod-api-cert", cfg.PodAPICert, "PEM `file` with the pod API listener's serving certificate: for the node's addresses the pods dial, signed by a CA the pods' ca.crt (the kube-root-ca.crt ConfigMap) trusts, provided by the operator (requesting it through the CSR API, kubelet-serving signer, with a gateway approver, is future work); read again when it changes, for new connections")
	fs.StringVar(&cfg.PodAPIKey, "pod-api-key", cfg.PodAPIKey, "PEM `file` with the private key of --pod-api-cert")
	fs.Var(config.NewStringList(&cfg.PodAPIAddress), "pod-api-address", "the node's `addresses` (comma-separated, one per IP family) the kubelet is shown as the cluster IPs of default/kubernetes, which pods dial (default: the first IPv4 and IPv6 address of --pod-api-cert)")
	fs.Var(config.NewStringList(&cfg.CacheComponents), "cache-components", "the node `components` (comma-separated; the first word of their User-Agent, such as kubelet) whose get, list and watch responses are cached and served while the cloud is unreachable")
	fs.Var(config.NewStringList(&cfg.TopologyComponents), "topology-components", "the node `components` (comma-separated, first word of the User-Agent) whose EndpointSlices and Endpoints keep only the endpoints their Service's openyurt.io/topologyKeys allows for this node (same node or node pool); empty disables the filter")
	fs.DurationVar(&cfg.HealthCheckInterval.Duration, "health-check-interval", cfg.HealthCheckInterval.Duration, "probe each cloud kube-apiserver's /readyz every `duration` (probes overlap when one is slower)")
	fs.DurationVar(&cfg.HealthCheckTimeout.Duration, "health-check-timeout", cfg.HealthCheckTimeout.Duration, "a probe that has no answer after this `duration` fails; a slower answer within it passes")
	fs.IntVar(&cfg.UnhealthyThreshold, "unhealthy-threshold", cfg.UnhealthyThreshold, "an apiserver is unhealthy after `n` failed probes in a row (then node components are served from the cache)")
	fs.IntVar(&cfg.HealthyThreshold, "healthy-threshold", cfg.HealthyThreshold, "an unhealthy apiserver is healthy again after `n` good probes in a row")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "listen `address` of the admin HTTP endpoints /metrics, /healthz, /readyz (a gateway connected; an apiserver healthy, or the cache able to serve) and /status (JSON); empty disables them")
	fs.BoolVar(&cfg.Profiling, "profiling", cfg.Profiling, "also serve the Go runtime's profiles (CPU, heap, goroutines, execution trace) under /debug/pprof/ on the admin address; whoever reaches that address can read them and load the process, so keep it off or the address private")
	fs.StringVar(&cfg.Pool, "pool", cfg.Pool, "`name` of this node's pool (default: its apps.openyurt.io/nodepool label; peers judge membership by the label)")
	fs.StringVar(&cfg.PoolListen, "pool-listen", cfg.PoolListen, "listen `address` of the pool listener on the node LAN (HTTP/2, mutual TLS with node certificates; only nodes of the same pool are served); empty disables the pool")
	fs.StringVar(&cfg.PoolCA, "pool-ca", cfg.PoolCA, "PEM `file` with the CA certificate(s) of the nodes' client certificates, which the pool's peers present to each other (default: the apiserver CA); read again when it changes")
	fs.Var(config.NewStringList(&cfg.PoolResources), "pool-resources", "the pool-scope `resources` (comma-separated resource.group/version, resource/version for the core group) that the pool leader watches in the cloud and the members serve from their replica")
	fs.DurationVar(&cfg.PoolLeaseDuration.Duration, "pool-lease-duration", cfg.PoolLeaseDuration.Duration, "pool election: a leader that has not renewed for this `duration` is replaced")
	fs.DurationVar(&cfg.PoolRenewDeadline.Duration, "pool-renew-deadline", cfg.PoolRenewDeadline.Duration, "pool election: a leader that cannot renew within this `duration` steps down")
	fs.DurationVar(&cfg.PoolRetryPeriod.Duration, "pool-retry-period", cfg.PoolRetryPeriod.Duration, "pool election: candidates and the leader try every `duration`")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "state `directory`: the apiserver proxy's cache and queued status writes live in apiserver-cache.db there, the node pool's replica beside it, and with --bootstrap-kubeconfig the node's client certificate and key in pki/ (mode 0700)")
	fs.StringVar(&cfg.CacheMaxSize, "cache-max-size", cfg.CacheMaxSize, "bound of the apiserver proxy's cache file (the bytes of its pages that hold data), a `quantity` such as 256Mi or 1Gi, at least 64Mi; 0 removes it. Past it whole resources (all of one component's objects of one resource) are evicted, least recently updated first, and served again once the component lists them anew; queued status writes are never evicted. The file is compacted when half of it is free or it is over the bound (metrics tether_edge_apiserver_cache_*)")
	fs.DurationVar(&cfg.CertCheckInterval.Duration, "cert-check-interval", cfg.CertCheckInterval.Duration, "check --cert and --key for a rotation every `duration` (kubelet rewrites its client certificate in place); on a new certificate, apiserver requests move to new connections and each gateway tunnel to a new connection, while the old ones end with the streams they relay")
	fs.StringVar(&cfg.MemoryLimit, "memory-limit", cfg.MemoryLimit, "soft `limit` of the Go runtime's own memory (heap and stacks, not the mapped binary or cache file), a quantity such as 64Mi or 100M; near it the garbage collector runs more often (never taking more than about half the CPU) instead of letting the heap grow to twice what is live; it is never a reason to fail. 0 removes it; GOMEMLIMIT in the environment wins")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log `level`: debug, info, warn or error (debug also logs every refused stream)")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "log `format`: text or json")
}

const intro = `
tether-edge runs on an edge node behind NAT. It dials out to every
tether-gateway replica over QUIC (mutual TLS with this node's client
certificate) and serves the connections the gateways open for cloud clients
(kube-apiserver, metrics-server, Prometheus) by dialling this node's own
ports, if --allow-ports allows them, and its own pods on the ports
--allow-pod-ports or the pod's tether.io/tunnel-ports annotation allows.
TLS stays end to end. With --edge-services, this node's pods also reach the
cloud Services marked tether.io/edge-access, through the same tunnel.

With --kubeconfig, --server-addr or --bootstrap-kubeconfig it is also the
kube-apiserver of the node's components (point kubelet, kube-proxy and coredns at
http://127.0.0.1:10261): it relays them to the cloud with the node's
credentials and caches what they read, and while the cloud is unreachable
it answers reads from the cache, keeps watches open, renews the node's
Lease locally and queues pod and node status writes until the cloud is back.

In a node pool (the apps.openyurt.io/nodepool label), one elected node
watches the pool-scope resources (EndpointSlices, Endpoints, Services) in
the cloud and the others replicate them over the pool listener (:10269),
so the thin uplink carries them once; a node that lost the cloud has its
Lease renewed through the leader and the gateway.

`
