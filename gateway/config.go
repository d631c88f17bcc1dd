package gateway

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tether-edge/tether/gateway/dns"
	"github.com/tether-edge/tether/gateway/edgeservices"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/gateway/pooltaint"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/gateway/selfca"
	"github.com/tether-edge/tether/gateway/sources"
	"github.com/tether-edge/tether/internal/cli"
	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/netrules"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// Config is tether-gateway's configuration. The JSON names are the flag
// names and the keys of the YAML file (/etc/tether/gateway.yaml);
// durations are written as Go durations ("15s"). RegisterFlags binds the
// flags and Validate checks the settings, part by part (below); the
// fields' order is the order of README.md's flag table.
type Config struct {
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// KubeAPIQPS and KubeAPIBurst are the Kubernetes client's rate limit
	// (client-go's token bucket): its average requests per second and the
	// requests it may send at once above that. The delegated heartbeats'
	// writes have a bucket of their own of the same size (see
	// DefaultKubeAPIQPS).
	KubeAPIQPS   float64  `json:"kube-api-qps"`
	KubeAPIBurst int      `json:"kube-api-burst"`
	TunnelListen string   `json:"tunnel-listen"`
	ProxyPort    int      `json:"proxy-port"`
	ClientCA     string   `json:"client-ca"`
	TLSCert      string   `json:"tls-cert"`
	TLSKey       string   `json:"tls-key"`
	DataDir      string   `json:"data-dir"`              // without TLSCert/TLSKey: the self-managed CA's directory (gateway/selfca), or the ACME storage
	ServerNames  []string `json:"server-name,omitempty"` // without TLSCert/TLSKey: the self-managed serving certificate's names
	// ACME mode (gateway/acme): the serving certificate comes from an
	// ACME CA for ACMEDomains.
	ACMEDomains    []string `json:"acme-domain,omitempty"`
	ACMECA         string   `json:"acme-ca"`
	ACMEEmail      string   `json:"acme-email,omitempty"`
	ACMECARoot     string   `json:"acme-ca-root,omitempty"`
	ACMEStorage    string   `json:"acme-storage"`
	ACMEHTTPListen string   `json:"acme-http-listen"`
	// ACMERenewCheckInterval and ACMERenewalWindowRatio tune renewal (0:
	// certmagic's defaults); for tests with short-lived certificates.
	ACMERenewCheckInterval time.Duration `json:"-"`
	ACMERenewalWindowRatio float64       `json:"-"`

	DNSListen   string   `json:"dns-listen"`
	DNSZones    []string `json:"dns-zone,omitempty"`
	AdminListen string   `json:"admin-listen"`
	Profiling   bool     `json:"profiling,omitempty"`
	Mode        string   `json:"mode"`
	VIPCIDR     string   `json:"vip-cidr,omitempty"`
	// EdgeCIDRs, when set, are the only ranges an edge node's address is
	// routed from in node-ip mode (see nodewatch.Policy).
	EdgeCIDRs []string `json:"edge-cidrs,omitempty"`
	// EdgePodCIDRs are the ranges edge nodes' pod ranges may lie in;
	// empty routes no pod (see nodewatch.PodPolicy). WidestPodCIDR is
	// the shortest prefix length accepted, IPv4 then IPv6.
	EdgePodCIDRs  []string `json:"edge-pod-cidrs,omitempty"`
	WidestPodCIDR string   `json:"widest-pod-cidr"`
	// EdgeServices connects edge pods to the cloud Services marked
	// tether.io/edge-access (gateway/edgeservices); EdgeServiceCIDRs are
	// where an endpoint that names no node may lie.
	EdgeServices     bool     `json:"edge-services"`
	EdgeServiceCIDRs []string `json:"edge-service-cidrs,omitempty"`
	NetRules         string   `json:"netrules"`
	EdgeSelector     string   `json:"edge-selector"`
	// MaxNodeAddresses bounds the addresses routed to one edge node
	// (nodewatch.Policy.MaxPerNode).
	MaxNodeAddresses int `json:"max-addresses-per-node"`

	// AllowedSources are the client ranges the transparent listener and
	// the admin endpoints accept (gateway/sources).
	AllowedSources []string `json:"allowed-sources"`

	EdgePorts      config.Ports    `json:"edge-ports"`
	ResyncPeriod   metav1.Duration `json:"resync-period"`
	CleanupOnExit  bool            `json:"cleanup-on-exit"`
	DNSTTL         metav1.Duration `json:"dns-ttl"`
	DNSCloudNodes  bool            `json:"dns-cloud-nodes"`
	HostsConfigMap string          `json:"hosts-configmap,omitempty"`
	// EnableUpdateTrigger runs the update-trigger controller
	// (gateway/topology) for edges that still run YurtHub.
	EnableUpdateTrigger bool `json:"enable-update-trigger"`
	// DelegatedHeartbeatTaint runs the delegated-heartbeat taint controller
	// (gateway/pooltaint); DelegatedHeartbeatTaintRenewals is its threshold.
	DelegatedHeartbeatTaint         bool `json:"delegated-heartbeat-taint"`
	DelegatedHeartbeatTaintRenewals int  `json:"delegated-heartbeat-taint-renewals"`
	// NodeAutonomy runs the autonomy controller (gateway/autonomy).
	NodeAutonomy bool `json:"node-autonomy"`
	// PoolLeaseDuration bounds the lease of the pools' election records
	// (gateway/poolcheck, gateway/election); it must equal the edges'.
	PoolLeaseDuration metav1.Duration `json:"pool-lease-duration"`
	// PoolFeed serves the pools' signed feed of PoolResources to their
	// leaders (gateway/poolfeed).
	PoolFeed      bool     `json:"pool-feed"`
	PoolResources []string `json:"pool-resources,omitempty"`

	MaxStreamsPerEdge int `json:"max-streams-per-edge"`
	// MaxServiceStreamsPerEdge and ServiceStreamsPerSecond bound one
	// edge's pods' connections to cloud Services.
	MaxServiceStreamsPerEdge int     `json:"max-service-streams-per-edge"`
	ServiceStreamsPerSecond  float64 `json:"service-streams-per-second"`
	// MaxHandshakes bounds the tunnel handshakes in progress at once
	// (tunnelserver.Options.MaxHandshakes); 0: no bound.
	MaxHandshakes     int             `json:"max-handshakes"`
	IdleTimeout       metav1.Duration `json:"idle-timeout"`
	StreamIdleTimeout metav1.Duration `json:"stream-idle-timeout"`
	ShutdownGrace     metav1.Duration `json:"shutdown-grace"`
	Replica           string          `json:"replica,omitempty"`
	LogLevel          string          `json:"log-level"`
	LogFormat         string          `json:"log-format"`

	// MaxReceiveMemory bounds how far the tunnels' QUIC receive windows
	// may grow beyond their initial size, together (tunnel.ReceiveBudget);
	// 0 leaves each free to grow to tunnel.MaxConnectionReceiveWindow.
	MaxReceiveMemory resource.Quantity `json:"max-receive-memory"`

	// UDPBuffer is the size of the tunnel listener's UDP receive and send
	// buffers (tunnelserver.Options.UDPBuffer); 0 leaves quic-go's 7 MiB.
	UDPBuffer resource.Quantity `json:"udp-buffer"`

	// MemoryLimit is the Go runtime's soft memory limit, a quantity such as
	// "1Gi"; "" or "0": none (the heap may grow to twice what is live);
	// "auto" (the default): 90 % of the cgroup's memory limit if it has
	// one, else none. GOMEMLIMIT in the environment wins;
	// cli.Main applies it (cli.ApplyMemoryLimit), and gives the heap back
	// to the kernel once quiet after a burst (internal/memtrim).
	MemoryLimit string `json:"memory-limit,omitempty"`

	// Logger is where the gateway logs; nil discards.
	Logger *slog.Logger `json:"-"`
}

// Default ports and addresses (docs/design.md, "Ports and names").
const (
	DefaultTunnelListen = ":10262"
	DefaultProxyPort    = 10263
	DefaultDNSListen    = ":53"
	// The admin endpoints answer on loopback unless told otherwise: the
	// manifests bind them to the node's VPC address.
	DefaultAdminListen = "127.0.0.1:10265"
	// DefaultKubeAPIQPS and DefaultKubeAPIBurst replace client-go's 5 and
	// 10. They size two budgets: the delegated heartbeats' writes, and
	// every other request (taint, VIP, election records, update trigger).
	// A delegated heartbeat costs one request (an update from the Lease
	// informer's copy) per offline node every 10 s: 100 carries about
	// 1,000 offline nodes per replica; the burst takes a site that goes
	// offline at once. kube-apiserver's API Priority and Fairness still
	// queues the gateway fairly among its other clients.
	DefaultKubeAPIQPS   = 100
	DefaultKubeAPIBurst = 200
	DefaultDataDir      = "/var/lib/tether-gateway"
	// DefaultACMEHTTPListen is where ACME's HTTP-01 challenges are
	// answered in ACME mode: the ACME server dials TCP port 80 of the
	// domain's address (README.md, "Ports").
	DefaultACMEHTTPListen = ":80"
	// ACMEStorageDir keeps the ACME state in --data-dir/acme.
	ACMEStorageDir = "dir"
	// ACMEStorageSecretPrefix starts --acme-storage secret:<namespace>/<name>.
	ACMEStorageSecretPrefix = "secret:"
)

// DefaultConfig returns the configuration used when neither a file nor a
// flag says otherwise.
func DefaultConfig() Config {
	return Config{
		KubeAPIQPS:               DefaultKubeAPIQPS,
		KubeAPIBurst:             DefaultKubeAPIBurst,
		TunnelListen:             DefaultTunnelListen,
		ProxyPort:                DefaultProxyPort,
		DNSListen:                DefaultDNSListen,
		AdminListen:              DefaultAdminListen,
		DataDir:                  DefaultDataDir,
		ACMECA:                   certmagic.LetsEncryptProductionCA,
		ACMEStorage:              ACMEStorageDir,
		ACMEHTTPListen:           DefaultACMEHTTPListen,
		Mode:                     string(nodewatch.ModeNodeIP),
		MaxNodeAddresses:         nodewatch.DefaultMaxPerNode,
		MaxServiceStreamsPerEdge: edgeservices.DefaultMaxPerEdge,
		ServiceStreamsPerSecond:  edgeservices.DefaultPerSecond,
		WidestPodCIDR:            fmt.Sprintf("%d,%d", nodewatch.DefaultWidestPodCIDR4, nodewatch.DefaultWidestPodCIDR6),
		NetRules:                 netrules.KindAuto,
		EdgeSelector:             nodewatch.DefaultEdgeSelector().String(),
		EdgePorts:                config.Ports{10250, 10255},
		AllowedSources:           slices.Clone(sources.DefaultAllowed),
		ResyncPeriod:             metav1.Duration{Duration: 30 * time.Second},
		CleanupOnExit:            true,
		DNSTTL:                   metav1.Duration{Duration: dns.DefaultTTL},
		MaxStreamsPerEdge:        registry.DefaultMaxStreams,
		MaxHandshakes:            DefaultMaxHandshakes,
		MaxReceiveMemory:         *resource.NewQuantity(tunnel.DefaultReceiveBudget, resource.BinarySI),
		UDPBuffer:                *resource.NewQuantity(DefaultUDPBuffer, resource.BinarySI),
		MemoryLimit:              cli.AutoMemoryLimit,
		IdleTimeout:              metav1.Duration{Duration: 15 * time.Second},
		StreamIdleTimeout:        metav1.Duration{Duration: 4 * time.Hour},
		ShutdownGrace:            metav1.Duration{Duration: 10 * time.Second},
		LogLevel:                 "info",
		LogFormat:                "text",

		DelegatedHeartbeatTaint:         true,
		DelegatedHeartbeatTaintRenewals: pooltaint.DefaultThreshold,
		NodeAutonomy:                    true,
		PoolLeaseDuration:               metav1.Duration{Duration: record.DefaultLeaseDuration},
		PoolFeed:                        true,
		PoolResources:                   slices.Clone(feed.DefaultResourceSpecs),
	}
}

// The settings by part, in the order of the sections of
// packaging/config/gateway.yaml: each part registers its flags (whose help
// is the documentation: README.md's flag table and the YAML file are
// generated from it) and checks its settings, side by side.

// RegisterFlags binds a flag to each of c's settings, named as its YAML
// key, with c's values as the defaults. The program adds --config.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.clusterFlags(fs)
	c.servingFlags(fs)
	c.acmeFlags(fs)
	c.routingFlags(fs)
	c.dnsFlags(fs)
	c.poolFlags(fs)
	c.limitFlags(fs)
	c.processFlags(fs)
}

// Validate checks c and reports every problem at once.
func (c *Config) Validate() error {
	var p problems
	c.validateCluster(&p)
	c.validateServing(&p)
	c.validateACME(&p)
	c.validateRouting(&p)
	c.validateDNS(&p)
	c.validatePools(&p)
	c.validateLimits(&p)
	c.validateProcess(&p)
	return errors.Join(p...)
}

// problems collects what Validate finds, each naming its flag.
type problems []error

func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Errorf(format, args...))
}

// listenAddr checks a listen address that is set.
func (p *problems) listenAddr(name, addr string) {
	if addr == "" {
		return
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		p.add("--%s %q: want host:port or :port", name, addr)
	}
}

// Cluster: the Kubernetes client and the CA of the edges' certificates.

func (c *Config) clusterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig `file` used to watch Nodes (default: the in-cluster service account)")
	fs.Float64Var(&c.KubeAPIQPS, "kube-api-qps", c.KubeAPIQPS, "average `requests` per second of each of two budgets of the Kubernetes client (client-go's default is 5): one for delegated heartbeats, one for everything else (taints, VIPs, election records, update trigger, autonomy's pod tolerations), so at most twice this in all. Each offline node whose heartbeat its pool's leader delegates costs one request every 10 s (an update of its Lease from the gateway's informer), so 100 carries about 1,000 such nodes per replica; a renewal that would wait over a second for a token is answered unavailable at once. kube-apiserver's API Priority and Fairness still protects the server")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, "`requests` each budget of --kube-api-qps may send at once above its rate, as when a site goes offline and the renewals and taints of its nodes arrive together (client-go's default is 10)")
	fs.StringVar(&c.ClientCA, "client-ca", c.ClientCA, "PEM `file` with the CA certificate(s) that sign the edges' node client certificates (CN=system:node:<name>, O=system:nodes), such as the cluster CA; read again when it changes; required")
}

func (c *Config) validateCluster(p *problems) {
	if c.KubeAPIQPS <= 0 {
		p.add("--kube-api-qps %g: want a positive rate", c.KubeAPIQPS)
	}
	if c.KubeAPIBurst < 1 {
		p.add("--kube-api-burst %d: want at least 1", c.KubeAPIBurst)
	}
	if c.ClientCA == "" {
		p.add("--client-ca is required: the CA that signs the edges' node certificates (the cluster CA when edges use their kubelet certificates)")
	}
}

// Serving certificate: from files, from the gateway's own CA, or from an
// ACME CA (below).

func (c *Config) servingFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM `file` with the gateway's serving certificate (and its chain), which edges verify with their --gateway-ca; read again when it changes. Without --tls-cert and --tls-key the gateway's own CA in --data-dir issues and renews it")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM `file` with the private key of --tls-cert; may be the same file; read again when it changes")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "`directory` of the self-managed CA (used without --tls-cert/--tls-key and --acme-domain), and of the ACME state with --acme-storage=dir (acme/): ca.crt, which edges need as their --gateway-ca (`tetherctl ca` prints it), ca.key, and the serving certificate it issues and renews. Give replicas the same CA by copying ca.crt and ca.key into each one's directory before its first start")
	fs.Var(config.NewStringList(&c.ServerNames), "server-name", "DNS `name`s and IP addresses (comma-separated or repeated) the self-managed serving certificate is issued for: what edges dial (their --gateway or --gateway-server-name); default the host name")
}

func (c *Config) validateServing(p *problems) {
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		p.add("--tls-key is required with --tls-cert: the key of the gateway's serving certificate (it may be the same file)")
	case c.TLSCert == "" && c.TLSKey != "":
		p.add("--tls-cert is required with --tls-key: the gateway's serving certificate, which edges verify with their --gateway-ca")
	case c.ACME() && (c.TLSCert != "" || c.TLSKey != ""):
		p.add("--acme-domain and --tls-cert/--tls-key exclude each other: the serving certificate comes either from an ACME CA or from the files")
	case c.SelfManagedTLS():
		if c.DataDir == "" {
			p.add("--data-dir is required without --tls-cert/--tls-key: the gateway's own CA lives there")
		}
	}
	for _, n := range c.ServerNames {
		if why := selfca.ValidName(n); why != "" {
			p.add("--server-name %q: want a DNS name or an IP address: %s", n, why)
		}
	}
}

// SelfManagedTLS reports whether the gateway issues its own serving
// certificate: neither --tls-cert nor --tls-key nor --acme-domain is given.
func (c *Config) SelfManagedTLS() bool {
	return c.TLSCert == "" && c.TLSKey == "" && !c.ACME()
}

// ACME reports whether the serving certificate comes from an ACME CA
// (--acme-domain).
func (c *Config) ACME() bool { return len(c.ACMEDomains) > 0 }

func (c *Config) acmeFlags(fs *flag.FlagSet) {
	fs.Var(config.NewStringList(&c.ACMEDomains), "acme-domain", "ACME mode: DNS `name`s (comma-separated or repeated) edges dial, for which an ACME CA (--acme-ca) issues the serving certificate and the gateway renews it; giving it accepts the CA's subscriber agreement. Validation is HTTP-01: the CA must reach --acme-http-listen as TCP port 80 of each name's address. Excludes --tls-cert/--tls-key")
	fs.StringVar(&c.ACMECA, "acme-ca", c.ACMECA, "ACME directory `URL` (with --acme-domain)")
	fs.StringVar(&c.ACMEEmail, "acme-email", c.ACMEEmail, "contact `address` of the ACME account, for the CA's expiry and policy notices (with --acme-domain)")
	fs.StringVar(&c.ACMECARoot, "acme-ca-root", c.ACMECARoot, "PEM `file` with the CA certificate(s) that verify the ACME server's own HTTPS, for a private ACME CA (default: the system roots)")
	fs.StringVar(&c.ACMEStorage, "acme-storage", c.ACMEStorage, "`where` the ACME account, certificates and locks live: dir (--data-dir/acme) or secret:<namespace>/<name>, a Kubernetes Secret that replicas share so that they use one account and one certificate (needs get, create and update on it: packaging/kubernetes/gateway-rbac.yaml)")
	fs.StringVar(&c.ACMEHTTPListen, "acme-http-listen", c.ACMEHTTPListen, "TCP `address` of the listener that answers ACME HTTP-01 challenges (with --acme-domain); the CA dials port 80 of the domain's address, so forward that here if it is another port")
}

func (c *Config) validateACME(p *problems) {
	if !c.ACME() {
		if c.ACMEEmail != "" || c.ACMECARoot != "" {
			p.add("--acme-email and --acme-ca-root need --acme-domain")
		}
		return
	}
	for _, d := range c.ACMEDomains {
		name := strings.ToLower(strings.TrimSuffix(d, "."))
		switch {
		case strings.HasPrefix(name, "*."):
			p.add("--acme-domain %q: HTTP-01 cannot validate a wildcard name; give the names edges dial", d)
		case net.ParseIP(name) != nil:
			p.add("--acme-domain %q: want a DNS name, not an address", d)
		default:
			if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 || !strings.Contains(name, ".") {
				p.add("--acme-domain %q: want a fully qualified DNS name: %s", d, strings.Join(msgs, "; "))
			}
		}
	}
	if u, err := url.Parse(c.ACMECA); err != nil || u.Scheme != "https" || u.Host == "" {
		p.add("--acme-ca %q: want the https:// URL of an ACME directory", c.ACMECA)
	}
	if _, _, ok, err := c.ACMESecret(); err != nil {
		p.add("%w", err)
	} else if !ok && c.DataDir == "" {
		p.add("--data-dir is required with --acme-storage=dir: the ACME account and certificates live in <data-dir>/acme")
	}
	if c.ACMEHTTPListen == "" {
		p.add("--acme-http-listen is required with --acme-domain: the ACME server validates the domain over HTTP on port 80")
	}
	p.listenAddr("acme-http-listen", c.ACMEHTTPListen)
}

// ACMESecret returns the namespace and name of --acme-storage
// secret:<namespace>/<name>; ok is false for dir.
func (c *Config) ACMESecret() (namespace, name string, ok bool, err error) {
	if c.ACMEStorage == ACMEStorageDir {
		return "", "", false, nil
	}
	ref, found := strings.CutPrefix(c.ACMEStorage, ACMEStorageSecretPrefix)
	if !found {
		return "", "", false, fmt.Errorf("--acme-storage %q: want dir or secret:<namespace>/<name>", c.ACMEStorage)
	}
	namespace, name, found = strings.Cut(ref, "/")
	if !found || namespace == "" || name == "" {
		return "", "", false, fmt.Errorf("--acme-storage %q: want secret:<namespace>/<name>", c.ACMEStorage)
	}
	if msgs := validation.IsDNS1123Label(namespace); len(msgs) > 0 {
		return "", "", false, fmt.Errorf("--acme-storage %q: namespace: %s", c.ACMEStorage, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return "", "", false, fmt.Errorf("--acme-storage %q: Secret name: %s", c.ACMEStorage, strings.Join(msgs, "; "))
	}
	return namespace, name, true, nil
}

// Tunnels and routing: where edges dial, which nodes are edges, which of
// their addresses and ports are redirected to the gateway.

func (c *Config) routingFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.TunnelListen, "tunnel-listen", c.TunnelListen, "UDP `address` of the QUIC listener that edges dial")
	fs.IntVar(&c.ProxyPort, "proxy-port", c.ProxyPort, "TCP `port` of the transparent listener, on all addresses (IPv4 and IPv6), where DNAT sends connections for edge nodes. A client that dials this port directly is routed by TLS SNI or HTTP Host (a node name, bare or under a --dns-zone) to that node's port 10250")
	fs.Var(config.NewStringList(&c.AllowedSources), "allowed-sources", "client `prefixes` (comma-separated or repeated) the transparent listener (--proxy-port) and the admin endpoints (--admin-listen) accept connections from (the VPC's ranges). An edge's address is refused even inside them: one in --edge-cidrs, an edge Node's, or the address an edge's tunnel comes from. Others are reset and counted in tether_gateway_source_refusals_total. The host's own addresses are always admitted. The default is RFC 1918, IPv6 unique local and loopback; 0.0.0.0/0,::/0 admits any client but the edges")
	fs.Var(&c.EdgePorts, "edge-ports", "edge `ports` (comma-separated) whose traffic to an edge node's address is redirected to --proxy-port; the edges' --allow-ports decide what they accept")
	fs.StringVar(&c.EdgeSelector, "edge-selector", c.EdgeSelector, "label `selector` that tells edge nodes from cloud nodes")
	fs.StringVar(&c.Mode, "mode", c.Mode, "address `mode`: node-ip (cloud clients use the edge nodes' own InternalIPs, which the VPC routes to the gateway) or vip (each edge node gets a virtual IP from --vip-cidr, for sites that reuse the same private ranges)")
	fs.StringVar(&c.VIPCIDR, "vip-cidr", c.VIPCIDR, "`prefix` the edge nodes' virtual IPs come from; required with --mode=vip")
	fs.Var(config.NewStringList(&c.EdgeCIDRs), "edge-cidrs", "`prefixes` (comma-separated or repeated) the edge sites' node addresses lie in; in node-ip mode an edge node's address outside them is never redirected to it (default: any address that is not a cloud node's or the gateway host's)")
	fs.Var(config.NewStringList(&c.EdgePodCIDRs), "edge-pod-cidrs", "`prefixes` (comma-separated or repeated) the edge nodes' pod ranges lie in (part of the cluster CIDR). A connection to an address in an edge Node's spec.podCIDRs inside them, on any TCP port, is redirected to --proxy-port and relayed to that node, which dials only its own pods' allowed ports (tether-edge --allow-pod-ports). A range that overlaps another edge's, a cloud node's or the gateway host's is routed to nobody. Empty (the default) routes no pod")
	fs.StringVar(&c.WidestPodCIDR, "widest-pod-cidr", c.WidestPodCIDR, "the shortest prefix `lengths`, IPv4 then IPv6 (comma-separated), an edge node's pod range may have to be routed: a wider range is refused, however it was set")
	fs.BoolVar(&c.EdgeServices, "edge-services", c.EdgeServices, "connect edge pods to the cloud Services annotated tether.io/edge-access (\"true\" or a list of port names or numbers), through the edges' tunnels: the gateway dials only a ready endpoint of such a Service on a cloud node, never an edge's address or pod, its own host, loopback or link-local (needs list/watch of Services and EndpointSlices; the edges' --edge-services)")
	fs.Var(config.NewStringList(&c.EdgeServiceCIDRs), "edge-service-cidrs", "`prefixes` (comma-separated or repeated) where an endpoint of a marked Service may lie besides the cloud nodes' addresses and pod ranges (spec.podCIDRs): the cloud's pod ranges where IPAM leaves spec.podCIDRs empty (Calico, Cilium's cluster pool), or the addresses of a selectorless Service's hand-made EndpointSlice. An endpoint on an edge node, or in an edge's address or pod range, is never dialled")
	fs.IntVar(&c.MaxNodeAddresses, "max-addresses-per-node", c.MaxNodeAddresses, "at most this many `addresses` of one edge node are routed to it (redirected, answered in DNS): those it registered with first, then the others in the order it lists them")
	fs.StringVar(&c.NetRules, "netrules", c.NetRules, "packet filter `backend` for the DNAT rules: auto (the one the host already uses), nftables, iptables, or none (send the traffic to --proxy-port some other way)")
	fs.DurationVar(&c.ResyncPeriod.Duration, "resync-period", c.ResyncPeriod.Duration, "re-apply the DNAT rules this often even without a Node change, repairing rules someone else flushed (drift)")
	fs.BoolVar(&c.CleanupOnExit, "cleanup-on-exit", c.CleanupOnExit, "remove the DNAT rules and the VIP interface tether0 on exit (what Tether created, nothing else)")
}

func (c *Config) validateRouting(p *problems) {
	if c.TunnelListen == "" {
		p.add("--tunnel-listen is required")
	}
	p.listenAddr("tunnel-listen", c.TunnelListen)
	if c.ProxyPort < 0 || c.ProxyPort > 65535 {
		p.add("--proxy-port %d: want a port from 1 to 65535 (0 picks a free one, for tests)", c.ProxyPort)
	}
	mode, err := nodewatch.ParseMode(c.Mode)
	if err != nil {
		p.add("--mode: %w", err)
	}
	if c.VIPCIDR != "" {
		if _, err := netip.ParsePrefix(c.VIPCIDR); err != nil {
			p.add("--vip-cidr %q: %w", c.VIPCIDR, err)
		}
	} else if mode == nodewatch.ModeVIP {
		p.add("--vip-cidr is required with --mode=vip")
	}
	if _, err := c.edgeCIDRs(); err != nil {
		p.add("%w", err)
	}
	if _, err := c.podPolicy(); err != nil {
		p.add("%w", err)
	}
	if _, err := sources.ParsePrefixes("edge-service-cidrs", c.EdgeServiceCIDRs); err != nil {
		p.add("%w", err)
	}
	if _, err := sources.ParsePrefixes("allowed-sources", c.AllowedSources); err != nil {
		p.add("%w", err)
	}
	if c.MaxNodeAddresses < 1 {
		p.add("--max-addresses-per-node %d: want 1 or more", c.MaxNodeAddresses)
	}
	switch c.NetRules {
	case netrules.KindAuto, netrules.KindNFTables, netrules.KindIPTables, netrules.KindNone:
	default:
		p.add("--netrules %q: want auto, nftables, iptables or none", c.NetRules)
	}
	if _, err := labels.Parse(c.EdgeSelector); err != nil {
		p.add("--edge-selector %q: %w", c.EdgeSelector, err)
	} else if strings.TrimSpace(c.EdgeSelector) == "" {
		p.add("--edge-selector is empty: it would make every node an edge node")
	}
	if len(c.EdgePorts) == 0 && c.NetRules != netrules.KindNone {
		p.add("--edge-ports is empty: no edge port would be redirected to the gateway")
	}
	if c.ResyncPeriod.Duration <= 0 {
		p.add("--resync-period %s: want a positive duration", c.ResyncPeriod.Duration)
	}
}

// edgeCIDRs parses EdgeCIDRs.
func (c Config) edgeCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.EdgeCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--edge-cidrs %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// podPolicy parses EdgePodCIDRs and WidestPodCIDR.
func (c Config) podPolicy() (nodewatch.PodPolicy, error) {
	var p nodewatch.PodPolicy
	for _, s := range c.EdgePodCIDRs {
		r, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return p, fmt.Errorf("--edge-pod-cidrs %q: %w", s, err)
		}
		p.Ranges = append(p.Ranges, r.Masked())
	}
	lengths := strings.Split(c.WidestPodCIDR, ",")
	if len(lengths) != 2 {
		return p, fmt.Errorf("--widest-pod-cidr %q: want two prefix lengths, IPv4 then IPv6 (e.g. 16,48)", c.WidestPodCIDR)
	}
	for i, max := range []int{32, 128} {
		n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(lengths[i]), "/"))
		if err != nil || n < 1 || n > max {
			return p, fmt.Errorf("--widest-pod-cidr %q: want a prefix length from 1 to %d", lengths[i], max)
		}
		if i == 0 {
			p.Widest4 = n
		} else {
			p.Widest6 = n
		}
	}
	return p, nil
}

// routePolicy is what the node watcher accepts as an edge node's address.
func (c Config) routePolicy() nodewatch.Policy {
	p := nodewatch.Policy{Mode: nodewatch.Mode(c.Mode), MaxPerNode: c.MaxNodeAddresses}
	p.EdgeCIDRs, _ = c.edgeCIDRs() // checked by Validate
	if v, err := netip.ParsePrefix(c.VIPCIDR); err == nil {
		p.VIPCIDR = v.Masked()
	}
	return p
}

// DNS: the node-name server and the hosts ConfigMap.

func (c *Config) dnsFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DNSListen, "dns-listen", c.DNSListen, "UDP and TCP `address` of the DNS server that answers edge node names; empty disables it")
	fs.Var(config.NewStringList(&c.DNSZones), "dns-zone", "DNS `zone`s (comma-separated or repeated) under which node names are answered (edge-1.<zone>) and accepted in TLS SNI and HTTP Host")
	fs.DurationVar(&c.DNSTTL.Duration, "dns-ttl", c.DNSTTL.Duration, "TTL of DNS answers, positive and negative")
	fs.BoolVar(&c.DNSCloudNodes, "dns-cloud-nodes", c.DNSCloudNodes, "also answer the names of cloud (non-edge) nodes, with their own InternalIPs")
	fs.StringVar(&c.HostsConfigMap, "hosts-configmap", c.HostsConfigMap, "also keep `namespace/name`, a ConfigMap with \"<ip>\\t<node>\" lines (key tunnel-nodes), for CoreDNS's hosts plugin as OpenYurt's yurt-tunnel-dns uses it; needs RBAC to get, create and update that ConfigMap")
}

func (c *Config) validateDNS(p *problems) {
	p.listenAddr("dns-listen", c.DNSListen)
	for _, z := range c.DNSZones {
		name := strings.ToLower(strings.Trim(z, "."))
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			p.add("--dns-zone %q: %s", z, strings.Join(msgs, "; "))
		}
	}
	if err := (dns.Options{Zones: c.DNSZones, TTL: c.DNSTTL.Duration}).Validate(); err != nil {
		p.add("--dns-zone/--dns-ttl: %w", err)
	}
	if c.HostsConfigMap != "" {
		if _, _, err := dns.ParseConfigMapRef(c.HostsConfigMap); err != nil {
			p.add("--hosts-configmap: %w", err)
		}
	}
}

// Node pools and service topology: the controllers that write what
// OpenYurt's edges expect.

func (c *Config) poolFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.DelegatedHeartbeatTaint, "delegated-heartbeat-taint", c.DelegatedHeartbeatTaint, "taint node.openyurt.io/unschedulable=true:NoSchedule the nodes whose Lease renewals reach the cloud only through their pool's leader (openyurt.io/delegate-heartbeat), and clear the taint once they renew it themselves (needs patch of Nodes, list/watch of Leases in kube-node-lease)")
	fs.IntVar(&c.DelegatedHeartbeatTaintRenewals, "delegated-heartbeat-taint-renewals", c.DelegatedHeartbeatTaintRenewals, "taint a node after this many `n` delegated Lease renewals in a row (with --delegated-heartbeat-taint)")
	fs.BoolVar(&c.NodeAutonomy, "node-autonomy", c.NodeAutonomy, "keep the pods of the edge nodes annotated node.beta.openyurt.io/autonomy=true (forever) or node.openyurt.io/autonomy-duration (a Go duration; 0: forever) bound through a loss of the cloud: their tolerations of node.kubernetes.io/unreachable and not-ready (NoExecute) are set to that bound, and put back when the annotation goes (needs list/watch and patch of Pods; docs/operate.md)")
	fs.DurationVar(&c.PoolLeaseDuration.Duration, "pool-lease-duration", c.PoolLeaseDuration.Duration, "the edges' --pool-lease-duration, which must be the same: a pool leader is taken as such (for its delegated heartbeats and sync records) for at most this `duration` after its last renewal of its pool's election record, and the records are written with at most this lease, whatever the leader sent (a stolen node key cannot hold its pool's lead once it stops renewing). Shorter than the edges': a leader is refused before its pool elects another; longer: a leader that stopped is taken as such for longer")
	fs.BoolVar(&c.PoolFeed, "pool-feed", c.PoolFeed, "list/watch --pool-resources once for every pool and serve them, each change signed with the serving certificate's key, to the pools' leaders through their tunnels, which relay them to their pools' members; the members verify them against this gateway's certificate, so a stolen node key cannot forge its pool's data (needs list/watch of those resources)")
	fs.Var(config.NewStringList(&c.PoolResources), "pool-resources", "the pool-scope `resource`s fed with --pool-feed (comma-separated or repeated), as resource.group/version or resource/version for the core group; the edges' --pool-resources, which must be among them")
	fs.BoolVar(&c.EnableUpdateTrigger, "enable-update-trigger", c.EnableUpdateTrigger, "stamp openyurt.io/update-trigger on the EndpointSlices and Endpoints a Service's openyurt.io/topologyKeys change or a node's pool change affects, so that YurtHub edges filter them again (needs list/watch of Services and EndpointSlices/Endpoints, patch of them)")
}

func (c *Config) validatePools(p *problems) {
	if c.DelegatedHeartbeatTaintRenewals < 1 {
		p.add("--delegated-heartbeat-taint-renewals %d: want at least 1", c.DelegatedHeartbeatTaintRenewals)
	}
	if c.PoolLeaseDuration.Duration < time.Second {
		p.add("--pool-lease-duration %v: want at least 1s", c.PoolLeaseDuration.Duration)
	}
	if _, err := feed.ParseResources(c.PoolResources); err != nil {
		p.add("%w", err)
	} else if c.PoolFeed && len(c.PoolResources) == 0 {
		p.add("--pool-feed with no --pool-resources")
	}
}

// Limits: streams, handshakes, memory and timeouts.

func (c *Config) limitFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.MaxStreamsPerEdge, "max-streams-per-edge", c.MaxStreamsPerEdge, "at most `n` connections relayed at once per edge; more wait a second, then are refused as overloaded. Keep it at most the edges' --max-streams")
	fs.IntVar(&c.MaxServiceStreamsPerEdge, "max-service-streams-per-edge", c.MaxServiceStreamsPerEdge, "at most `n` connections of one edge's pods to cloud Services open at once (--edge-services); more are refused as overloaded. The edge's own requests (heartbeats, elections, pool feed) have slots of their own")
	fs.Float64Var(&c.ServiceStreamsPerSecond, "service-streams-per-second", c.ServiceStreamsPerSecond, "at most this `rate` of new connections of one edge's pods to cloud Services, a burst of as many (--edge-services); more are refused as rate_limited")
	fs.IntVar(&c.MaxHandshakes, "max-handshakes", c.MaxHandshakes, "work on at most `n` tunnel handshakes at once; more wait, the newest first, and one that waited 3s is refused (its edge dials again in 2 to 4 s, 4 to 8 s after further refusals), so that thousands of edges dialling together, as in a cold start or restart, do not share the CPU so thinly that none finishes in time (docs/sizing.md). Waiting: tether_gateway_tunnel_handshakes_waiting. 0: no bound")
	fs.Var(config.Quantity{Q: &c.MaxReceiveMemory}, "max-receive-memory", "bound the memory that data edges sent and cloud clients have not read yet may take: each tunnel's QUIC receive window starts at 768KiB and grows with fast transfers up to 8MiB, and together they may grow by at most this `size` (such as 256Mi or 2Gi); a tunnel that finds it spent keeps its window, its transfers go on, slower on long paths. Worst case: tunnels x 768KiB + this (tunnel/README.md). 0: no bound (tunnels x 8MiB)")
	fs.Var(config.Quantity{Q: &c.UDPBuffer}, "udp-buffer", "`size` of the tunnel listener's UDP receive and send buffers (such as 32Mi), where datagrams wait while the gateway is busy, as in a cold start or restart of thousands of edges; set with SO_RCVBUFFORCE when the gateway has CAP_NET_ADMIN, else capped by the kernel at net.core.rmem_max and wmem_max (the gateway warns when it got less; docs/sizing.md). Drops: tether_gateway_tunnel_udp_drops_total. 0: quic-go's 7Mi")
	fs.StringVar(&c.MemoryLimit, "memory-limit", c.MemoryLimit, "soft `limit` of the Go runtime's own memory (heap and stacks), a quantity such as 1Gi; near it the garbage collector runs more often (never taking more than about half the CPU) instead of letting the heap grow to twice what is live; it is never a reason to fail. Leave room above the working set (docs/sizing.md: give the gateway at least 150 KiB per edge; a limit near what it uses makes the collector run without pause); auto: 90 % of the memory limit of the process's cgroup (a container's resources.limits.memory, a unit's MemoryMax=), none without one; empty or 0: none; GOMEMLIMIT in the environment wins")
	fs.DurationVar(&c.IdleTimeout.Duration, "idle-timeout", c.IdleTimeout.Duration, "close a tunnel silent for this `duration` (a tunnel's is the lower of this and the edge's, 15 s); edges send a keepalive every half of it and the gateway answers, so only a dead path is silent that long")
	fs.DurationVar(&c.StreamIdleTimeout.Duration, "stream-idle-timeout", c.StreamIdleTimeout.Duration, "close a relayed connection that moved no byte either way for this `duration` (the kubelet's own streaming limit is 4h); 0 disables it")
	fs.DurationVar(&c.ShutdownGrace.Duration, "shutdown-grace", c.ShutdownGrace.Duration, "on SIGTERM or SIGINT, let relayed connections finish for up to this `duration` before the tunnels are closed (edges then use the other replicas)")
}

func (c *Config) validateLimits(p *problems) {
	if c.MaxStreamsPerEdge < 1 {
		p.add("--max-streams-per-edge %d: want at least 1", c.MaxStreamsPerEdge)
	}
	if c.MaxServiceStreamsPerEdge < 1 || c.MaxServiceStreamsPerEdge > 4096 {
		p.add("--max-service-streams-per-edge %d: want 1 to 4096", c.MaxServiceStreamsPerEdge)
	}
	if c.ServiceStreamsPerSecond <= 0 {
		p.add("--service-streams-per-second %g: want a positive rate", c.ServiceStreamsPerSecond)
	}
	if c.MaxHandshakes < 0 {
		p.add("--max-handshakes %d: want 0 (no bound) or more", c.MaxHandshakes)
	}
	if c.MaxReceiveMemory.Sign() < 0 {
		p.add("--max-receive-memory %s: want 0 (no bound) or a positive size", c.MaxReceiveMemory.String())
	}
	if c.UDPBuffer.Sign() < 0 || c.UDPBuffer.Value() > maxUDPBuffer {
		p.add("--udp-buffer %s: want 0 (quic-go's 7Mi) or a size up to 1Gi", c.UDPBuffer.String())
	}
	if _, err := cli.ParseMemoryLimit(c.MemoryLimit); err != nil {
		p.add("--memory-limit: %v", err)
	}
	if c.IdleTimeout.Duration <= 0 {
		p.add("--idle-timeout %s: want a positive duration", c.IdleTimeout.Duration)
	}
	if c.StreamIdleTimeout.Duration < 0 {
		p.add("--stream-idle-timeout %s: want 0 (none) or a positive duration", c.StreamIdleTimeout.Duration)
	}
	if c.ShutdownGrace.Duration < 0 {
		p.add("--shutdown-grace %s: want 0 or a positive duration", c.ShutdownGrace.Duration)
	}
}

// DefaultMaxHandshakes is --max-handshakes' default. A handshake holds its
// place from the edge's ClientHello until its certificate is checked: a
// round trip to the edge and the edge's own work, so the bound must let
// the gateway fill its CPU while edges answer slowly (a cold start of
// 10,000 edges on the 2-core bench, whose load generator plays every
// edge on the same cores: 40.9 s with 256 places, 32.2 s with 1,024),
// and keep the handshakes that share the CPU few enough to finish well
// within the edges' 5 s timeout: without a bound, cold starts of 10,000
// collapsed to about 30 registrations a second (docs/sizing.md).
const DefaultMaxHandshakes = 1024

// DefaultUDPBuffer is --udp-buffer's default: room for about 14,000
// handshake datagrams of 1,200 bytes (about 2.3 KiB each as the kernel
// counts), so that a restart storm of 10,000 edges does not overflow it
// while the gateway is busy (8 MiB dropped 47 % of them: docs/sizing.md).
// The kernel's memory, used only while datagrams wait.
const DefaultUDPBuffer = 32 << 20

// maxUDPBuffer bounds --udp-buffer: the kernel doubles the value into an
// int.
const maxUDPBuffer = 1 << 30

// receiveBudget is the tunnels' receive budget, --max-receive-memory; nil
// when it is 0.
func (c *Config) receiveBudget() *tunnel.ReceiveBudget {
	if c.MaxReceiveMemory.Sign() <= 0 {
		return nil
	}
	return tunnel.NewReceiveBudget(c.MaxReceiveMemory.Value())
}

// Process: the admin endpoints and the log.

func (c *Config) processFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.AdminListen, "admin-listen", c.AdminListen, "listen `address` of the admin HTTP endpoints /metrics, /healthz, /readyz (listeners up and Nodes synced) and /status (JSON: replica, edges, RTT, streams, bytes), for clients of --allowed-sources only; empty disables them. The default answers on loopback only: give the host's VPC address (the manifests give the node's) for Prometheus and the kubelet's probes")
	fs.BoolVar(&c.Profiling, "profiling", c.Profiling, "also serve the Go runtime's profiles (CPU, heap, goroutines, execution trace) under /debug/pprof/ on the admin address; whoever reaches that address can read them and load the process, so keep it off or the address private")
	fs.StringVar(&c.Replica, "replica", c.Replica, "`name` of this replica on /status (default: the host name)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log `level`: debug, info, warn or error (debug also logs every routed or refused connection)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log `format`: text or json")
}

func (c *Config) validateProcess(p *problems) {
	p.listenAddr("admin-listen", c.AdminListen)
}
