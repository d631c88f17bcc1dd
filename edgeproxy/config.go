package edgeproxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edgeproxy/apiproxy"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/edgeproxy/edgeservice"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/edgeproxy/upstream"
	"github.com/tether-edge/tether/internal/cli"
	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/poolstore/feed"
)

// Config is tether-edge's configuration. The JSON names are the flag
// names and the keys of the YAML file (/etc/tether/edge.yaml).
type Config struct {
	// NodeName is this node's name; by default the one in the client
	// certificate (CN=system:node:<name>). The gateway always goes by the
	// certificate.
	NodeName string `json:"node-name,omitempty"`
	// Kubeconfig and ServerAddr reach the cloud kube-apiservers, for the
	// apiserver proxy: a kubeconfig (the kubelet's), or a list of
	// https://host:port in priority order with Cert, Key and ServerCA.
	// Both given: ServerAddr replaces the kubeconfig's server.
	Kubeconfig string   `json:"kubeconfig,omitempty"`
	ServerAddr []string `json:"server-addr,omitempty"`
	// ServerCA verifies the apiservers' certificates (PEM); empty means
	// the kubeconfig's CA, or the system's roots.
	ServerCA string `json:"server-ca,omitempty"`
	// Cert and Key are the node's client certificate and key, PEM; they
	// may be one file (the kubelet's kubelet-client-current.pem).
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// BootstrapKubeconfig, instead of Cert and Key, has tether-edge obtain
	// the node's client certificate through the CSR API with the
	// credentials in this kubeconfig (a bootstrap token), keep it in
	// DataDir/pki and renew it; NodeName is then required. The apiserver
	// proxy reaches this kubeconfig's server unless ServerAddr is given.
	BootstrapKubeconfig string `json:"bootstrap-kubeconfig,omitempty"`
	// Gateway lists the gateway replicas: host:port entries and/or DNS
	// names that resolve to every replica (port 10262 if none is given).
	Gateway []string `json:"gateway,omitempty"`
	// GatewayCA verifies the gateways' certificates (PEM); empty means
	// the system's roots.
	GatewayCA string `json:"gateway-ca,omitempty"`
	// GatewayServerName is the name the gateways' certificates must hold;
	// by default the host part of each --gateway entry.
	GatewayServerName string `json:"gateway-server-name,omitempty"`
	// AllowPorts are the ports of this node that cloud clients may reach
	// through the tunnel.
	AllowPorts Ports `json:"allow-ports,omitempty"`
	// AllowPodPorts are the ports of this node's pods that cloud clients
	// may reach, for a pod without the tether.io/tunnel-ports annotation:
	// "declared" (its declared TCP ports), "none" or a list of ports
	// (edgetunnel.ParsePodPorts). Pods are reached only with the
	// apiserver proxy, which tells the node's pods and ranges.
	AllowPodPorts string `json:"allow-pod-ports,omitempty"`
	// MaxStreams bounds the connections relayed at once.
	MaxStreams int `json:"max-streams,omitempty"`

	// EdgeServices lets this node's pods reach the cloud Services marked
	// tether.io/edge-access through the tunnel (package edgeservice):
	// the host's rules redirect their connections to ServiceListen.
	EdgeServices bool `json:"edge-services,omitempty"`
	// ServiceListen is the service listener (wildcard address).
	ServiceListen string `json:"service-listen,omitempty"`
	// MaxServiceStreams bounds this node's service streams toward one
	// gateway replica.
	MaxServiceStreams int `json:"max-service-streams,omitempty"`

	APIServerListen string `json:"apiserver-listen,omitempty"`
	AdminListen     string `json:"admin-listen,omitempty"`
	Profiling       bool   `json:"profiling,omitempty"`
	DataDir         string `json:"data-dir,omitempty"`
	// CacheMaxSize bounds the apiserver proxy's cache file (the bytes
	// of its pages that hold data), a quantity such as "256Mi"; "0"
	// removes the bound. Past it whole resources are evicted; queued
	// status writes never are.
	CacheMaxSize string `json:"cache-max-size,omitempty"`

	// Pool is this node's pool; by default its apps.openyurt.io/nodepool
	// label. PoolListen is the pool listener (empty: no pool). PoolCA
	// verifies the peers' node certificates (default: the apiserver CA).
	Pool       string `json:"pool,omitempty"`
	PoolListen string `json:"pool-listen,omitempty"`
	PoolCA     string `json:"pool-ca,omitempty"`
	// PoolResources are the pool-scope resources the leader shares:
	// resource.group/version, or resource/version for the core group.
	PoolResources []string `json:"pool-resources,omitempty"`
	// The pool election's timings (poolstore/elect.Elector; the defaults are
	// client-go leader election's).
	PoolLeaseDuration metav1.Duration `json:"pool-lease-duration"`
	PoolRenewDeadline metav1.Duration `json:"pool-renew-deadline"`
	PoolRetryPeriod   metav1.Duration `json:"pool-retry-period"`

	// PodAPIListen is the pod listener (TLS with PodAPICert and
	// PodAPIKey; empty: off): pods of this node reach kube-apiserver
	// through it with their own tokens, and the kubelet sees
	// default/kubernetes at PodAPIAddress (default: the certificate's IP
	// addresses, the first of each family) and its port.
	PodAPIListen  string   `json:"pod-api-listen,omitempty"`
	PodAPICert    string   `json:"pod-api-cert,omitempty"`
	PodAPIKey     string   `json:"pod-api-key,omitempty"`
	PodAPIAddress []string `json:"pod-api-address,omitempty"`

	// CacheComponents are the node components (first word of the
	// User-Agent) whose reads are cached and served offline.
	CacheComponents []string `json:"cache-components,omitempty"`
	// TopologyComponents are the node components whose EndpointSlices
	// and Endpoints are filtered by the Services' openyurt.io/topologyKeys
	// (empty: no filtering).
	TopologyComponents []string `json:"topology-components,omitempty"`
	// Health checks of the apiservers: every HealthCheckInterval, each
	// with HealthCheckTimeout; UnhealthyThreshold failures in a row make
	// a server unhealthy, HealthyThreshold successes healthy again.
	HealthCheckInterval metav1.Duration `json:"health-check-interval"`
	HealthCheckTimeout  metav1.Duration `json:"health-check-timeout"`
	UnhealthyThreshold  int             `json:"unhealthy-threshold"`
	HealthyThreshold    int             `json:"healthy-threshold"`

	// CertCheckInterval is how often --cert and --key are checked for a
	// rotation (kubelet rotates its client certificate in place).
	CertCheckInterval metav1.Duration `json:"cert-check-interval"`

	LogLevel  string `json:"log-level,omitempty"`
	LogFormat string `json:"log-format,omitempty"`

	// MemoryLimit is the Go runtime's soft memory limit, a quantity such as
	// "24Mi"; "0" removes it. GOMEMLIMIT in the environment wins.
	MemoryLimit string `json:"memory-limit,omitempty"`

	// Logger is where Run logs; nil means slog.Default().
	Logger *slog.Logger `json:"-"`
}

// Defaults of the settings that have one (docs/design.md, "Ports and
// names").
const (
	DefaultAPIServerListen = "127.0.0.1:10261"
	DefaultAdminListen     = "127.0.0.1:10267"
	DefaultPoolListen      = ":10269"
	DefaultDataDir         = "/var/lib/tether"
	// DefaultMemoryLimit bounds the heap's growth in bursts (a node's
	// cache keeps a few MB live; without a limit a burst may grow the
	// heap to twice what is live); see cli.ApplyMemoryLimit. Lower limits
	// cost CPU in bursts: 16Mi cut the offline lists served per second
	// to a third (BenchmarkAPIServerProxy).
	DefaultMemoryLimit = "64Mi"
	// DefaultCacheMaxSize is cache.DefaultMaxSize as a quantity.
	DefaultCacheMaxSize = "256Mi"
	// minCacheMaxSize leaves the cached objects room beside a full
	// queue of status writes (cache.DefaultMaxQueuedBytes).
	minCacheMaxSize   = 2 * cache.DefaultMaxQueuedBytes
	DefaultMaxStreams = 1024
	// DefaultServiceListen is the service listener's (edgeservice).
	DefaultServiceListen = edgeservice.DefaultListen
)

// DefaultConfig is the configuration before the file and the flags.
func DefaultConfig() Config {
	return Config{
		AllowPorts:        Ports{10250, 10255},
		AllowPodPorts:     edgetunnel.DefaultPodPorts.String(),
		MaxStreams:        DefaultMaxStreams,
		ServiceListen:     DefaultServiceListen,
		MaxServiceStreams: edgetunnel.DefaultMaxServiceStreams,
		APIServerListen:   DefaultAPIServerListen,
		AdminListen:       DefaultAdminListen,
		PoolListen:        DefaultPoolListen,
		DataDir:           DefaultDataDir,
		CacheMaxSize:      DefaultCacheMaxSize,

		PoolResources:     []string{"endpointslices.discovery.k8s.io/v1", "endpoints/v1", "services/v1"},
		PoolLeaseDuration: metav1.Duration{Duration: 15 * time.Second},
		PoolRenewDeadline: metav1.Duration{Duration: 10 * time.Second},
		PoolRetryPeriod:   metav1.Duration{Duration: 2 * time.Second},

		CacheComponents:     slices.Clone(apiproxy.DefaultComponents),
		TopologyComponents:  slices.Clone(apiproxy.DefaultTopologyComponents),
		HealthCheckInterval: metav1.Duration{Duration: upstream.DefaultHealthInterval},
		HealthCheckTimeout:  metav1.Duration{Duration: upstream.DefaultHealthTimeout},
		UnhealthyThreshold:  upstream.DefaultFailureThreshold,
		HealthyThreshold:    upstream.DefaultSuccessThreshold,
		LogLevel:            "info",
		LogFormat:           "text",
		MemoryLimit:         DefaultMemoryLimit,
		CertCheckInterval:   metav1.Duration{Duration: time.Minute},
	}
}

// Validate says what is missing or wrong, in terms of the flags.
func (c Config) Validate() error {
	var errs []error
	if len(c.Gateway) == 0 && !c.proxyConfigured() {
		errs = append(errs, errors.New("nothing to do: give --gateway (the tether-gateway replicas to keep the tunnel to) and/or a way to the cloud kube-apiserver for the apiserver proxy (--kubeconfig, or --server-addr with --cert and --key, or --bootstrap-kubeconfig)"))
	}
	if c.BootstrapKubeconfig != "" {
		errs = append(errs, c.validateBootstrap()...)
	}
	if c.CertCheckInterval.Duration <= 0 {
		errs = append(errs, fmt.Errorf("--cert-check-interval %v: must be positive", c.CertCheckInterval.Duration))
	}
	if _, err := cli.ParseMemoryLimit(c.MemoryLimit); err != nil {
		errs = append(errs, fmt.Errorf("--memory-limit: %w", err))
	}
	if len(c.Gateway) > 0 {
		if _, err := edgetunnel.ParseTargets(c.Gateway); err != nil {
			errs = append(errs, fmt.Errorf("--gateway: %w", err))
		}
		if c.BootstrapKubeconfig == "" && (c.Cert == "" || c.Key == "") {
			errs = append(errs, errors.New("--gateway needs the node's client certificate: give --cert and --key (the kubelet's /var/lib/kubelet/pki/kubelet-client-current.pem holds both; give it to both)"))
		}
	}
	if c.proxyConfigured() {
		errs = append(errs, c.validateProxy()...)
	}
	if len(c.AllowPorts) == 0 {
		errs = append(errs, errors.New("--allow-ports is empty: the tunnel could reach nothing"))
	}
	if _, err := edgetunnel.ParsePodPorts(c.AllowPodPorts); err != nil {
		errs = append(errs, fmt.Errorf("--allow-pod-ports: %w", err))
	}
	if c.MaxStreams < 0 {
		errs = append(errs, errors.New("--max-streams must not be negative"))
	}
	if c.EdgeServices {
		errs = append(errs, c.validateEdgeServices()...)
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			errs = append(errs, fmt.Errorf("--admin-listen: %w", err))
		}
	}
	return errors.Join(errs...)
}

// proxyConfigured reports whether the apiserver proxy has a way to the
// cloud.
func (c Config) proxyConfigured() bool {
	return c.Kubeconfig != "" || len(c.ServerAddr) > 0 || c.BootstrapKubeconfig != ""
}

// validateProxy checks the settings of the apiserver proxy.
func (c Config) validateProxy() []error {
	var errs []error
	if c.Kubeconfig == "" && c.BootstrapKubeconfig == "" && (c.Cert == "" || c.Key == "") {
		errs = append(errs, errors.New("--server-addr needs the node's client certificate: give --cert and --key (or a --kubeconfig)"))
	}
	for _, s := range c.ServerAddr {
		if u, err := url.Parse(s); err != nil || u.Scheme != "https" || u.Host == "" {
			errs = append(errs, fmt.Errorf("--server-addr %q: want https://host:port", s))
		}
	}
	if _, _, err := net.SplitHostPort(c.APIServerListen); err != nil {
		errs = append(errs, fmt.Errorf("--apiserver-listen: %w", err))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is empty: the apiserver proxy keeps its cache there"))
	}
	if _, err := c.cacheMaxSize(); err != nil {
		errs = append(errs, err)
	}
	if c.HealthCheckInterval.Duration <= 0 || c.HealthCheckTimeout.Duration <= 0 {
		errs = append(errs, errors.New("--health-check-interval and --health-check-timeout must be positive"))
	}
	if c.UnhealthyThreshold < 1 || c.HealthyThreshold < 1 {
		errs = append(errs, errors.New("--unhealthy-threshold and --healthy-threshold must be at least 1"))
	}
	if c.PoolListen != "" {
		errs = append(errs, c.validatePool()...)
	}
	if c.PodAPIListen != "" {
		errs = append(errs, c.validatePodAPI()...)
	}
	return errs
}

// validatePodAPI checks the pod listener's settings.
func (c Config) validatePodAPI() []error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.PodAPIListen); err != nil {
		errs = append(errs, fmt.Errorf("--pod-api-listen: %w", err))
	}
	if c.PodAPICert == "" || c.PodAPIKey == "" {
		errs = append(errs, errors.New("--pod-api-listen needs --pod-api-cert and --pod-api-key: a serving certificate for the node's addresses, signed by a CA the pods' ca.crt trusts"))
	}
	for _, a := range c.PodAPIAddress {
		if net.ParseIP(a) == nil {
			errs = append(errs, fmt.Errorf("--pod-api-address %q: want an IP address", a))
		}
	}
	return errs
}

// validateEdgeServices checks the settings that go with --edge-services.
func (c Config) validateEdgeServices() []error {
	var errs []error
	if len(c.Gateway) == 0 || !c.proxyConfigured() {
		errs = append(errs, errors.New("--edge-services needs --gateway (the streams go to the gateways) and the apiserver proxy (--kubeconfig, --server-addr or --bootstrap-kubeconfig: the marked Services and the node's pod ranges are read through it)"))
	}
	if host, port, err := net.SplitHostPort(c.ServiceListen); err != nil || port == "0" || port == "" {
		errs = append(errs, fmt.Errorf("--service-listen %q: want :port (the host's rules send pods' connections to the node's address and to loopback at that port)", c.ServiceListen))
	} else if host != "" {
		errs = append(errs, fmt.Errorf("--service-listen %q: listen on the wildcard address (:%s): the host's rules send pods' connections to the node's address and the node's own to loopback", c.ServiceListen, port))
	}
	if c.MaxServiceStreams < 1 || c.MaxServiceStreams > 4096 {
		errs = append(errs, fmt.Errorf("--max-service-streams %d: want 1 to 4096", c.MaxServiceStreams))
	}
	return errs
}

// validateBootstrap checks the settings that go with
// --bootstrap-kubeconfig.
func (c Config) validateBootstrap() []error {
	var errs []error
	if c.Cert != "" || c.Key != "" {
		errs = append(errs, errors.New("--bootstrap-kubeconfig and --cert/--key are mutually exclusive: with --bootstrap-kubeconfig tether-edge obtains the node's client certificate itself (kept in --data-dir); drop --cert and --key, or drop --bootstrap-kubeconfig to use the certificate in those files"))
	}
	if c.Kubeconfig != "" {
		errs = append(errs, errors.New("--bootstrap-kubeconfig and --kubeconfig are mutually exclusive: with --bootstrap-kubeconfig the apiserver proxy reaches the bootstrap kubeconfig's server (or --server-addr, verified with --server-ca) with the certificate it obtained"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("--bootstrap-kubeconfig needs --node-name: the certificate is requested for system:node:<node-name>"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is empty: the certificate obtained with --bootstrap-kubeconfig is kept there"))
	}
	return errs
}

// validatePool checks the node pool's settings.
func (c Config) validatePool() []error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.PoolListen); err != nil {
		errs = append(errs, fmt.Errorf("--pool-listen: %w", err))
	}
	if _, err := feed.ParseResources(c.PoolResources); err != nil {
		errs = append(errs, err)
	}
	if l, d, r := c.PoolLeaseDuration.Duration, c.PoolRenewDeadline.Duration, c.PoolRetryPeriod.Duration; r <= 0 || d <= r || l <= d {
		errs = append(errs, fmt.Errorf("pool election: want --pool-lease-duration (%v) > --pool-renew-deadline (%v) > --pool-retry-period (%v) > 0", l, d, r))
	}
	return errs
}

// cacheMaxSize is --cache-max-size in bytes (0: no bound).
func (c Config) cacheMaxSize() (int64, error) {
	if c.CacheMaxSize == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(c.CacheMaxSize)
	if err != nil {
		return 0, fmt.Errorf("--cache-max-size %q: want a quantity such as 256Mi or 1Gi (0: no bound)", c.CacheMaxSize)
	}
	n, ok := q.AsInt64()
	if !ok || n < 0 {
		return 0, fmt.Errorf("--cache-max-size %q: want a whole number of bytes, at least 0", c.CacheMaxSize)
	}
	if n > 0 && n < minCacheMaxSize {
		return 0, fmt.Errorf("--cache-max-size %q: at least %dMi, so that a full queue of status writes (%dMi) leaves room for the cache", c.CacheMaxSize, minCacheMaxSize>>20, cache.DefaultMaxQueuedBytes>>20)
	}
	return n, nil
}

// Ports is a list of TCP ports (flag: "10250,10255"; YAML: a list or that string).
type Ports = config.Ports
