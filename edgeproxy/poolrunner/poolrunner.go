// Package poolrunner is how tether-edge runs its node pool
// (poolstore.Pool): it waits for its own Node's pool label, then builds
// the pool with the node's credentials (package identity) and clients of
// the apiserver proxy in process. Until then, and when the node is in no
// pool, the apiserver proxy sees a pool that serves nothing.
package poolrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edgeproxy/apiproxy"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/edgeproxy/identity"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/version"
	"github.com/tether-edge/tether/poolstore"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/poolstore/replica"
)

// Options configure a Runner; the names in parentheses are tether-edge's
// flags.
type Options struct {
	Node string // the node's name; not empty
	// Pool is the node's pool (--pool); "" to take its Node's
	// openyurt.PoolLabel.
	Pool string
	// DataDir (--data-dir) holds the pool's replica.
	DataDir string
	// Resources are the pool-scope resources (--pool-resources), as
	// ParseResources reads them.
	Resources []string
	// CA (--pool-ca) checks the peers' certificates; "" for the
	// apiserver's CA.
	CA string
	// The election's timings (--pool-lease-duration,
	// --pool-renew-deadline, --pool-retry-period).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// Access is the apiserver proxy's: its client certificate is the one
	// the peers see.
	Access *identity.APIServerAccess
	// Tunnel writes the election records, delegates heartbeats and opens
	// the gateway's signed pool feed; nil without --gateway (the node then
	// never leads).
	Tunnel *edgetunnel.Client
	// Verifier checks what the gateways signed of the pool's data against
	// --gateway-ca for the gateways' names; nil without --gateway: the
	// node can verify nothing, so the pool is off (components read from
	// the cloud or the cache).
	Verifier *feed.Verifier
	// CloudHealthy reports whether an apiserver is reachable.
	CloudHealthy func() bool
	// Listener is the pool listener (--pool-listen); the Runner closes it.
	Listener   net.Listener
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Runner starts the node pool once the node's own Node is known (its
// pool label). Until then, and when the node is in no pool, the apiserver
// proxy sees a pool that serves nothing.
type Runner struct {
	opts     Options
	proxyURL string
	log      *slog.Logger

	// loop and membersLoop carry the pool's requests and its Node
	// informer's to the proxy in process (apiproxy.PoolClient and
	// PoolMembersClient: only the informer's reads are cached).
	loop, membersLoop *apiproxy.Loopback

	store *replica.Store // the replica, once open
	pool  atomic.Pointer[poolstore.Pool]
}

var _ apiproxy.Pool = (*Runner)(nil)

// New returns the Runner of the pool, to run once the apiserver proxy is
// bound (Bind).
func New(opts Options) *Runner {
	return &Runner{opts: opts, log: opts.Logger,
		loop: apiproxy.NewLoopback(apiproxy.PoolClient), membersLoop: apiproxy.NewLoopback(apiproxy.PoolMembersClient)}
}

// Bind has the pool's clients read through the apiserver proxy p, in
// process.
func (r *Runner) Bind(p *apiproxy.Proxy) {
	r.loop.Bind(p)
	r.membersLoop.Bind(p)
}

// Close closes the pool listener (Run does too when it returns).
func (r *Runner) Close() error { return r.opts.Listener.Close() }

// Run waits for the node's Node, then runs the pool until ctx ends.
func (r *Runner) Run(ctx context.Context, proxyAddr net.Addr) error {
	defer r.opts.Listener.Close()
	r.proxyURL = "http://" + proxyAddr.String()
	members, err := r.startMembers(ctx)
	if err != nil {
		return err
	}
	pool := r.opts.Pool
	if label, ok := members.Pool(r.opts.Node); ok && pool == "" {
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
	if r.opts.Verifier == nil {
		r.log.Warn("no --gateway: the node cannot verify its pool's data (the gateways sign it), so it takes none; "+
			"components read from the cloud or the cache", "pool", pool)
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
func (r *Runner) build(pool string, members *nodeMembers) (*poolstore.Pool, error) {
	cert, cas, err := r.opts.Access.Pool(r.opts.CA, r.log)
	if err != nil {
		return nil, err
	}
	rc := &rest.Config{Host: r.proxyURL, Transport: r.loop, UserAgent: apiproxy.PoolClient.Name + "/" + version.Version,
		QPS: 50, Burst: 100, ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"}}
	client, err := kube.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("node pool: %w", err)
	}
	resources, err := feed.ParseResources(r.opts.Resources)
	if err != nil {
		return nil, err
	}
	store, err := replica.Open(filepath.Join(r.opts.DataDir, replica.FileName), r.log)
	if err != nil {
		return nil, err
	}
	r.store = store
	var delegate func(ctx context.Context, node string, lease []byte) error
	var records record.Writer
	var feedOpen func(ctx context.Context) (io.ReadCloser, error)
	if tun := r.opts.Tunnel; tun != nil {
		delegate = tun.DelegateHeartbeat
		records = edgetunnel.PoolRecords{Client: tun}
		feedOpen = func(ctx context.Context) (io.ReadCloser, error) { return tun.PoolFeed(ctx, pool) }
	}
	return poolstore.New(poolstore.Options{
		PeerConfig: poolstore.PeerConfig{Self: r.opts.Node, Certificate: cert, CAs: cas, Members: members, Logger: r.log},
		Pool:       pool, Client: client, Records: records, Feed: feedOpen, Verifier: r.opts.Verifier, Resources: resources, Store: store, Listener: r.opts.Listener,
		CloudHealthy: r.opts.CloudHealthy, Peers: func() []string { return members.Nodes(pool) }, Delegate: delegate,
		LeaseDuration: r.opts.LeaseDuration, RenewDeadline: r.opts.RenewDeadline,
		RetryPeriod: r.opts.RetryPeriod, Registerer: r.opts.Registerer,
	})
}

// startMembers starts the Node informer through the proxy and waits for
// its first list (from the cache when the cloud is out of reach: its
// reads are cached).
func (r *Runner) startMembers(ctx context.Context) (*nodeMembers, error) {
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
func (r *Runner) Serves(gvr schema.GroupVersionResource, cloudHealthy bool) bool {
	p := r.pool.Load()
	return p != nil && p.Serves(gvr, cloudHealthy)
}

func (r *Runner) Transport() http.RoundTripper {
	if p := r.pool.Load(); p != nil {
		return p.Transport()
	}
	return unavailableTransport{}
}

func (r *Runner) DelegateHeartbeat(ctx context.Context, lease []byte) error {
	p := r.pool.Load()
	if p == nil {
		return errors.New("node pool not running")
	}
	return p.DelegateHeartbeat(ctx, lease)
}

// Status is the pool's /status, nil until it runs.
func (r *Runner) Status() *statusapi.Pool {
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
