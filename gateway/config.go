package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tether-edge/tether/gateway/dns"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/gateway/pooltaint"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/gateway/selfca"
	"github.com/tether-edge/tether/internal/cli"
	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/netrules"
	"github.com/tether-edge/tether/tunnel"
)

// Config is tether-gateway's configuration. The JSON names are the flag
// names and the keys of the YAML file (/etc/tether/gateway.yaml);
// durations are written as Go durations ("15s").
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
	EdgeCIDRs    []string `json:"edge-cidrs,omitempty"`
	NetRules     string   `json:"netrules"`
	EdgeSelector string   `json:"edge-selector"`

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

	MaxStreamsPerEdge int `json:"max-streams-per-edge"`
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
	DefaultAdminListen  = ":10265"
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
		KubeAPIQPS:        DefaultKubeAPIQPS,
		KubeAPIBurst:      DefaultKubeAPIBurst,
		TunnelListen:      DefaultTunnelListen,
		ProxyPort:         DefaultProxyPort,
		DNSListen:         DefaultDNSListen,
		AdminListen:       DefaultAdminListen,
		DataDir:           DefaultDataDir,
		ACMECA:            certmagic.LetsEncryptProductionCA,
		ACMEStorage:       ACMEStorageDir,
		ACMEHTTPListen:    DefaultACMEHTTPListen,
		Mode:              string(nodewatch.ModeNodeIP),
		NetRules:          netrules.KindAuto,
		EdgeSelector:      nodewatch.DefaultEdgeSelector().String(),
		EdgePorts:         config.Ports{10250, 10255},
		ResyncPeriod:      metav1.Duration{Duration: 30 * time.Second},
		CleanupOnExit:     true,
		DNSTTL:            metav1.Duration{Duration: dns.DefaultTTL},
		MaxStreamsPerEdge: registry.DefaultMaxStreams,
		MaxHandshakes:     DefaultMaxHandshakes,
		MaxReceiveMemory:  *resource.NewQuantity(tunnel.DefaultReceiveBudget, resource.BinarySI),
		UDPBuffer:         *resource.NewQuantity(DefaultUDPBuffer, resource.BinarySI),
		MemoryLimit:       cli.AutoMemoryLimit,
		IdleTimeout:       metav1.Duration{Duration: 15 * time.Second},
		StreamIdleTimeout: metav1.Duration{Duration: 4 * time.Hour},
		ShutdownGrace:     metav1.Duration{Duration: 10 * time.Second},
		LogLevel:          "info",
		LogFormat:         "text",

		DelegatedHeartbeatTaint:         true,
		DelegatedHeartbeatTaintRenewals: pooltaint.DefaultThreshold,
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

// Validate checks c and reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	// checkAddr checks a listen address that is set.
	checkAddr := func(flag, addr string) {
		if addr == "" {
			return
		}
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			bad("--%s %q: want host:port or :port", flag, addr)
		}
	}
	if c.KubeAPIQPS <= 0 {
		bad("--kube-api-qps %g: want a positive rate", c.KubeAPIQPS)
	}
	if c.KubeAPIBurst < 1 {
		bad("--kube-api-burst %d: want at least 1", c.KubeAPIBurst)
	}
	if c.TunnelListen == "" {
		bad("--tunnel-listen is required")
	}
	checkAddr("tunnel-listen", c.TunnelListen)
	checkAddr("dns-listen", c.DNSListen)
	checkAddr("admin-listen", c.AdminListen)
	if c.ProxyPort < 0 || c.ProxyPort > 65535 {
		bad("--proxy-port %d: want a port from 1 to 65535 (0 picks a free one, for tests)", c.ProxyPort)
	}
	if c.ClientCA == "" {
		bad("--client-ca is required: the CA that signs the edges' node certificates (the cluster CA when edges use their kubelet certificates)")
	}
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		bad("--tls-key is required with --tls-cert: the key of the gateway's serving certificate (it may be the same file)")
	case c.TLSCert == "" && c.TLSKey != "":
		bad("--tls-cert is required with --tls-key: the gateway's serving certificate, which edges verify with their --gateway-ca")
	case c.ACME() && (c.TLSCert != "" || c.TLSKey != ""):
		bad("--acme-domain and --tls-cert/--tls-key exclude each other: the serving certificate comes either from an ACME CA or from the files")
	case c.SelfManagedTLS():
		if c.DataDir == "" {
			bad("--data-dir is required without --tls-cert/--tls-key: the gateway's own CA lives there")
		}
	}
	c.validateACME(bad)
	for _, n := range c.ServerNames {
		if why := selfca.ValidName(n); why != "" {
			bad("--server-name %q: want a DNS name or an IP address: %s", n, why)
		}
	}
	for _, z := range c.DNSZones {
		name := strings.ToLower(strings.Trim(z, "."))
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			bad("--dns-zone %q: %s", z, strings.Join(msgs, "; "))
		}
	}
	mode, err := nodewatch.ParseMode(c.Mode)
	if err != nil {
		bad("--mode: %w", err)
	}
	if c.VIPCIDR != "" {
		if _, err := netip.ParsePrefix(c.VIPCIDR); err != nil {
			bad("--vip-cidr %q: %w", c.VIPCIDR, err)
		}
	} else if mode == nodewatch.ModeVIP {
		bad("--vip-cidr is required with --mode=vip")
	}
	if _, err := c.edgeCIDRs(); err != nil {
		bad("%w", err)
	}
	switch c.NetRules {
	case netrules.KindAuto, netrules.KindNFTables, netrules.KindIPTables, netrules.KindNone:
	default:
		bad("--netrules %q: want auto, nftables, iptables or none", c.NetRules)
	}
	if _, err := labels.Parse(c.EdgeSelector); err != nil {
		bad("--edge-selector %q: %w", c.EdgeSelector, err)
	} else if strings.TrimSpace(c.EdgeSelector) == "" {
		bad("--edge-selector is empty: it would make every node an edge node")
	}
	if len(c.EdgePorts) == 0 && c.NetRules != netrules.KindNone {
		bad("--edge-ports is empty: no edge port would be redirected to the gateway")
	}
	if c.ResyncPeriod.Duration <= 0 {
		bad("--resync-period %s: want a positive duration", c.ResyncPeriod.Duration)
	}
	if err := (dns.Options{Zones: c.DNSZones, TTL: c.DNSTTL.Duration}).Validate(); err != nil {
		bad("--dns-zone/--dns-ttl: %w", err)
	}
	if c.HostsConfigMap != "" {
		if _, _, err := dns.ParseConfigMapRef(c.HostsConfigMap); err != nil {
			bad("--hosts-configmap: %w", err)
		}
	}
	if c.DelegatedHeartbeatTaintRenewals < 1 {
		bad("--delegated-heartbeat-taint-renewals %d: want at least 1", c.DelegatedHeartbeatTaintRenewals)
	}
	if c.MaxStreamsPerEdge < 1 {
		bad("--max-streams-per-edge %d: want at least 1", c.MaxStreamsPerEdge)
	}
	if c.MaxHandshakes < 0 {
		bad("--max-handshakes %d: want 0 (no bound) or more", c.MaxHandshakes)
	}
	if _, err := cli.ParseMemoryLimit(c.MemoryLimit); err != nil {
		bad("--memory-limit: %v", err)
	}
	if c.MaxReceiveMemory.Sign() < 0 {
		bad("--max-receive-memory %s: want 0 (no bound) or a positive size", c.MaxReceiveMemory.String())
	}
	if c.UDPBuffer.Sign() < 0 || c.UDPBuffer.Value() > maxUDPBuffer {
		bad("--udp-buffer %s: want 0 (quic-go's 7Mi) or a size up to 1Gi", c.UDPBuffer.String())
	}
	if c.IdleTimeout.Duration <= 0 {
		bad("--idle-timeout %s: want a positive duration", c.IdleTimeout.Duration)
	}
	if c.StreamIdleTimeout.Duration < 0 {
		bad("--stream-idle-timeout %s: want 0 (none) or a positive duration", c.StreamIdleTimeout.Duration)
	}
	if c.ShutdownGrace.Duration < 0 {
		bad("--shutdown-grace %s: want 0 or a positive duration", c.ShutdownGrace.Duration)
	}
	return errors.Join(errs...)
}

// DefaultMaxHandshakes is --max-handshakes' default. A handshake holds its
// place from the edge's ClientHello until its certificate is checked: a
// round trip to the edge and the edge's own work, so the bound must let
// the gateway fill its CPU while edges answer slowly (a cold start of
// 10,000 edges on the 2-core bench, whose load generator plays every
// edge on the same cores: 40.9 s with 256 places, 32.2 s with 1,024),
// and keep the handshakes that share the CPU few enough to finish well
// within the edges' 5 s timeout: without a bound, cold starts of 10,000
// collapsed to about 30 registrations a second (README, Sizing).
const DefaultMaxHandshakes = 1024

// DefaultUDPBuffer is --udp-buffer's default: room for about 14,000
// handshake datagrams of 1,200 bytes (about 2.3 KiB each as the kernel
// counts), so that a restart storm of 10,000 edges does not overflow it
// while the gateway is busy (8 MiB dropped 47 % of them: README, Sizing).
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

// validateACME checks the --acme-* settings.
func (c *Config) validateACME(bad func(string, ...any)) {
	if !c.ACME() {
		if c.ACMEEmail != "" || c.ACMECARoot != "" {
			bad("--acme-email and --acme-ca-root need --acme-domain")
		}
		return
	}
	for _, d := range c.ACMEDomains {
		name := strings.ToLower(strings.TrimSuffix(d, "."))
		switch {
		case strings.HasPrefix(name, "*."):
			bad("--acme-domain %q: HTTP-01 cannot validate a wildcard name; give the names edges dial", d)
		case net.ParseIP(name) != nil:
			bad("--acme-domain %q: want a DNS name, not an address", d)
		default:
			if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 || !strings.Contains(name, ".") {
				bad("--acme-domain %q: want a fully qualified DNS name: %s", d, strings.Join(msgs, "; "))
			}
		}
	}
	if u, err := url.Parse(c.ACMECA); err != nil || u.Scheme != "https" || u.Host == "" {
		bad("--acme-ca %q: want the https:// URL of an ACME directory", c.ACMECA)
	}
	if _, _, ok, err := c.ACMESecret(); err != nil {
		bad("%w", err)
	} else if !ok && c.DataDir == "" {
		bad("--data-dir is required with --acme-storage=dir: the ACME account and certificates live in <data-dir>/acme")
	}
	if c.ACMEHTTPListen == "" {
		bad("--acme-http-listen is required with --acme-domain: the ACME server validates the domain over HTTP on port 80")
	} else if _, port, err := net.SplitHostPort(c.ACMEHTTPListen); err != nil || port == "" {
		bad("--acme-http-listen %q: want host:port or :port", c.ACMEHTTPListen)
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

// routePolicy is what the node watcher accepts as an edge node's address.
func (c Config) routePolicy() nodewatch.Policy {
	p := nodewatch.Policy{Mode: nodewatch.Mode(c.Mode)}
	p.EdgeCIDRs, _ = c.edgeCIDRs() // checked by Validate
	if v, err := netip.ParsePrefix(c.VIPCIDR); err == nil {
		p.VIPCIDR = v.Masked()
	}
	return p
}
