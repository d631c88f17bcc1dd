// Package gateway is tether-gateway: it wires the node watcher, the edge
// registry, the QUIC tunnel server (with the delegated-heartbeat handler),
// the transparent proxy, the cloud-side controllers and the admin HTTP
// server into one process. See README.md for the data flow.
//
// New binds every listener, so that a port in use or a bad certificate
// fails before anything runs; Run runs the parts in an errgroup until its
// context ends, then shuts them down in order: the proxy and the tunnel
// listener stop accepting, open streams drain for --shutdown-grace, the
// tunnels are closed with tunnel.CloseShutdown, and the admin server stops
// last so that /metrics and /readyz answer during the drain.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/tether-edge/tether/gateway/dnat"
	"github.com/tether-edge/tether/gateway/dns"
	"github.com/tether-edge/tether/gateway/election"
	"github.com/tether-edge/tether/gateway/heartbeat"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/gateway/pooltaint"
	"github.com/tether-edge/tether/gateway/proxy"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/gateway/topology"
	"github.com/tether-edge/tether/gateway/tunnelserver"
	"github.com/tether-edge/tether/internal/admin"
	"github.com/tether-edge/tether/internal/version"
	"github.com/tether-edge/tether/netrules"
	"github.com/tether-edge/tether/netrules/vip"
	"github.com/tether-edge/tether/tunnel"
)

// Gateway is a tether-gateway with its listeners bound.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	replica string
	started time.Time

	metrics  *prometheus.Registry
	certs    *tlsSource
	watcher  *nodewatch.Watcher
	registry *registry.Registry
	tunnels  *tunnelserver.Server
	proxy    *proxy.Proxy
	proxyLn  net.Listener
	adminLn  net.Listener // nil when --admin-listen is empty
	acmeLn   net.Listener // ACME HTTP-01 challenges; nil unless ACME mode

	dnat  *dnat.Reconciler // nil with --netrules=none
	dns   *dns.Server      // nil when --dns-listen is empty
	dnsPC net.PacketConn
	dnsLn net.Listener
	hosts *dns.HostsWriter // nil without --hosts-configmap

	updateTrigger *topology.Controller // nil without --enable-update-trigger
	heartbeats    *heartbeat.Handler
	records       *poolcheck.RecordCache    // election records, for both handlers
	nodeLeases    cache.SharedIndexInformer // kube-node-lease, for heartbeats and poolTaint
	poolTaint     *pooltaint.Controller     // nil with --delegated-heartbeat-taint=false

	running  atomic.Bool // Run has started the parts
	synced   atomic.Bool // the node informer has synced
	stopping atomic.Bool // Run's context has ended
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
	if g.replica == "" {
		if g.replica, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("replica name: %w", err)
		}
	}
	var closers []func() error
	defer func() {
		if err != nil {
			for _, c := range closers {
				c()
			}
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
	if cfg.ACME() {
		if g.acmeLn, err = net.Listen("tcp", cfg.ACMEHTTPListen); err != nil {
			return nil, fmt.Errorf("ACME HTTP-01 challenge listener (--acme-http-listen): %w", err)
		}
		closers = append(closers, g.acmeLn.Close)
		if g.acmeLn, err = g.retrying("acme_http", g.acmeLn); err != nil {
			return nil, err
		}
	}
	if g.certs, err = loadTLS(cfg, log, client, g.acmeLn); err != nil {
		return nil, err
	}
	if err := g.metrics.Register(g.certs); err != nil {
		return nil, fmt.Errorf("register certificate metrics: %w", err)
	}
	// With --tls-cert, after the serving key was rotated, the next restart
	// cannot reset the connections of this process (they end by the idle
	// timeout instead); later restarts can again. In ACME mode the key is
	// read from (or made once in) the ACME storage.
	rctx, cancelReset := context.WithTimeout(context.Background(), 30*time.Second)
	resetKey, err := g.certs.resetKey(rctx)
	cancelReset()
	if err != nil {
		return nil, err
	}
	if client == nil {
		if client, err = kubeClient(cfg); err != nil {
			return nil, err
		}
	}
	sel, err := labels.Parse(cfg.EdgeSelector)
	if err != nil {
		return nil, fmt.Errorf("--edge-selector: %w", err)
	}
	g.watcher = nodewatch.New(client, nodewatch.Options{EdgeSelector: sel, Logger: log, ResyncPeriod: 10 * time.Minute,
		Policy: cfg.routePolicy(), GatewayHost: hostAddrs})
	if err := g.metrics.Register(g.watcher); err != nil {
		return nil, fmt.Errorf("register node watcher metrics: %w", err)
	}
	if cfg.EnableUpdateTrigger {
		g.updateTrigger = topology.New(client, topology.Options{Logger: log.With("part", "update-trigger")})
	}

	// The pools' election records, read from an informer by both
	// handlers' leader checks.
	g.records = poolcheck.NewRecordCache(client, 10*time.Minute, log.With("part", "election-records"))
	// The node Leases (without managedFields), read by the heartbeat
	// handler (a renewal is one write, no GET) and the taint controller.
	if g.nodeLeases, err = pooltaint.NewLeaseInformer(client); err != nil {
		return nil, err
	}
	// Delegated heartbeats are always served: only a pool's leader may
	// send them, and only for its pool's members. Their writes have a
	// budget of their own (--kube-api-qps, --kube-api-burst), so that the
	// taints their renewals cause, which come in a burst right after
	// them, cannot starve them; a renewal that would wait past a second
	// for a token fails at once.
	hbClient, err := kubeClientWithLimiter(cfg, flowcontrol.NewFakeAlwaysRateLimiter())
	if err != nil {
		return nil, err
	}
	g.heartbeats, err = heartbeat.New(heartbeat.Options{
		Client:     hbClient,
		Leases:     g.nodeLeases,
		Requests:   rate.NewLimiter(rate.Limit(cfg.KubeAPIQPS), cfg.KubeAPIBurst),
		Nodes:      watcherPools{g.watcher},
		Records:    g.records,
		Logger:     log.With("part", "delegated-heartbeats"),
		Registerer: g.metrics,
	})
	if err != nil {
		return nil, err
	}
	// The pools' election records are written for the edges, which may
	// only read them: a node's only if it is in the pool and the record
	// names it.
	elections, err := election.New(election.Options{
		Client:     client,
		Nodes:      watcherPools{g.watcher},
		Records:    g.records,
		Logger:     log.With("part", "election-records"),
		Registerer: g.metrics,
	})
	if err != nil {
		return nil, err
	}
	if cfg.DelegatedHeartbeatTaint {
		g.poolTaint, err = pooltaint.New(client, pooltaint.Options{
			Leases:     g.nodeLeases,
			Threshold:  cfg.DelegatedHeartbeatTaintRenewals,
			Logger:     log.With("part", "delegated-heartbeat-taint"),
			Registerer: g.metrics,
		})
		if err != nil {
			return nil, err
		}
	}

	g.registry = registry.New(registry.Options{MaxStreams: cfg.MaxStreamsPerEdge, Logger: log})
	if err := g.metrics.Register(g.registry); err != nil {
		return nil, fmt.Errorf("register registry metrics: %w", err)
	}
	if err := g.metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_gateway_edges_without_tunnel",
		Help: "Edge nodes in the cluster with no live tunnel to this gateway replica (0 until the node informer has synced).",
	}, g.edgesWithoutTunnel)); err != nil {
		return nil, fmt.Errorf("register edge metrics: %w", err)
	}
	g.tunnels, err = tunnelserver.Listen(cfg.TunnelListen, g.registry, tunnelserver.Options{
		GetCertificate:    g.certs.getCertificate,
		StatelessResetKey: resetKey,
		GetClientCAs:      g.certs.clientCAs.Pool,
		Limits:            tunnel.Limits{IdleTimeout: cfg.IdleTimeout.Duration, ReceiveBudget: cfg.receiveBudget()},
		UDPBuffer:         int(cfg.UDPBuffer.Value()),
		ShutdownGrace:     cfg.ShutdownGrace.Duration,
		Logger:            log,
		Registerer:        g.metrics,
		Heartbeats:        g.heartbeats,
		Elections:         elections,
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, g.tunnels.Close)

	g.proxy, err = proxy.New(g.registry, proxy.Options{
		Mode:        nodewatch.Mode(cfg.Mode),
		Zones:       cfg.DNSZones,
		IdleTimeout: cfg.StreamIdleTimeout.Duration,
		Logger:      log,
		Registerer:  g.metrics,
	})
	if err != nil {
		return nil, err
	}
	// ":port" listens on every address, IPv6 and IPv4 (v4-mapped), which is
	// what DNAT to the local machine needs.
	g.proxyLn, err = net.Listen("tcp", ":"+strconv.Itoa(cfg.ProxyPort))
	if err != nil {
		return nil, fmt.Errorf("transparent listener: %w", err)
	}
	closers = append(closers, g.proxyLn.Close)

	if err := g.newDNAT(cfg, client); err != nil {
		return nil, err
	}
	if cfg.DNSListen != "" {
		if err := g.newDNS(cfg); err != nil {
			return nil, err
		}
		closers = append(closers, g.dnsPC.Close, g.dnsLn.Close)
	}
	if cfg.HostsConfigMap != "" {
		ns, name, _ := dns.ParseConfigMapRef(cfg.HostsConfigMap) // checked by Validate
		g.hosts = dns.NewHostsWriter(client, dns.HostsOptions{Namespace: ns, Name: name, Mode: nodewatch.Mode(cfg.Mode), CloudNodes: cfg.DNSCloudNodes, Logger: log})
	}

	if cfg.AdminListen != "" {
		g.adminLn, err = net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			return nil, fmt.Errorf("admin listener: %w", err)
		}
		closers = append(closers, g.adminLn.Close)
		if g.adminLn, err = g.retrying("admin", g.adminLn); err != nil {
			return nil, err
		}
	}
	return g, nil
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

// Run runs the gateway until ctx ends, then shuts down gracefully (see the
// package doc). It returns the first error of any part, which also stops
// the others. Run may be called once.
func (g *Gateway) Run(ctx context.Context) error {
	if g.running.Swap(true) {
		return errors.New("gateway: Run called twice")
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g.log.Info("tether-gateway starting", "version", version.Version, "replica", g.replica,
		"tunnel", g.tunnels.Addr().String(), "proxy", g.proxyLn.Addr().String(), "mode", g.cfg.Mode)

	// The admin server outlives the others so that /metrics and /readyz
	// answer while streams drain; it stops the whole gateway if it fails.
	adminDone := make(chan error, 1)
	adminCtx, stopAdmin := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAdmin()
	if g.adminLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/", admin.New(admin.Options{Registry: g.metrics, Ready: g.Ready, Status: func() any { return g.Status() }, Profiling: g.cfg.Profiling, Logger: g.log}))
		mux.HandleFunc("GET /ca.crt", g.certs.serveCA)
		h := http.Handler(mux)
		go func() {
			err := admin.ServeListener(adminCtx, g.adminLn, h)
			if adminCtx.Err() == nil {
				err = fmt.Errorf("admin server stopped: %w", errors.Join(err, http.ErrServerClosed))
				cancel(err)
			}
			adminDone <- err
		}()
	} else {
		adminDone <- nil
	}

	// Consumers of node snapshots.
	g.watcher.Subscribe(g.proxy.Update)
	eg, ectx := errgroup.WithContext(ctx)
	if g.dnat != nil {
		g.watcher.Subscribe(g.dnat.Update)
		eg.Go(func() error { return g.dnat.Run(ectx) })
	}
	if g.dns != nil {
		g.watcher.Subscribe(g.dns.Update)
		eg.Go(func() error { return g.dns.Serve(ectx, g.dnsPC, g.dnsLn) })
	}
	if g.hosts != nil {
		g.watcher.Subscribe(g.hosts.Update)
		eg.Go(func() error { return g.hosts.Run(ectx) })
	}

	if g.certs.ca != nil {
		eg.Go(func() error { return g.certs.ca.Run(ectx) })
	}
	if g.certs.acme != nil {
		eg.Go(func() error { return admin.ServeListener(ectx, g.acmeLn, g.certs.acme.HTTPHandler()) })
		eg.Go(func() error { return g.certs.acme.Run(ectx) })
	}
	if g.updateTrigger != nil {
		eg.Go(func() error { return g.updateTrigger.Run(ectx) })
	}
	if g.poolTaint != nil {
		eg.Go(func() error { return g.poolTaint.Run(ectx) })
	}
	eg.Go(func() error { return g.watcher.Run(ectx) })
	eg.Go(func() error { return g.records.Run(ectx) })
	eg.Go(func() error { g.nodeLeases.RunWithContext(ectx); return nil })
	eg.Go(func() error {
		if err := g.watcher.WaitSynced(ectx); err == nil {
			g.synced.Store(true)
		}
		return nil
	})
	eg.Go(func() error { return g.tunnels.Serve(ectx) })
	eg.Go(func() error { return g.proxy.Serve(ectx, g.proxyLn) })
	eg.Go(func() error {
		<-ectx.Done()
		g.stopping.Store(true)
		g.log.Info("tether-gateway shutting down", "reason", context.Cause(ectx))
		return nil
	})
	err := eg.Wait()
	stopAdmin()
	if aerr := <-adminDone; err == nil {
		err = aerr
	}
	if err != nil {
		g.log.Error("tether-gateway stopped", "err", err)
		return err
	}
	g.log.Info("tether-gateway stopped")
	return nil
}

// Ready reports why the gateway cannot serve yet, or nil: its listeners
// must be running, the node and election record informers synced, and
// shutdown not begun.
func (g *Gateway) Ready() error {
	switch {
	case g.stopping.Load():
		return errors.New("shutting down")
	case !g.running.Load():
		return errors.New("listeners not running")
	case !g.synced.Load():
		return errors.New("node informer not synced")
	case g.records.Ready() != nil:
		return g.records.Ready()
	case g.dnat != nil && !g.dnat.Ready():
		return errors.New("DNAT rules not applied yet")
	case g.certs.acme != nil:
		return g.certs.acme.Ready()
	}
	return nil
}

// newDNAT sets up the DNAT reconciler for --netrules (and, in vip mode,
// the VIP assigner); none leaves g.dnat nil.
func (g *Gateway) newDNAT(cfg Config, client kubernetes.Interface) error {
	if cfg.NetRules == netrules.KindNone {
		g.log.Info("DNAT disabled (--netrules=none): traffic must reach --proxy-port some other way")
		return nil
	}
	rules, err := netrules.New(cfg.NetRules, netrules.Options{Logger: g.log})
	if err != nil {
		return fmt.Errorf("--netrules %s: %w", cfg.NetRules, err)
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
	g.dnat, err = dnat.New(o)
	return err
}

// newDNS binds the DNS server's sockets (UDP and TCP on one port).
func (g *Gateway) newDNS(cfg Config) error {
	opts := dns.Options{
		Zones:      cfg.DNSZones,
		TTL:        cfg.DNSTTL.Duration,
		Mode:       nodewatch.Mode(cfg.Mode),
		CloudNodes: cfg.DNSCloudNodes,
		Logger:     g.log,
		Registerer: g.metrics,
	}
	pc, ln, err := dns.Listen(context.Background(), cfg.DNSListen)
	if err != nil {
		return err
	}
	g.dns, g.dnsPC, g.dnsLn = dns.New(opts), pc, ln
	return nil
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

// kubeClientWithLimiter is kubeClient with limiter instead of
// --kube-api-qps and --kube-api-burst, unless it is nil.
func kubeClientWithLimiter(c Config, limiter flowcontrol.RateLimiter) (kubernetes.Interface, error) {
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
	cfg.RateLimiter = limiter
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return client, nil
}

// edgesWithoutTunnel counts the edge nodes of the latest snapshot that
// have no tunnel to this replica (at scrape time: no series per node).
func (g *Gateway) edgesWithoutTunnel() float64 {
	snap := g.watcher.Snapshot()
	if snap == nil {
		return 0
	}
	n := 0
	for name, node := range snap.Nodes {
		if _, ok := g.registry.Lookup(name); node.Edge && !ok {
			n++
		}
	}
	return float64(n)
}
