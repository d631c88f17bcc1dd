// Package gateway is tether-gateway: it wires the node watcher, the edge
// registry, the QUIC tunnel server (with the delegated-heartbeat and
// election handlers), the transparent proxy, DNAT, DNS, the cloud-side
// controllers and the admin HTTP server into one process. See README.md
// for the data flow.
//
// New binds every listener, so that a port in use or a bad certificate
// fails before anything runs, and builds the gateway's parts (parts.go);
// Run runs them in a component.Group until its context ends or one fails.
// The shutdown order is the group's (see New): the shutdown is logged;
// then every part but the admin server is told to stop at once, as the
// proxy's connections end only when the tunnel server, after draining
// streams for --shutdown-grace, closes the tunnels with
// tunnel.CloseShutdown (DNAT removes its rules meanwhile with
// --cleanup-on-exit); the admin server stops last, so that /metrics and
// /readyz (503, shutting down) answer during the drain.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/tether-edge/tether/gateway/autonomy"
	"github.com/tether-edge/tether/gateway/dnat"
	"github.com/tether-edge/tether/gateway/dns"
	"github.com/tether-edge/tether/gateway/edgeservices"
	"github.com/tether-edge/tether/gateway/election"
	"github.com/tether-edge/tether/gateway/heartbeat"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/gateway/poolfeed"
	"github.com/tether-edge/tether/gateway/pooltaint"
	"github.com/tether-edge/tether/gateway/proxy"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/gateway/sources"
	"github.com/tether-edge/tether/gateway/topology"
	"github.com/tether-edge/tether/gateway/tunnelserver"
	"github.com/tether-edge/tether/internal/admin"
	"github.com/tether-edge/tether/internal/component"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/internal/retired"
	"github.com/tether-edge/tether/internal/version"
	"github.com/tether-edge/tether/netrules"
	"github.com/tether-edge/tether/netrules/vip"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/tunnel"
)

// Gateway is a tether-gateway with its listeners bound.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	replica string
	started time.Time
	parts   component.Group // see New for the order

	metrics  *prometheus.Registry
	certs    *tlsSource
	watcher  *nodewatch.Watcher
	registry *registry.Registry
	tunnels  *tunnelserver.Server
	proxy    *proxy.Proxy
	sources  *sources.Filter // the clients the proxy and the admin endpoints accept
	proxyLn  net.Listener
	adminLn  net.Listener // nil when --admin-listen is empty
	acmeLn   net.Listener // ACME HTTP-01 challenges; nil unless ACME mode

	dnat  *dnat.Reconciler // nil with --netrules=none
	dns   *dns.Server      // nil when --dns-listen is empty
	dnsPC net.PacketConn
	dnsLn net.Listener

	heartbeats *heartbeat.Handler
	elections  *election.Handler
	records    *poolcheck.RecordCache    // election records, for both handlers
	poolFeed   *poolfeed.Feed            // nil with --pool-feed=false
	poolFeeds  *poolfeed.Handler         // nil with --pool-feed=false
	services   *edgeservices.Handler     // nil with --edge-services=false
	nodeLeases cache.SharedIndexInformer // kube-node-lease, for heartbeats and poolTaint
	poolTaint  *pooltaint.Controller     // nil with --delegated-heartbeat-taint=false
	autonomy   *autonomy.Controller      // nil with --node-autonomy=false
	retired    *retired.Watcher          // the retired node identities
}

// Run is New followed by Run.
func Run(ctx context.Context, cfg Config) error {
	g, err := New(cfg)
	if err != nil {
		return err
	}
	return g.Run(ctx)
}

// New checks cfg, loads the certificates, builds the Kubernetes client and
// binds the tunnel, proxy and admin listeners. If it fails, nothing is left
// open.
//
// The parts (parts.go) run in g.parts, which starts them in this order
// and stops them in the reverse one, the shutdown order of the package
// doc:
//  1. the admin server, which stops last, so that /metrics and /readyz
//     answer while the others stop;
//  2. the rest, in one stage that stops together (AddTogether), listed in
//     the order New makes them: the ACME challenge server, the certificate
//     renewal, the informers and controllers, the tunnel server, the
//     proxy, DNAT, DNS and the hosts ConfigMap. The proxy's connections
//     end only when the tunnel server closes the tunnels after
//     --shutdown-grace, so neither may stop before the other starts to;
//     DNAT removes its rules (--cleanup-on-exit) as the drain begins;
//  3. the shutdown log line, which stops first.
func New(cfg Config) (_ *Gateway, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if b, err := json.Marshal(cfg); err == nil {
		log.Debug("effective configuration", "config", string(b))
	}
	g := &Gateway{cfg: cfg, log: log, replica: cfg.Replica, started: time.Now(), metrics: admin.NewRegistry()}
	g.parts.Logger = log
	if g.replica == "" {
		if g.replica, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("replica name: %w", err)
		}
	}
	// The parts that stop together, as they are made; what they opened is
	// closed again if New fails.
	var parts []component.Component
	add := func(ps []component.Component, err error) error {
		parts = append(parts, ps...)
		return err
	}
	defer func() {
		if err != nil {
			g.parts.AddTogether(parts...)
			g.parts.Close()
		}
	}()

	// The certificates are checked before the Kubernetes client is made,
	// unless ACME keeps its state in a Secret.
	var client kubernetes.Interface
	if _, _, secret, _ := cfg.ACMESecret(); cfg.ACME() && secret {
		if client, err = kubeClient(cfg); err != nil {
			return nil, err
		}
	}
	if err := add(g.listenACME()); err != nil {
		return nil, err
	}
	resetKey, err := g.loadCerts(client)
	if err != nil {
		return nil, err
	}
	parts = append(parts, g.certParts()...)
	if client == nil {
		if client, err = kubeClient(cfg); err != nil {
			return nil, err
		}
	}
	if err := add(g.newWatcher(client)); err != nil {
		return nil, err
	}
	if err := add(g.newPoolHandlers(client)); err != nil {
		return nil, err
	}
	if err := add(g.newPoolFeed()); err != nil {
		return nil, err
	}
	if err := add(g.newAutonomy(client)); err != nil {
		return nil, err
	}
	if err := add(g.newEdgeServices(client)); err != nil {
		return nil, err
	}
	g.retired = retired.NewWatcher(client, 10*time.Minute, g.log.With("part", "retired-nodes"))
	parts = append(parts, g.retiredPart())
	if err := add(g.newTunnels(resetKey)); err != nil {
		return nil, err
	}
	if err := add(g.newProxy()); err != nil {
		return nil, err
	}
	if err := add(g.newDNAT(client)); err != nil {
		return nil, err
	}
	if err := add(g.newDNS(client)); err != nil {
		return nil, err
	}
	if cfg.AdminListen != "" {
		ln, err := g.listenRetrying("admin", cfg.AdminListen, "admin listener")
		if err != nil {
			return nil, err
		}
		g.adminLn = g.sources.Listen(ln, "admin")
		g.parts.Add(g.adminPart())
	}
	g.parts.AddTogether(parts...)
	g.parts.Add(g.shutdownLog())
	return g, nil
}

// listenACME binds the ACME HTTP-01 challenge listener, in ACME mode.
func (g *Gateway) listenACME() ([]component.Component, error) {
	if !g.cfg.ACME() {
		return nil, nil
	}
	ln, err := g.listenRetrying("acme_http", g.cfg.ACMEHTTPListen, "ACME HTTP-01 challenge listener (--acme-http-listen)")
	if err != nil {
		return nil, err
	}
	g.acmeLn = ln
	return []component.Component{g.acmeHTTPPart()}, nil
}

// loadCerts loads the certificates (loadTLS; client is nil unless ACME
// keeps its state in a Secret), registers their metrics and returns the
// QUIC stateless reset key.
func (g *Gateway) loadCerts(client kubernetes.Interface) (*quic.StatelessResetKey, error) {
	var err error
	if g.certs, err = loadTLS(g.cfg, g.log, client, g.acmeLn); err != nil {
		return nil, err
	}
	if err := promreg.Register(g.metrics, g.certs); err != nil {
		return nil, fmt.Errorf("register certificate metrics: %w", err)
	}
	// With --tls-cert, after the serving key was rotated, the next restart
	// cannot reset the connections of this process (they end by the idle
	// timeout instead); later restarts can again. In ACME mode the key is
	// read from (or made once in) the ACME storage.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return g.certs.resetKey(ctx)
}

// newWatcher makes the node watcher and, with --enable-update-trigger,
// the topology update trigger.
func (g *Gateway) newWatcher(client kubernetes.Interface) ([]component.Component, error) {
	sel, err := labels.Parse(g.cfg.EdgeSelector)
	if err != nil {
		return nil, fmt.Errorf("--edge-selector: %w", err)
	}
	podPolicy, err := g.cfg.podPolicy()
	if err != nil {
		return nil, err
	}
	g.watcher = nodewatch.New(client, nodewatch.Options{EdgeSelector: sel, Logger: g.log, ResyncPeriod: 10 * time.Minute,
		Policy: g.cfg.routePolicy(), PodPolicy: podPolicy, GatewayHost: hostAddrs})
	if err := promreg.Register(g.metrics, g.watcher); err != nil {
		return nil, fmt.Errorf("register node watcher metrics: %w", err)
	}
	ps := []component.Component{g.watcherPart()}
	if g.cfg.EnableUpdateTrigger {
		trigger := topology.New(client, topology.Options{Logger: g.log.With("part", "update-trigger")})
		ps = append(ps, part{N: "update-trigger", RunF: trigger.Run})
	}
	return ps, nil
}

// newPoolHandlers makes the handlers of the node pools' delegated
// heartbeats and election records, which the tunnel server serves, the
// informers they read and the taint controller.
func (g *Gateway) newPoolHandlers(client kubernetes.Interface) (_ []component.Component, err error) {
	log := g.log
	// The pools' election records, read from an informer by both
	// handlers' leader checks.
	g.records = poolcheck.NewRecordCache(client, 10*time.Minute, log.With("part", "election-records"))
	// The node Leases (without managedFields), read by the heartbeat
	// handler (a renewal is one write, no GET) and the taint controller.
	if g.nodeLeases, err = pooltaint.NewLeaseInformer(client); err != nil {
		return nil, err
	}
	ps := []component.Component{
		part{N: "election-records", RunF: g.records.Run, ReadyF: g.records.Ready},
		part{N: "node-leases", RunF: func(ctx context.Context) error { g.nodeLeases.RunWithContext(ctx); return nil }},
	}
	// Delegated heartbeats are always served: only a pool's leader may
	// send them, and only for its pool's members. Their writes have a
	// budget of their own (--kube-api-qps, --kube-api-burst), so that the
	// taints their renewals cause, which come in a burst right after
	// them, cannot starve them; a renewal that would wait past a second
	// for a token fails at once.
	hbClient, err := kubeClientWithLimiter(g.cfg, flowcontrol.NewFakeAlwaysRateLimiter())
	if err != nil {
		return nil, err
	}
	g.heartbeats, err = heartbeat.New(heartbeat.Options{
		Client:     hbClient,
		Leases:     g.nodeLeases,
		Requests:   rate.NewLimiter(rate.Limit(g.cfg.KubeAPIQPS), g.cfg.KubeAPIBurst),
		Nodes:      watcherPools{g.watcher},
		Records:    g.records,
		MaxLease:   g.cfg.PoolLeaseDuration.Duration,
		Logger:     log.With("part", "delegated-heartbeats"),
		Registerer: g.metrics,
	})
	if err != nil {
		return nil, err
	}
	// The pools' election records are written for the edges, which may
	// only read them: a node's only if it is in the pool and the record
	// names it.
	g.elections, err = election.New(election.Options{
		Client:     client,
		Nodes:      watcherPools{g.watcher},
		Records:    g.records,
		MaxLease:   g.cfg.PoolLeaseDuration.Duration,
		Logger:     log.With("part", "election-records"),
		Registerer: g.metrics,
	})
	if err != nil {
		return nil, err
	}
	if g.cfg.DelegatedHeartbeatTaint {
		g.poolTaint, err = pooltaint.New(client, pooltaint.Options{
			Leases:     g.nodeLeases,
			Threshold:  g.cfg.DelegatedHeartbeatTaintRenewals,
			Logger:     log.With("part", "delegated-heartbeat-taint"),
			Registerer: g.metrics,
		})
		if err != nil {
			return nil, err
		}
		ps = append(ps, part{N: "delegated-heartbeat-taint", RunF: g.poolTaint.Run})
	}
	return ps, nil
}

// newPoolFeed makes the pools' signed feed, with --pool-feed: it reads
// --pool-resources in protobuf (a dynamic client for the others) and
// signs with the certificate the tunnel listener serves.
func (g *Gateway) newPoolFeed() ([]component.Component, error) {
	if !g.cfg.PoolFeed {
		return nil, nil
	}
	resources, err := feed.ParseResources(g.cfg.PoolResources) // checked by Validate
	if err != nil {
		return nil, err
	}
	rc, err := restConfig(g.cfg)
	if err != nil {
		return nil, err
	}
	kc, err := kube.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	if g.poolFeed, err = poolfeed.New(poolfeed.Options{
		Client:     kc,
		Dynamic:    dyn,
		Resources:  resources,
		Name:       g.replica,
		Signer:     g.certs.feedSigner,
		Logger:     g.log.With("part", "pool-feed"),
		Registerer: g.metrics,
	}); err != nil {
		return nil, err
	}
	g.poolFeeds = poolfeed.NewHandler(g.poolFeed, poolfeed.HandlerOptions{
		Check:  poolcheck.Checker{Nodes: watcherPools{g.watcher}, Records: g.records, MaxLease: g.cfg.PoolLeaseDuration.Duration},
		Logger: g.log.With("part", "pool-feed"),
	})
	return []component.Component{part{N: "pool-feed", RunF: g.poolFeed.Run}}, nil
}

// newAutonomy makes the autonomy controller, with --node-autonomy: the
// pods of autonomous edge nodes tolerate the node's loss of the cloud.
func (g *Gateway) newAutonomy(client kubernetes.Interface) ([]component.Component, error) {
	if !g.cfg.NodeAutonomy {
		return nil, nil
	}
	sel, err := labels.Parse(g.cfg.EdgeSelector)
	if err != nil {
		return nil, fmt.Errorf("--edge-selector: %w", err)
	}
	if g.autonomy, err = autonomy.New(client, autonomy.Options{
		EdgeSelector: sel,
		Logger:       g.log.With("part", "autonomy"),
		Registerer:   g.metrics,
		// Half the client's budget at most, so that a mass change (or a
		// node toggling its own annotation) leaves the rest to taints,
		// VIPs and election records.
		Limiter: rate.NewLimiter(rate.Limit(g.cfg.KubeAPIQPS/2), max(g.cfg.KubeAPIBurst/2, 1)),
	}); err != nil {
		return nil, err
	}
	return []component.Component{part{N: "autonomy", RunF: g.autonomy.Run}}, nil
}

// newEdgeServices makes the handler of the edge pods' connections to
// marked cloud Services, with --edge-services.
func (g *Gateway) newEdgeServices(client kubernetes.Interface) ([]component.Component, error) {
	if !g.cfg.EdgeServices {
		return nil, nil
	}
	denied, _ := g.cfg.edgeCIDRs()
	extra, err := sources.ParsePrefixes("edge-service-cidrs", g.cfg.EdgeServiceCIDRs)
	if err != nil {
		return nil, err
	}
	g.services, err = edgeservices.New(edgeservices.Options{
		Client: client, Snapshot: g.watcher.Snapshot, Mode: nodewatch.Mode(g.cfg.Mode),
		Local: sources.LocalAddrs, Denied: denied, Extra: extra,
		MaxPerEdge: g.cfg.MaxServiceStreamsPerEdge, PerSecond: g.cfg.ServiceStreamsPerSecond,
		Logger: g.log.With("part", "edge-services"), Registerer: g.metrics,
	})
	if err != nil {
		return nil, err
	}
	return []component.Component{part{N: "edge-services", RunF: g.services.Run,
		ReadyF: func() error {
			if !g.services.HasSynced() {
				return errors.New("edge services: Services and EndpointSlices not listed yet")
			}
			return nil
		}}}, nil
}

// newTunnels makes the edge registry and binds the tunnel server.
func (g *Gateway) newTunnels(resetKey *quic.StatelessResetKey) (_ []component.Component, err error) {
	cfg := g.cfg
	g.registry = registry.New(registry.Options{MaxStreams: cfg.MaxStreamsPerEdge, Logger: g.log})
	if err := promreg.Register(g.metrics, g.registry, g.edgesWithoutTunnelGauge()); err != nil {
		return nil, fmt.Errorf("register edge metrics: %w", err)
	}
	var feeds tunnelserver.PoolFeeds // no typed nil
	if g.poolFeeds != nil {
		feeds = g.poolFeeds
	}
	var services tunnelserver.Services
	if g.services != nil {
		services = g.services
	}
	g.tunnels, err = tunnelserver.Listen(cfg.TunnelListen, g.registry, tunnelserver.Options{
		GetCertificate:    g.certs.getCertificate,
		StatelessResetKey: resetKey,
		GetClientCAs:      g.certs.clientCAs.Pool,
		Limits:            tunnel.Limits{IdleTimeout: cfg.IdleTimeout.Duration, ReceiveBudget: cfg.receiveBudget()},
		UDPBuffer:         int(cfg.UDPBuffer.Value()),
		MaxHandshakes:     cfg.MaxHandshakes,
		ShutdownGrace:     cfg.ShutdownGrace.Duration,
		Logger:            g.log,
		Registerer:        g.metrics,
		Heartbeats:        g.heartbeats,
		Elections:         g.elections,
		PoolFeeds:         feeds,
		Services:          services,
		ServiceStreams:    cfg.MaxServiceStreamsPerEdge,
		StreamIdle:        cfg.StreamIdleTimeout.Duration,
		Retired:           g.retired,
	})
	if err != nil {
		return nil, err
	}
	g.retired.OnChange(g.tunnels.CloseRetired)
	return []component.Component{g.tunnelPart()}, nil
}

// newProxy makes the transparent proxy and binds --proxy-port.
func (g *Gateway) newProxy() (_ []component.Component, err error) {
	if g.sources, err = g.newSources(); err != nil {
		return nil, err
	}
	g.proxy, err = proxy.New(g.registry, proxy.Options{
		Sources:     g.sources,
		Mode:        nodewatch.Mode(g.cfg.Mode),
		Zones:       g.cfg.DNSZones,
		IdleTimeout: g.cfg.StreamIdleTimeout.Duration,
		Logger:      g.log,
		Registerer:  g.metrics,
	})
	if err != nil {
		return nil, err
	}
	// ":port" listens on every address, IPv6 and IPv4 (v4-mapped), which is
	// what DNAT to the local machine needs.
	if g.proxyLn, err = net.Listen("tcp", ":"+strconv.Itoa(g.cfg.ProxyPort)); err != nil {
		return nil, fmt.Errorf("transparent listener: %w", err)
	}
	g.watcher.Subscribe(g.proxy.Update)
	return []component.Component{g.proxyPart()}, nil
}

// TunnelAddr, ProxyAddr and AdminAddr are the bound listener addresses
// (useful with port 0). AdminAddr is nil when the admin server is disabled.
func (g *Gateway) TunnelAddr() net.Addr { return g.tunnels.Addr() }
func (g *Gateway) ProxyAddr() net.Addr  { return g.proxyLn.Addr() }
func (g *Gateway) AdminAddr() net.Addr {
	if g.adminLn == nil {
		return nil
	}
	return g.adminLn.Addr()
}

// ACMEAddr is the bound ACME HTTP-01 challenge listener, nil unless in
// ACME mode.
func (g *Gateway) ACMEAddr() net.Addr {
	if g.acmeLn == nil {
		return nil
	}
	return g.acmeLn.Addr()
}

// Metrics is the Prometheus registry /metrics serves; more parts may
// register with it before Run.
func (g *Gateway) Metrics() *prometheus.Registry { return g.metrics }

// Watcher is the node watcher; more consumers may Subscribe before Run.
func (g *Gateway) Watcher() *nodewatch.Watcher { return g.watcher }

// Run runs the gateway's parts until ctx ends, then shuts down gracefully
// (see the package doc). It returns the first error of any part, which
// also stops the others. Run may be called once.
func (g *Gateway) Run(ctx context.Context) error {
	g.log.Info("tether-gateway starting", "version", version.Version, "replica", g.replica,
		"tunnel", g.tunnels.Addr().String(), "proxy", g.proxyLn.Addr().String(), "mode", g.cfg.Mode)
	if err := g.parts.Run(ctx); err != nil {
		g.log.Error("tether-gateway stopped", "err", err)
		return err
	}
	g.log.Info("tether-gateway stopped")
	return nil
}

// Ready reports why the gateway cannot serve yet, or nil: it must be
// running and not shutting down, and every part that may not be ready
// ready (parts.go: the node and election record informers synced, the
// DNAT rules applied, an ACME certificate obtained). It names the parts
// that are not.
func (g *Gateway) Ready() error { return g.parts.Ready() }

// newDNAT sets up the DNAT reconciler for --netrules (and, in vip mode,
// the VIP assigner); none leaves g.dnat nil.
func (g *Gateway) newDNAT(client kubernetes.Interface) (_ []component.Component, err error) {
	cfg := g.cfg
	if cfg.NetRules == netrules.KindNone {
		g.log.Info("DNAT disabled (--netrules=none): traffic must reach --proxy-port some other way")
		return nil, nil
	}
	rules, err := netrules.New(cfg.NetRules, netrules.Options{Logger: g.log})
	if err != nil {
		return nil, fmt.Errorf("--netrules %s: %w", cfg.NetRules, err)
	}
	o := dnat.Options{
		Rules:         rules,
		Mode:          nodewatch.Mode(cfg.Mode),
		Ports:         cfg.EdgePorts,
		ProxyPort:     uint16(g.proxyLn.Addr().(*net.TCPAddr).Port),
		Resync:        cfg.ResyncPeriod.Duration,
		CleanupOnExit: cfg.CleanupOnExit,
		Logger:        g.log,
		Registerer:    g.metrics,
	}
	if o.Mode == nodewatch.ModeVIP {
		cidr, _ := netip.ParsePrefix(cfg.VIPCIDR) // checked by Validate
		o.VIPs = &dnat.VIPs{CIDR: cidr, Link: vip.Link{}, Patcher: dnat.APIPatcher{Client: client}, Logger: g.log}
	}
	if g.dnat, err = dnat.New(o); err != nil {
		return nil, err
	}
	g.watcher.Subscribe(g.dnat.Update)
	return []component.Component{g.dnatPart()}, nil
}

// newDNS binds the DNS server's sockets (UDP and TCP on one port), with
// --dns-listen, and makes the writer of the hosts ConfigMap, with
// --hosts-configmap: both serve the node names.
func (g *Gateway) newDNS(client kubernetes.Interface) ([]component.Component, error) {
	cfg := g.cfg
	var ps []component.Component
	if cfg.DNSListen != "" {
		pc, ln, err := dns.Listen(context.Background(), cfg.DNSListen)
		if err != nil {
			return nil, err
		}
		g.dnsPC, g.dnsLn = pc, ln
		if g.dns, err = dns.New(dns.Options{
			Zones:      cfg.DNSZones,
			TTL:        cfg.DNSTTL.Duration,
			Mode:       nodewatch.Mode(cfg.Mode),
			CloudNodes: cfg.DNSCloudNodes,
			Logger:     g.log,
			Registerer: g.metrics,
		}); err != nil {
			return nil, err
		}
		g.watcher.Subscribe(g.dns.Update)
		ps = append(ps, g.dnsPart())
	}
	if cfg.HostsConfigMap != "" {
		ns, name, _ := dns.ParseConfigMapRef(cfg.HostsConfigMap) // checked by Validate
		hosts := dns.NewHostsWriter(client, dns.HostsOptions{Namespace: ns, Name: name, Mode: nodewatch.Mode(cfg.Mode), CloudNodes: cfg.DNSCloudNodes, Logger: g.log})
		g.watcher.Subscribe(hosts.Update)
		ps = append(ps, part{N: "hosts-configmap", RunF: hosts.Run})
	}
	return ps, nil
}

// DNSAddr is the bound DNS address, nil when DNS is disabled.
func (g *Gateway) DNSAddr() net.Addr {
	if g.dnsPC == nil {
		return nil
	}
	return g.dnsPC.LocalAddr()
}

// watcherPools answers the heartbeat and election handlers' questions
// about pools from the node watcher's snapshot, so that a request costs no
// Node GET.
type watcherPools struct{ w *nodewatch.Watcher }

var _ poolcheck.NodePools = watcherPools{}

func (p watcherPools) NodePool(_ context.Context, node string) (string, bool, error) {
	snap := p.w.Snapshot()
	if snap.Version == 0 {
		return "", false, errors.New("node informer not synced yet")
	}
	n, ok := snap.Lookup(node)
	return n.Pool, ok, nil
}

// hostAddrs returns the addresses of the host's interfaces (in the
// gateway's network namespace): the node watcher never routes one of them
// to an edge.
func hostAddrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("interface addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(ifas))
	for _, ifa := range ifas {
		if n, ok := ifa.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, nil
}

// kubeClient builds a client from the --kubeconfig file, or from the
// in-cluster service account when there is none, rate-limited to
// --kube-api-qps and --kube-api-burst.
func kubeClient(c Config) (kubernetes.Interface, error) { return kubeClientWithLimiter(c, nil) }

// restConfig is the configuration of the gateway's Kubernetes clients:
// --kubeconfig or the in-cluster one, --kube-api-qps and --kube-api-burst.
func restConfig(c Config) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path := c.Kubeconfig; path == "" {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("no --kubeconfig given and not running in a cluster: %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
	}
	cfg.UserAgent = "tether-gateway/" + version.Version
	cfg.QPS, cfg.Burst = float32(c.KubeAPIQPS), c.KubeAPIBurst
	return cfg, nil
}

// kubeClientWithLimiter is kubeClient with limiter instead of
// --kube-api-qps and --kube-api-burst, unless it is nil.
func kubeClientWithLimiter(c Config, limiter flowcontrol.RateLimiter) (kubernetes.Interface, error) {
	cfg, err := restConfig(c)
	if err != nil {
		return nil, err
	}
	cfg.RateLimiter = limiter
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return client, nil
}
