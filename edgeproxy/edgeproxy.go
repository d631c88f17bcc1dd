// Package edgeproxy is tether-edge: it keeps the QUIC tunnel from this
// edge node to the gateway replicas (package edgetunnel), runs the
// kube-apiserver proxy for the node's components (packages apiproxy,
// cache and upstream), takes part in its node pool (packages poolrunner
// and poolstore) and serves the admin endpoints, each presenting the
// node's certificate as package identity says.
//
// This package is Config, Run and the parts list (parts.go); the jobs
// are its sub-packages.
package edgeproxy

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/edgeproxy/apiproxy"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/edgeproxy/edgeservice"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/edgeproxy/filter"
	"github.com/tether-edge/tether/edgeproxy/identity"
	"github.com/tether-edge/tether/edgeproxy/nodepods"
	"github.com/tether-edge/tether/edgeproxy/poolrunner"
	"github.com/tether-edge/tether/edgeproxy/upstream"
	"github.com/tether-edge/tether/internal/admin"
	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/internal/component"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/version"
	"github.com/tether-edge/tether/netrules"
	"github.com/tether-edge/tether/poolstore/feed"
)

// Run runs tether-edge until ctx ends: the tunnel when --gateway is
// given, the kube-apiserver proxy when a way to the apiserver is, and the
// admin endpoints. Its parts run in a component.Group (see build for
// their order).
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if b, err := json.Marshal(cfg); err == nil {
		log.Debug("effective configuration", "config", string(b))
	}
	reg := admin.NewRegistry()
	id, err := identity.Start(ctx, identity.Options{
		NodeName: cfg.NodeName, Cert: cfg.Cert, Key: cfg.Key,
		Kubeconfig: cfg.Kubeconfig, BootstrapKubeconfig: cfg.BootstrapKubeconfig, DataDir: cfg.DataDir,
		ServerAddr: cfg.ServerAddr, ServerCA: cfg.ServerCA,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		return err
	}
	defer id.Stop()
	if !id.Wait(ctx) {
		log.Info("tether-edge stopped before its client certificate was issued")
		return nil
	}
	e, err := build(cfg, id, reg, log)
	if err != nil {
		return err
	}
	e.log.Info("tether-edge starting", "version", version.Version, "gateway", cfg.Gateway,
		"allow_ports", cfg.AllowPorts.String(), "allow_pod_ports", cfg.AllowPodPorts, "apiserver_proxy", cfg.proxyConfigured(), "admin", cfg.AdminListen)
	err = e.parts.Run(ctx)
	e.log.Info("tether-edge stopped")
	return err
}

// edge is tether-edge with its parts built and its listeners bound.
type edge struct {
	parts component.Group
	log   *slog.Logger // with the node name, once known
}

// build makes tether-edge's parts, in the order they start; they stop in
// the reverse order. The pool reaches the cloud through the proxy and the
// upstreams, and has its election record written through the tunnel: on
// shutdown those stay until the pool has released its leadership, so that
// another node takes over at once. If build fails, nothing is left open.
func build(cfg Config, id *identity.Identity, reg *prometheus.Registry, log *slog.Logger) (_ *edge, err error) {
	e := &edge{}
	defer func() {
		if err != nil {
			e.parts.Close()
		}
	}()
	var tun *edgetunnel.Client
	var tunCert *identity.Cert
	var pods *tunnelPods
	if len(cfg.Gateway) > 0 {
		if tun, tunCert, pods, err = newTunnel(cfg, id, reg, log); err != nil {
			return nil, err
		}
	}
	var ap *apiserverProxy
	if cfg.proxyConfigured() {
		if ap, err = newAPIServerProxy(cfg, id, tun, reg, log); err != nil {
			return nil, err
		}
		if pods != nil {
			pods.loop.Bind(ap.proxy)
		}
	}
	if node := id.Name(); node != "" {
		log = log.With("node", node)
	}
	e.log = log
	if tun != nil {
		// The tunnels move to new connections with the new certificate;
		// the old ones end with the streams they relay.
		tunCert.OnRotate("client certificate rotated; tunnels move to new connections", log, tun.Rotate)
		e.parts.Add(tunnelPart{tun})
	}
	if ap != nil && ap.cert != nil {
		// kubelet rotates its client certificate in place; open HTTP/2
		// connections would keep presenting the old one until it expires
		// and kube-apiserver answers 401. New requests to the apiservers
		// go over new connections, with the new certificate; watches keep
		// their connections.
		ap.cert.OnRotate("client certificate rotated; new apiserver requests use new connections", log, ap.upstreams.Rotate)
	}
	e.parts.Add(certificatesPart(id, cfg.CertCheckInterval.Duration))
	if ap != nil {
		e.parts.Add(ap.parts()...)
	}
	if pods != nil {
		e.parts.Add(pods.part())
	}
	if cfg.EdgeServices {
		es, err := newEdgeServices(cfg, tun, pods, ap, reg, log)
		if err != nil {
			return nil, err
		}
		e.parts.Add(part{N: "edge-services", RunF: es.Run, CloseF: es.Close})
	}
	if cfg.AdminListen != "" {
		ln, err := listen(listenerAdmin, cfg.AdminListen, reg, log)
		if err != nil {
			return nil, fmt.Errorf("admin listener: %w", err)
		}
		e.parts.Add(e.admin(cfg, ln, reg, id.Name()))
	}
	return e, nil
}

// admin serves the admin endpoints on ln: readiness and /status come from
// the parts.
func (e *edge) admin(cfg Config, ln net.Listener, reg *prometheus.Registry, node string) component.Component {
	h := admin.New(admin.Options{
		Registry:  reg,
		Profiling: cfg.Profiling,
		Ready:     e.parts.Ready,
		Status: func() any {
			st := statusapi.Edge{Node: node, Version: version.Version}
			component.Status(&e.parts, &st)
			return st
		},
		Logger: e.log,
	})
	return part{N: "admin", RunF: func(ctx context.Context) error { return admin.ServeListener(ctx, ln, h) }, CloseF: ln.Close}
}

// newTunnel builds the tunnel client, with the certificate the identity
// presents to the gateways, and, with the apiserver proxy, what the
// tunnel's allow list knows of the node's pods (its loop is bound to the
// proxy once built).
func newTunnel(cfg Config, id *identity.Identity, reg *prometheus.Registry, log *slog.Logger) (*edgetunnel.Client, *identity.Cert, *tunnelPods, error) {
	cert, err := id.Tunnel()
	if err != nil {
		return nil, nil, nil, err
	}
	var roots func() *x509.CertPool
	if cfg.GatewayCA != "" {
		cas, err := certfile.LoadCAs(cfg.GatewayCA, certfile.Options{Name: "--gateway-ca", Logger: log})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--gateway-ca: %w", err)
		}
		roots = cas.Pool
	}
	node := id.Name() // the certificate's, which the gateways route by
	var pods *tunnelPods
	var src edgetunnel.PodSource
	if cfg.proxyConfigured() {
		if pods, err = newTunnelPods(node); err != nil {
			return nil, nil, nil, err
		}
		src = pods.src
	} else {
		log.Info("no apiserver proxy: the tunnel dials no pods, only this node's own addresses")
	}
	tun, err := edgetunnel.New(edgetunnel.Options{
		Gateways:          cfg.Gateway,
		ServerName:        cfg.GatewayServerName,
		RootCAs:           roots,
		Certificate:       cert.GetClientCertificate,
		AllowPorts:        cfg.AllowPorts,
		Pods:              src,
		AllowPodPorts:     cfg.AllowPodPorts,
		MaxStreams:        cfg.MaxStreams,
		MaxServiceStreams: cfg.MaxServiceStreams,
		Logger:            log.With("node", node),
		Registry:          reg,
	})
	return tun, cert, pods, err
}

// tunnelPods are the node's pod ranges and pods for the tunnel's allow
// list: informers that read through the apiserver proxy in process (loop,
// as nodepods.Client), with the node's identity, so that they are cached
// for offline restarts.
type tunnelPods struct {
	src  *nodepods.Pods
	loop *apiproxy.Loopback
}

func newTunnelPods(node string) (*tunnelPods, error) {
	loop := apiproxy.NewLoopback(nodepods.Client)
	client, err := kube.NewForConfig(&rest.Config{Host: "http://in-process", Transport: loop,
		UserAgent: nodepods.UserAgent + "/" + version.Version, QPS: 20, Burst: 40})
	if err != nil {
		return nil, fmt.Errorf("tunnel pods: %w", err)
	}
	return &tunnelPods{src: nodepods.New(node, client), loop: loop}, nil
}

// newEdgeServices builds the edge's access to marked cloud Services: the
// Service informer reads through the apiserver proxy in process (as
// edgeservice.Client), the node's pod ranges and addresses come from the
// tunnel's pods, the streams go through the tunnel, and the host's rules
// are nftables (netrules.NewEdge), which needs CAP_NET_ADMIN.
func newEdgeServices(cfg Config, tun *edgetunnel.Client, pods *tunnelPods, ap *apiserverProxy, reg *prometheus.Registry, log *slog.Logger) (*edgeservice.Feature, error) {
	if tun == nil || pods == nil || ap == nil {
		return nil, errors.New("--edge-services needs --gateway and the apiserver proxy")
	}
	rules, err := netrules.NewEdge(netrules.KindAuto, netrules.Options{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--edge-services: host rules: %w", err)
	}
	loop := apiproxy.NewLoopback(edgeservice.Client)
	client, err := kube.NewForConfig(&rest.Config{Host: "http://in-process", Transport: loop,
		UserAgent: edgeservice.UserAgent + "/" + version.Version, QPS: 20, Burst: 40})
	if err != nil {
		return nil, fmt.Errorf("--edge-services: %w", err)
	}
	loop.Bind(ap.proxy)
	ln, err := listen(listenerService, cfg.ServiceListen, reg, log)
	if err != nil {
		return nil, fmt.Errorf("service listener: %w", err)
	}
	f, err := edgeservice.NewFeature(edgeservice.FeatureOptions{
		Services: edgeservice.NewServices(client),
		Node:     pods.src,
		Dialer:   edgeservice.Tunnel{Client: tun},
		Rules:    rules,
		Listener: ln,
		Logger:   log,
		Registry: reg,
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	log.Info("edge services: this node's pods reach the marked cloud Services", "listen", ln.Addr().String(), "rules", rules.Backend())
	return f, nil
}

// apiserverProxy is the kube-apiserver proxy and what it runs on.
type apiserverProxy struct {
	upstreams *upstream.Upstreams
	store     *cache.Store
	proxy     *apiproxy.Proxy
	ln        net.Listener
	topology  *filter.Filter     // nil when off
	pool      *poolrunner.Runner // nil when off
	cert      *identity.Cert     // the client certificate; nil with a token
	pods      *podAPI            // the pod listener; nil when off
}

// newAPIServerProxy opens the cache and the listener and builds the
// proxy; the identity learns the node name of the apiserver credentials if
// it knows none yet.
func newAPIServerProxy(cfg Config, id *identity.Identity, tun *edgetunnel.Client, reg *prometheus.Registry, log *slog.Logger) (*apiserverProxy, error) {
	acc, err := id.APIServer()
	if err != nil {
		return nil, err
	}
	node := id.Name()
	if node == "" {
		log.Warn("node name unknown (give --node-name): the node's Lease will not be renewed while the cloud is unreachable")
	}
	ups, err := upstream.New(upstream.Options{
		Servers:     acc.Servers,
		TLS:         acc.TLS,
		BearerToken: acc.Token,
		Health: upstream.HealthOptions{
			Interval:         cfg.HealthCheckInterval.Duration,
			Timeout:          cfg.HealthCheckTimeout.Duration,
			FailureThreshold: cfg.UnhealthyThreshold,
			SuccessThreshold: cfg.HealthyThreshold,
		},
		Logger:     log,
		Registerer: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("apiserver proxy: %w", err)
	}
	maxSize, err := cfg.cacheMaxSize()
	if err != nil {
		return nil, err
	}
	store, err := cache.OpenWith(filepath.Join(cfg.DataDir, cache.FileName), cache.Options{Logger: log, MaxSize: maxSize})
	if err != nil {
		return nil, err
	}
	if err := store.Register(reg); err != nil {
		store.Close()
		return nil, err
	}
	ln, err := listen(listenerAPIServer, cfg.APIServerListen, reg, log)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("apiserver proxy listener: %w", err)
	}
	topoLoop := apiproxy.NewLoopback(apiproxy.TopologyClient)
	topo, err := newTopologyFilter(cfg, node, ln.Addr(), topoLoop, log)
	if err != nil {
		ln.Close()
		store.Close()
		return nil, err
	}
	opts := apiproxy.Options{
		Upstream:   ups,
		Store:      store,
		NodeName:   node,
		Components: cfg.CacheComponents,
		Logger:     log,
		Registerer: reg,
	}
	if topo != nil {
		opts.Topology, opts.TopologyComponents = topo, cfg.TopologyComponents
	}
	pool, err := newPoolRunner(cfg, node, acc, tun, ups.Healthy, reg, log)
	if err != nil {
		ln.Close()
		store.Close()
		return nil, err
	}
	if pool != nil {
		opts.Pool = pool
	}
	pa, podOpts, err := newPodAPI(cfg, ups, reg, log)
	if err == nil {
		opts.Pods = podOpts
	}
	var px *apiproxy.Proxy
	if err == nil {
		px, err = apiproxy.New(opts)
	}
	if err != nil {
		if pa != nil {
			pa.close()
		}
		if pool != nil {
			pool.Close()
		}
		ln.Close()
		store.Close()
		return nil, err
	}
	// The filter's informers and the pool's clients read through the
	// proxy, in process.
	topoLoop.Bind(px)
	if pool != nil {
		pool.Bind(px)
	}
	log.Info("apiserver proxy", "listen", ln.Addr().String(), "servers", acc.Servers, "cache", store.Path(), "cache_max_size", cfg.CacheMaxSize,
		"cached_components", cfg.CacheComponents, "queued_writes", store.QueueLen())
	return &apiserverProxy{upstreams: ups, store: store, proxy: px, ln: ln, topology: topo, pool: pool, cert: acc.Cert, pods: pa}, nil
}

// newPoolRunner opens the pool listener and makes the pool's runner; nil
// when the pool is off (--pool-listen empty, or the node name unknown).
func newPoolRunner(cfg Config, node string, acc *identity.APIServerAccess, tun *edgetunnel.Client, healthy func() bool,
	reg prometheus.Registerer, log *slog.Logger) (*poolrunner.Runner, error) {
	if cfg.PoolListen == "" {
		return nil, nil
	}
	if node == "" {
		log.Warn("node name unknown (give --node-name): no node pool")
		return nil, nil
	}
	// The pool's data is signed by the gateways, verified as the tunnel
	// verifies them (--gateway-ca, --gateway-server-name or the
	// --gateway hosts).
	var verifier *feed.Verifier
	if tun != nil {
		v, err := feed.NewVerifier(feed.VerifierOptions{Roots: tun.RootCAs(), Names: tun.GatewayNames()})
		if err != nil {
			return nil, fmt.Errorf("node pool: %w", err)
		}
		verifier = v
	}
	ln, err := listen(listenerPool, cfg.PoolListen, reg, log)
	if err != nil {
		return nil, fmt.Errorf("pool listener: %w", err)
	}
	return poolrunner.New(poolrunner.Options{
		Node: node, Pool: cfg.Pool, DataDir: cfg.DataDir, Resources: cfg.PoolResources, CA: cfg.PoolCA,
		LeaseDuration: cfg.PoolLeaseDuration.Duration, RenewDeadline: cfg.PoolRenewDeadline.Duration, RetryPeriod: cfg.PoolRetryPeriod.Duration,
		Access: acc, Tunnel: tun, Verifier: verifier, CloudHealthy: healthy, Listener: ln, Registerer: reg, Logger: log,
	}), nil
}

// newTopologyFilter builds the service topology filter (nil when
// --topology-components is empty or the node is unknown). Its Service and
// Node informers read through the proxy itself, in process (loop, as
// apiproxy.TopologyClient), with the node's identity, so that they are
// cached for offline restarts.
func newTopologyFilter(cfg Config, node string, addr net.Addr, loop *apiproxy.Loopback, log *slog.Logger) (*filter.Filter, error) {
	if len(cfg.TopologyComponents) == 0 {
		return nil, nil
	}
	if node == "" {
		log.Warn("node name unknown (give --node-name): no service topology filter")
		return nil, nil
	}
	client, err := kube.NewForConfig(&rest.Config{Host: "http://" + addr.String(), Transport: loop,
		UserAgent: apiproxy.TopologyUserAgent + "/" + version.Version, QPS: 20, Burst: 40})
	if err != nil {
		return nil, fmt.Errorf("topology filter: %w", err)
	}
	log.Info("service topology filter", "components", cfg.TopologyComponents)
	return filter.New(node, client), nil
}
