package edgeproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edgeproxy/apiproxy"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/version"
	"github.com/tether-edge/tether/poolstore"
	"github.com/tether-edge/tether/poolstore/record"
)

// poolRunner starts the node pool once the node's own Node is known (its
// pool label). Until then, and when the node is in no pool, the apiserver
// proxy sees a pool that serves nothing.
type poolRunner struct {
	cfg      Config
	node     string
	proxyURL string
	access   *apiserverAccess
	tun      *edgetunnel.Client // nil without --gateway
	healthy  func() bool
	ln       net.Listener
	reg      prometheus.Registerer
	log      *slog.Logger

	// loop and membersLoop carry the pool's requests and its Node
	// informer's to the proxy in process (apiproxy.PoolClient and
	// PoolMembersClient: only the informer's reads are cached).
	loop, membersLoop *apiproxy.Loopback

	store *poolstore.Store // the replica, once open
	pool  atomic.Pointer[poolstore.Pool]
}

var _ apiproxy.Pool = (*poolRunner)(nil)

// newPoolRunner opens the pool listener; nil when the pool is off
// (--pool-listen empty, or the node name unknown).
func newPoolRunner(cfg Config, node string, access *apiserverAccess, tun *edgetunnel.Client, healthy func() bool,
	reg prometheus.Registerer, log *slog.Logger) (*poolRunner, error) {
	if cfg.PoolListen == "" {
		return nil, nil
	}
	if node == "" {
		log.Warn("node name unknown (give --node-name): no node pool")
		return nil, nil
	}
	ln, err := listen(listenerPool, cfg.PoolListen, reg, log)
	if err != nil {
		return nil, fmt.Errorf("pool listener: %w", err)
	}
	return &poolRunner{cfg: cfg, node: node, access: access, tun: tun, healthy: healthy, ln: ln, reg: reg, log: log,
		loop: apiproxy.NewLoopback(apiproxy.PoolClient), membersLoop: apiproxy.NewLoopback(apiproxy.PoolMembersClient)}, nil
}

// Run waits for the node's Node, then runs the pool until ctx ends.
func (r *poolRunner) Run(ctx context.Context, proxyAddr net.Addr) error {
	defer r.ln.Close()
	r.proxyURL = "http://" + proxyAddr.String()
	members, err := r.startMembers(ctx)
	if err != nil {
		return err
	}
	pool := r.cfg.Pool
	if label, ok := members.Pool(r.node); ok && pool == "" {
		pool = label
	} else if ok && label != pool {
		r.log.Warn("--pool differs from the node's label; peers judge membership by the label", "pool", pool, "label", label)
	}
	if pool == "" {
		if ctx.Err() == nil {
			r.log.Info("node is in no node pool (no " + openyurt.PoolLabel + " label, no --pool): pool off until restart")
		}
		<-ctx.Done()
		return nil
	}
	p, err := r.build(pool, members)
	if err != nil {
		return err
	}
	r.pool.Store(p)
	defer r.store.Close()
	return p.Run(ctx)
}

// build makes the pool's clients and store.
func (r *poolRunner) build(pool string, members *nodeMembers) (*poolstore.Pool, error) {
	cert, cas, err := r.credentials()
	if err != nil {
		return nil, err
	}
	rc := &rest.Config{Host: r.proxyURL, Transport: r.loop, UserAgent: apiproxy.PoolClient.Name + "/" + version.Version,
		QPS: 50, Burst: 100, ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"}}
	client, err := kube.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("node pool: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("node pool: %w", err)
	}
	resources, err := parseResources(r.cfg.PoolResources)
	if err != nil {
		return nil, err
	}
	store, err := poolstore.Open(filepath.Join(r.cfg.DataDir, poolstore.FileName), r.log)
	if err != nil {
		return nil, err
	}
	r.store = store
	var delegate func(ctx context.Context, node string, lease []byte) error
	var records record.Writer
	if r.tun != nil {
		delegate = r.tun.DelegateHeartbeat
		records = edgetunnel.PoolRecords{Client: r.tun}
	} else {
		r.log.Warn("no --gateway: this node never leads its pool, it follows the leader the others elect (a node may only read the "+
			"pool's election record, "+record.Namespace+"/"+record.ElectionName(pool)+"; the gateway writes it for the edges)", "pool", pool)
	}
	return poolstore.New(poolstore.Options{
		PeerConfig: poolstore.PeerConfig{Self: r.node, Certificate: cert, CAs: cas, Members: members, Logger: r.log},
		Pool:       pool, Client: client, Records: records, Dynamic: dyn, Resources: resources, Store: store, Listener: r.ln,
		CloudHealthy: r.healthy, Peers: func() []string { return members.Nodes(pool) }, Delegate: delegate,
		LeaseDuration: r.cfg.PoolLeaseDuration.Duration, RenewDeadline: r.cfg.PoolRenewDeadline.Duration,
		RetryPeriod: r.cfg.PoolRetryPeriod.Duration, Registerer: r.reg,
	})
}

// credentials are the node certificate the peers see and the CAs their
// certificates are checked against: --pool-ca, else the apiserver's CA.
func (r *poolRunner) credentials() (func() (*tls.Certificate, error), func() *x509.CertPool, error) {
	if r.access.cert == nil {
		return nil, nil, errors.New("node pool: peers are authenticated with the node's client certificate, and the apiserver credentials hold none")
	}
	cert := func() (*tls.Certificate, error) { return r.access.cert.GetClientCertificate(nil) }
	if r.cfg.PoolCA != "" {
		cas, err := certfile.LoadCAs(r.cfg.PoolCA, certfile.Options{Logger: r.log})
		if err != nil {
			return nil, nil, fmt.Errorf("--pool-ca: %w", err)
		}
		return cert, cas.Pool, nil
	}
	if roots := r.access.tls.RootCAs; roots != nil {
		return cert, func() *x509.CertPool { return roots }, nil
	}
	return nil, nil, errors.New("node pool: give --pool-ca (the CA of the nodes' client certificates); the apiserver CA is not known either")
}

// startMembers starts the Node informer through the proxy and waits for
// its first list (from the cache when the cloud is out of reach: its
// reads are cached).
func (r *poolRunner) startMembers(ctx context.Context) (*nodeMembers, error) {
	client, err := kube.NewForConfig(&rest.Config{Host: r.proxyURL, Transport: r.membersLoop,
		UserAgent: apiproxy.PoolMembersClient.Name + "/" + version.Version, QPS: 20, Burst: 40})
	if err != nil {
		return nil, fmt.Errorf("node pool: %w", err)
	}
	inf := cache.NewSharedIndexInformer(kube.ListWatch(client.Nodes()), &corev1.Node{}, 0, cache.Indexers{})
	m := &nodeMembers{lister: corelisters.NewNodeLister(inf.GetIndexer())}
	go inf.RunWithContext(ctx)
	for !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		if ctx.Err() != nil {
			return m, nil
		}
	}
	return m, nil
}

// Serves, Transport and DelegateHeartbeat are the apiserver proxy's view
// of the pool (apiproxy.Pool): nothing until the pool runs.
func (r *poolRunner) Serves(gvr schema.GroupVersionResource, cloudHealthy bool) bool {
	p := r.pool.Load()
	return p != nil && p.Serves(gvr, cloudHealthy)
}

func (r *poolRunner) Transport() http.RoundTripper {
	if p := r.pool.Load(); p != nil {
		return p.Transport()
	}
	return unavailableTransport{}
}

func (r *poolRunner) DelegateHeartbeat(ctx context.Context, lease []byte) error {
	p := r.pool.Load()
	if p == nil {
		return errors.New("node pool not running")
	}
	return p.DelegateHeartbeat(ctx, lease)
}

// Status is the pool's /status, nil until it runs.
func (r *poolRunner) Status() *statusapi.Pool {
	if p := r.pool.Load(); p != nil {
		st := p.Status()
		return &st
	}
	return nil
}

type unavailableTransport struct{}

func (unavailableTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("node pool not running")
}

// nodeMembers is poolstore.Members from the Node objects.
type nodeMembers struct{ lister corelisters.NodeLister }

var _ poolstore.Members = (*nodeMembers)(nil)

func (m *nodeMembers) Pool(node string) (string, bool) {
	n, err := m.lister.Get(node)
	if err != nil {
		return "", false
	}
	pool, ok := n.Labels[openyurt.PoolLabel]
	return pool, ok && pool != ""
}

func (m *nodeMembers) Address(node string) (string, bool) {
	n, err := m.lister.Get(node)
	if err != nil {
		return "", false
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address, true
		}
	}
	return "", false
}

// Nodes are the pool's members, sorted.
func (m *nodeMembers) Nodes(pool string) []string {
	sel := labels.SelectorFromSet(labels.Set{openyurt.PoolLabel: pool})
	nodes, err := m.lister.List(sel)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	sort.Strings(names)
	return names
}

// parseResources reads --pool-resources: "resource.group/version" or
// "resource/version" for the core group (endpointslices.discovery.k8s.io/v1,
// services/v1).
func parseResources(specs []string) ([]schema.GroupVersionResource, error) {
	var out []schema.GroupVersionResource
	for _, s := range specs {
		i := strings.LastIndex(s, "/")
		if i <= 0 || i == len(s)-1 {
			return nil, fmt.Errorf("--pool-resources %q: want resource.group/version (services/v1, endpointslices.discovery.k8s.io/v1)", s)
		}
		out = append(out, schema.ParseGroupResource(s[:i]).WithVersion(s[i+1:]))
	}
	return out, nil
}
