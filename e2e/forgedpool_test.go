package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore"
	"github.com/tether-edge/tether/poolstore/elect"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/poolstore/replica"
	"github.com/tether-edge/tether/tunnel"
)

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read by older clients; the pool shares it.

// The pool-scope resources as the replica names them.
var (
	slicesKey    = replica.ResourceKey(poolstore.DefaultResources[0])
	endpointsKey = replica.ResourceKey(poolstore.DefaultResources[1])
	servicesKey  = replica.ResourceKey(poolstore.DefaultResources[2])
)

// TestForgedPool: the key of one node of pool shop (edge-t) is in an
// attacker's hands, and the attacker leads the pool. Its leader is not
// tether-edge but the attacker's own, built on the real pool code in the
// test process: a poolstore.Server with the thief's node certificate on
// the thief's pool port, streaming a replica.Store that it fills with the
// genuine pool data (fill) and then tampers with; it takes and renews the
// pool's election record through the thief's own tunnel, with the real
// elector. The honest members, edge-h1 and edge-h2, run the real
// tether-edge and reach the cloud throughout; a real kube-proxy reads
// through edge-h1. Promise (docs/design.md, "The node pool"):
// a leader can withhold the pool's data, never forge, alter or delete
// it; a follower refuses a stream that tries, counts the refusal by
// reason, keeps serving genuine data, and a replica the leader keeps
// looking fresh while withholding goes stale within 35 s, after which
// the follower reads from the cloud. With real binaries, the shipped
// manifests and a real kube-apiserver.
func TestForgedPool(t *testing.T) {
	testenv.RequireRoot(t)
	w := world.New(t, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: "shop", Hosts: []string{"edge-h1", "edge-h2", "edge-t"}, LAN: netip.MustParsePrefix("192.168.7.0/24")},
	}}, t.Logf)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w.ApplyShipped(t, "edge-rbac.yaml", "pool-rbac.yaml", "node-admission.yaml")
	admin := w.CP.Client
	gw := w.Gateways[0]
	w.StartGateway(t, gw)
	h1, h2, thief := w.Edge("edge-h1"), w.Edge("edge-h2"), w.Edge("edge-t")
	honest := []*world.Edge{h1, h2}
	thiefIP := thief.Host.Addr.String()

	// The cloud's data, one namespace per attack.
	createSlices(t, ctx, admin, "shop", 0, 5)
	createNamespace(t, ctx, admin, "shop-a")
	createService(t, ctx, admin, "shop-a", "web", 80)
	createSlices(t, ctx, admin, "shop-d", 0, 3)
	createNamespace(t, ctx, admin, "shop-f")
	createService(t, ctx, admin, "shop-f", "early", 80)

	// The attacker leads before the honest members start: they find the
	// record held and renewed, and follow it.
	r := startRogueLeader(t, ctx, w, thief, gw)
	testenv.EventuallyWithin(t, 60*time.Second, "the rogue leader to take pool shop's election record", func() bool {
		el, err := record.ReadLeader(ctx, admin.CoreV1().ConfigMaps(record.Namespace), "shop")
		return err == nil && el.Holder == thief.Name && r.leading()
	})
	t.Logf("the rogue leader holds pool shop's election record through %s's tunnel", thief.Name)

	for _, e := range honest {
		w.StartEdge(t, e, w.ProxyArgs(e)...)
	}
	for _, e := range honest {
		testenv.EventuallyNoError(t, e.Name+" to follow the rogue leader", func() error {
			st, err := e.Status(ctx)
			if err != nil {
				return err
			}
			if st.Pool == nil || st.Pool.Leader != thief.Name || st.Pool.Replication == nil || !st.Pool.Replication.Connected {
				return fmt.Errorf("pool status %+v", st.Pool)
			}
			return nil
		})
	}
	// Until the attack, the followers serve the rogue's genuine data from
	// their replicas: what they refuse later, they refuse for the
	// tampering alone.
	for _, e := range honest {
		testenv.EventuallyNoError(t, e.Name+" to serve the cloud's data", func() error {
			return errors.Join(servesAsCloud(ctx, admin, e, "shop"), servesAsCloud(ctx, admin, e, "shop-a"),
				servesAsCloud(ctx, admin, e, "shop-d"), servesAsCloud(ctx, admin, e, "shop-f"))
		})
		// Once the replica is fresh (a gateway mark it covers, within
		// 5 s of the feed), a list is answered from it.
		testenv.Eventually(t, e.Name+": a list served from the pool replica", func() bool {
			before := poolServed(t, ctx, e)
			if _, err := e.ProxyClient(kubeProxyUA).DiscoveryV1().EndpointSlices("shop").List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
			return poolServed(t, ctx, e) > before
		})
	}
	kp := testenv.StartKubeProxy(t, h1.Host, h1.Name, "http://127.0.0.1:10261")
	cloudAPI := kubernetesEndpoints(t, ctx, admin)
	testenv.EventuallyNoError(t, "kube-proxy on edge-h1 to program default/kubernetes", func() error {
		got, err := kp.Endpoints(ctx, "default", "kubernetes")
		if err == nil && slices.Equal(got, cloudAPI) {
			return nil
		}
		return fmt.Errorf("programs %v (%v), want %v", got, err, cloudAPI)
	})
	t.Logf("edge-h1 and edge-h2 follow the rogue leader; kube-proxy on edge-h1 programs default/kubernetes → %v", cloudAPI)

	t.Run("ForgedEndpoints", func(t *testing.T) {
		r.attack(t, ctx, admin, honest, tampering{
			what:     "a follower served the rogue leader's forged endpoints for default/kubernetes",
			resource: slicesKey, ns: "shop",
			change: func() { r.forgeKubernetes(t, thiefIP) },
			bad: func(e *world.Edge) string {
				c := e.ProxyClient(kubeProxyUA)
				var hits []string
				if l, err := c.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{}); err == nil {
					for _, s := range l.Items {
						if holds(s, thiefIP) {
							hits = append(hits, "EndpointSlice "+s.Name+" → "+sliceAddresses(s))
						}
					}
				}
				if l, err := c.CoreV1().Endpoints("default").List(ctx, metav1.ListOptions{}); err == nil {
					for _, ep := range l.Items {
						if holds(ep, thiefIP) {
							hits = append(hits, "Endpoints "+ep.Name)
						}
					}
				}
				if l, err := c.CoreV1().Services("default").List(ctx, metav1.ListOptions{}); err == nil {
					for _, s := range l.Items {
						if holds(s, thiefIP) {
							hits = append(hits, "Service "+s.Name)
						}
					}
				}
				if e == h1 {
					if progs, err := kp.Endpoints(ctx, "default", "kubernetes"); err == nil && slices.Contains(progs, thiefIP) {
						hits = append(hits, fmt.Sprintf("kube-proxy programs default/kubernetes → %v", progs))
					}
				}
				if len(hits) == 0 {
					return ""
				}
				return "serves, with kube-proxy's User-Agent, the thief's address " + thiefIP + ": " + strings.Join(hits, ", ")
			},
			after: func() {
				testenv.EventuallyNoError(t, "kube-proxy on edge-h1 to program the cloud's default/kubernetes", func() error {
					got, err := kp.Endpoints(ctx, "default", "kubernetes")
					if err == nil && slices.Equal(got, cloudAPI) {
						return nil
					}
					return fmt.Errorf("programs %v (%v), want %v", got, err, cloudAPI)
				})
			},
		})
	})

	t.Run("AlteredService", func(t *testing.T) {
		genuine, err := admin.CoreV1().Services("shop-a").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r.attack(t, ctx, admin, honest, tampering{
			what:     "a follower served the rogue leader's altered Service shop-a/web",
			resource: servicesKey, ns: "shop-a",
			change: func() { r.alterService(t, "shop-a", "web") },
			bad: func(e *world.Edge) string {
				l, err := e.ProxyClient(kubeProxyUA).CoreV1().Services("shop-a").List(ctx, metav1.ListOptions{})
				if err != nil {
					return ""
				}
				for _, s := range l.Items {
					if s.Name == "web" && serviceShape(s) != serviceShape(*genuine) {
						return fmt.Sprintf("serves shop-a/web@%s as %s; the cloud has it @%s as %s", s.ResourceVersion, serviceShape(s),
							genuine.ResourceVersion, serviceShape(*genuine))
					}
				}
				return ""
			},
		})
	})

	t.Run("DeletedObjects", func(t *testing.T) {
		r.attack(t, ctx, admin, honest, tampering{
			what:     "a follower stopped serving EndpointSlice shop-d/svc-1, which the rogue leader deleted",
			resource: slicesKey, ns: "shop-d",
			change: func() { r.deleteSlice(t, "shop-d", "svc-1") },
			bad: func(e *world.Edge) string {
				l, err := e.ProxyClient(kubeProxyUA).DiscoveryV1().EndpointSlices("shop-d").List(ctx, metav1.ListOptions{})
				if err != nil || slices.ContainsFunc(l.Items, func(s discoveryv1.EndpointSlice) bool { return s.Name == "svc-1" }) {
					return ""
				}
				return fmt.Sprintf("serves EndpointSlices %v in shop-d: svc-1, which the cloud has, is gone", sliceVersions(l.Items))
			},
		})
	})

	t.Run("FreshForever", func(t *testing.T) {
		// The rogue stops taking the cloud's changes and keeps its
		// replica looking synced.
		r.withhold()
		defer func() {
			if !t.Failed() {
				return
			}
			for _, e := range honest {
				if st, err := e.Status(ctx); err == nil && st.Pool != nil {
					t.Logf("%s's replica at the end: fresh %v, last sync %v ago (leader %s)", e.Name, st.Pool.Fresh,
						time.Since(st.Pool.SyncedAt).Round(time.Millisecond), st.Pool.Leader)
				}
			}
		}()
		// A change the rogue withholds.
		createService(t, ctx, admin, "shop-f", "late", 80)
		changed := time.Now()
		// Bound: the replica's freshness (30 s) after the last mark that
		// covered the replica (at most 5 s before the change), plus slack
		// for a busy machine.
		bound := poolstore.DefaultFreshFor + 5*time.Second + 10*time.Second
		for _, e := range honest {
			testenv.EventuallyWithin(t, bound-time.Since(changed), e.Name+" to serve the cloud's new Service shop-f/late", func() bool {
				l, err := e.ProxyClient(kubeProxyUA).CoreV1().Services("shop-f").List(ctx, metav1.ListOptions{})
				return err == nil && slices.ContainsFunc(l.Items, func(s corev1.Service) bool { return s.Name == "late" })
			})
			t.Logf("%s serves the cloud's shop-f/late %v after it was made", e.Name, time.Since(changed).Round(time.Millisecond))
		}
		for _, e := range honest {
			testenv.EventuallyNoError(t, e.Name+" to serve the cloud's data", func() error { return servesAsCloud(ctx, admin, e, "shop-f") })
		}
	})
}

// rogueLeader is an attacker's pool leader on the thief's host, built on
// the real pool code: it takes and renews the pool's election record
// through the thief's tunnel with the real elector, and serves its store
// to the followers with the real pool listener, the thief's node
// certificate and its address.
type rogueLeader struct {
	node, pool string
	store      *replica.Store
	// client reads the cloud with the thief's node identity (from the
	// thief's host).
	client *kube.Client
	// records writes the pool's records through the thief's tunnel, and
	// feed opens the gateway's pool feed through it.
	records  tunnelRecords
	verifier *feed.Verifier
	// ctx ends at the test's cleanup, which waits for wg.
	ctx context.Context
	wg  sync.WaitGroup

	mu       sync.Mutex
	term     bool
	stopFill context.CancelFunc
	keep     bool // keeping the replica fresh (withhold)
}

// startRogueLeader dials the thief's tunnel to gw and starts the rogue's
// elector and pool listener; they stop at the test's cleanup.
func startRogueLeader(t *testing.T, ctx context.Context, w *world.World, thief *world.Edge, gw *testenv.Host) *rogueLeader {
	t.Helper()
	kp, err := w.ClusterCA.NodeCert(thief.Name)
	if err != nil {
		t.Fatal(err)
	}
	var conn *quic.Conn
	testenv.EventuallyNoError(t, "the thief's tunnel to "+gw.Label, func() error {
		conn, err = dialTunnel(ctx, thief.Host, gw, kp.TLS, w.GatewayCA.Pool())
		return err
	})
	_, cfg, _ := w.CP.NodeClient(t, thief.Name)
	cfg.Dial = thief.Host.DialContext
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	store, err := replica.Open(filepath.Join(t.TempDir(), "pool.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := feed.NewVerifier(feed.VerifierOptions{Roots: w.GatewayCA.Pool, Names: []string{gw.Addr.String()}})
	if err != nil {
		t.Fatal(err)
	}
	r := &rogueLeader{node: thief.Name, pool: thief.Site.Name, store: store, client: client, records: tunnelRecords{conn}, verifier: verifier}

	members := staticMembers{}
	for _, e := range w.Edges {
		members[e.Name] = [2]string{e.Site.Name, e.Host.Addr.String()}
	}
	peer := poolstore.PeerConfig{Self: thief.Name, Members: members,
		Certificate: func() (*tls.Certificate, error) { return &kp.TLS, nil },
		CAs:         w.ClusterCA.Pool}
	srv, err := poolstore.NewServer(poolstore.ServerOptions{PeerConfig: peer, Store: store, Leader: r.leader})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := thief.Host.Listen("tcp", fmt.Sprintf(":%d", poolstore.DefaultPort))
	if err != nil {
		t.Fatal(err)
	}
	el, err := elect.New(elect.Options{Client: client, Records: r.records, Pool: r.pool, Node: r.node})
	if err != nil {
		t.Fatal(err)
	}
	var stop context.CancelFunc
	r.ctx, stop = context.WithCancel(ctx)
	r.wg.Go(func() { srv.Serve(r.ctx, ln) })
	r.wg.Go(func() { el.Run(r.ctx, r.lead) })
	t.Cleanup(func() {
		stop()
		r.wg.Wait()
		conn.CloseWithError(tunnel.CloseNormal, "")
		store.Close()
	})
	return r
}

// lead is the rogue's term, as poolstore.Pool's: a new epoch, then the
// pool's data into the store (fill) until withhold stops it; it stays
// leader until the term ends.
func (r *rogueLeader) lead(ctx context.Context) {
	if err := r.store.StartEpoch(fmt.Sprintf("%s/%d", r.node, time.Now().UnixNano())); err != nil {
		return
	}
	fctx, stop := context.WithCancel(ctx)
	r.mu.Lock()
	r.term, r.stopFill = true, stop
	withheld := r.keep
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.term = false
		r.mu.Unlock()
	}()
	if withheld {
		stop()
	}
	r.fill(fctx)
	<-ctx.Done()
}

// fill fills the rogue's store with the genuine pool data until ctx ends,
// as an honest leader does: the gateway's signed pool feed, opened
// through the thief's own tunnel (it leads, so the gateway serves it),
// into the store with the real poolstore.FeedSource; its sync record
// written through the tunnel too.
func (r *rogueLeader) fill(ctx context.Context) {
	poolstore.NewFeedSource(poolstore.FeedSourceOptions{Client: r.client, Records: r.records, Store: r.store,
		Verifier: r.verifier, Pool: r.pool, Node: r.node, Open: r.openFeed}).Run(ctx)
}

// openFeed opens the pool feed on the thief's tunnel.
func (r *rogueLeader) openFeed(ctx context.Context) (io.ReadCloser, error) {
	s, err := r.records.conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	if err := tunnel.WritePoolFeedRequest(s, tunnel.PoolFeedRequest{Pool: r.pool}); err != nil {
		s.CancelRead(0)
		return nil, err
	}
	s.Close()
	if _, err := tunnel.ReadReply(s); err != nil {
		s.CancelRead(0)
		return nil, err
	}
	context.AfterFunc(ctx, func() { s.CancelRead(0) })
	return feedStream{s}, nil
}

// feedStream is a feed's tunnel stream as an io.ReadCloser.
type feedStream struct{ s *quic.Stream }

func (f feedStream) Read(p []byte) (int, error) { return f.s.Read(p) }
func (f feedStream) Close() error               { f.s.CancelRead(0); return nil }

// tamper is an attack on the followers: change alters the rogue's store
// (returning nothing); the rogue then closes it with the last genuine
// attestation of resource, as a thief that cannot sign must, and returns
// the store's revision after it. heal puts the genuine objects back and
// starts a new term, so that the followers take a genuine snapshot
// before the next attack.
func (r *rogueLeader) tamper(t *testing.T, resource string, change func()) (rev uint64, heal func()) {
	t.Helper()
	genuine := map[string][]json.RawMessage{}
	rvs := map[string]uint64{}
	for _, res := range []string{slicesKey, endpointsKey, servicesKey} {
		objs, rv, _, _ := r.store.List(res)
		for _, o := range objs {
			genuine[res] = append(genuine[res], o.Raw)
		}
		rvs[res] = rv
	}
	attest := r.store.Snapshot().Attests[resource]
	p, ok := r.store.Point(resource)
	if attest == nil || !ok {
		t.Fatalf("the rogue's store has no attestation of %s", resource)
	}
	change()
	if err := r.store.ApplyChanges(r.store.Epoch(), []replica.Change{{Rev: r.store.Rev() + 1, Resource: resource,
		Type: replica.Attest, RV: p.To, Object: attest}}); err != nil {
		t.Fatal(err)
	}
	return r.store.Rev(), func() {
		for res, items := range genuine {
			if err := r.store.Replace(res, items, rvs[res]); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.store.StartEpoch(fmt.Sprintf("%s/%d", r.node, time.Now().UnixNano())); err != nil {
			t.Fatal(err)
		}
	}
}

// tampering is one attack on the followers (rogueLeader.attack).
type tampering struct {
	what     string // what must never happen, for Never
	resource string // the resource change tampers with, closed with its last genuine attestation
	ns       string // the namespace whose cloud data the followers must serve after it
	change   func()
	// bad says what an honest follower serves of the tampering ("" for
	// nothing).
	bad func(e *world.Edge) string
	// after, if set, checks more before the rogue heals.
	after func()
}

// attack runs a: the rogue tampers with its store; no honest follower
// may serve it until each took the rogue's revision or edge-h1 (the
// first) refused it; the refusal must be counted; the followers must
// serve the cloud's data of a.ns; then the rogue heals and they take its
// genuine snapshot, ready for the next attack.
func (r *rogueLeader) attack(t *testing.T, ctx context.Context, admin kubernetes.Interface, honest []*world.Edge, a tampering) {
	t.Helper()
	before := refusedTotal(t, honest[0])
	rev, heal := r.tamper(t, a.resource, a.change)
	testenv.Never(t, a.what, func() bool {
		for _, e := range honest {
			if got := a.bad(e); got != "" {
				t.Logf("%s %s", e.Name, got)
				return true
			}
		}
		return false
	}, r.tookOrRefused(ctx, honest, rev, before))
	if after := refusedTotal(t, honest[0]); after <= before {
		t.Errorf("%s's refusals of leaders (%s): %v → %v, want it to grow", honest[0].Name, strings.Join(forgeryRefusals, ", "), before, after)
	}
	for _, e := range honest {
		testenv.EventuallyNoError(t, e.Name+" to serve the cloud's data", func() error { return servesAsCloud(ctx, admin, e, a.ns) })
	}
	if a.after != nil {
		a.after()
	}
	heal()
	r.followed(t, ctx, honest)
}

// followed waits until every follower holds the rogue's replica of its
// current term (after a heal: a genuine snapshot, verified).
func (r *rogueLeader) followed(t *testing.T, ctx context.Context, edges []*world.Edge) {
	t.Helper()
	for _, e := range edges {
		testenv.EventuallyNoError(t, e.Name+" to follow the rogue's new term", func() error {
			st, err := e.Status(ctx)
			if err != nil {
				return err
			}
			if st.Pool == nil || st.Pool.Epoch != r.store.Epoch() || st.Pool.Rev != r.store.Rev() {
				return fmt.Errorf("pool status %+v, the rogue at %s rev %d", st.Pool, r.store.Epoch(), r.store.Rev())
			}
			return nil
		})
	}
}

// leader is whom the rogue's pool listener names as leader: itself
// during its term.
func (r *rogueLeader) leader() string {
	if r.leading() {
		return r.node
	}
	return ""
}

func (r *rogueLeader) leading() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.term
}

// withhold stops fill: the rogue's store keeps its last genuine mark,
// which the replication stream's sync frames carry on, as a leader that
// wants its followers to think nothing changed would.
func (r *rogueLeader) withhold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keep = true
	if r.stopFill != nil {
		r.stopFill()
	}
}

// forgeKubernetes points default/kubernetes (its EndpointSlice and
// Endpoints) at addr and adds a Service default/forged with addr as its
// external IP, in the rogue's store, each at a resourceVersion far above
// the genuine object's (the cloud's later versions of it then look
// older); it returns the store's revision after them.
func (r *rogueLeader) forgeKubernetes(t *testing.T, addr string) uint64 {
	t.Helper()
	raise := func(rv string) string {
		n, _ := strconv.ParseUint(rv, 10, 64)
		return strconv.FormatUint(n+1000000, 10)
	}
	var es discoveryv1.EndpointSlice
	r.edit(t, slicesKey, "default", "kubernetes", &es, func() {
		es.ResourceVersion = raise(es.ResourceVersion)
		for i := range es.Endpoints {
			es.Endpoints[i].Addresses = []string{addr}
		}
	})
	var ep corev1.Endpoints
	r.edit(t, endpointsKey, "default", "kubernetes", &ep, func() {
		ep.ResourceVersion = raise(ep.ResourceVersion)
		for i := range ep.Subsets {
			ep.Subsets[i].Addresses = []corev1.EndpointAddress{{IP: addr}}
		}
	})
	var svc corev1.Service
	r.edit(t, servicesKey, "default", "kubernetes", &svc, func() {
		svc.ResourceVersion = raise(svc.ResourceVersion)
		svc.Name, svc.UID = "forged", "forged"
		ip := netip.MustParseAddr(svc.Spec.ClusterIP)
		for range 77 {
			ip = ip.Next()
		}
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip.String(), []string{ip.String()}
		svc.Spec.ExternalIPs = []string{addr}
	})
	return r.store.Rev()
}

// edit decodes the stored object namespace/name of resource into obj,
// lets change alter it, and applies it to the store as a watch event: one
// Modified, or Added when change renamed it.
func (r *rogueLeader) edit(t *testing.T, resource, namespace, name string, obj metav1.Object, change func()) {
	t.Helper()
	objs, _, _, _ := r.store.List(resource)
	i := slices.IndexFunc(objs, func(o localapi.Object) bool { return o.Namespace == namespace && o.Name == name })
	if i < 0 {
		t.Fatalf("the rogue's store has no %s %s/%s", resource, namespace, name)
	}
	if err := json.Unmarshal(objs[i].Raw, obj); err != nil {
		t.Fatal(err)
	}
	change()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	typ := replica.Modified
	if obj.GetName() != name {
		typ = replica.Added
	}
	if err := r.store.Apply(resource, typ, raw); err != nil {
		t.Fatal(err)
	}
}

// alterService changes the ClusterIP and port of the stored Service
// namespace/name, keeping its resourceVersion, as a relist that found it
// so would; it returns the store's revision after it.
func (r *rogueLeader) alterService(t *testing.T, namespace, name string) uint64 {
	t.Helper()
	return r.replace(t, servicesKey, func(o localapi.Object) (json.RawMessage, bool) {
		if o.Namespace != namespace || o.Name != name {
			return o.Raw, true
		}
		var svc corev1.Service
		if err := json.Unmarshal(o.Raw, &svc); err != nil {
			t.Fatal(err)
		}
		ip := netip.MustParseAddr(svc.Spec.ClusterIP).Next()
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip.String(), []string{ip.String()}
		svc.Spec.Ports[0].Port, svc.Spec.Ports[0].TargetPort = 6666, intstr.FromInt32(6666)
		raw, err := json.Marshal(&svc)
		if err != nil {
			t.Fatal(err)
		}
		return raw, true
	})
}

// deleteSlice drops the stored EndpointSlice namespace/name, as a relist
// that no longer found it would; it returns the store's revision after
// it.
func (r *rogueLeader) deleteSlice(t *testing.T, namespace, name string) uint64 {
	t.Helper()
	return r.replace(t, slicesKey, func(o localapi.Object) (json.RawMessage, bool) {
		return o.Raw, o.Namespace != namespace || o.Name != name
	})
}

// replace relists resource into the rogue's store with each stored object
// as keep returns it (dropped when keep says false), at the resource's
// resourceVersion; it returns the store's revision after it.
func (r *rogueLeader) replace(t *testing.T, resource string, keep func(localapi.Object) (json.RawMessage, bool)) uint64 {
	t.Helper()
	objs, rv, _, ok := r.store.List(resource)
	if !ok {
		t.Fatalf("the rogue's store has no %s", resource)
	}
	var items []json.RawMessage
	for _, o := range objs {
		if raw, ok := keep(o); ok {
			items = append(items, raw)
		}
	}
	if err := r.store.Replace(resource, items, rv); err != nil {
		t.Fatal(err)
	}
	return r.store.Rev()
}

// tookOrRefused is the event after which a follower would serve what the
// rogue put in its store at revision rev: every follower's replica has
// reached rev in the rogue's epoch, or edge-h1 (the first) has counted a
// refusal of a leader beyond refused.
func (r *rogueLeader) tookOrRefused(ctx context.Context, edges []*world.Edge, rev uint64, refused float64) func() bool {
	epoch := r.store.Epoch()
	return func() bool {
		if n, err := metricSum(ctx, edges[0], refusalSeries()); err == nil && n > refused {
			return true
		}
		for _, e := range edges {
			st, err := e.Status(ctx)
			if err != nil || st.Pool == nil || st.Pool.Epoch != epoch || st.Pool.Rev < rev {
				return false
			}
		}
		return true
	}
}

// tunnelRecords writes the pool's records through a node's own tunnel
// (record.Writer), as tether-edge's edgetunnel.PoolRecords does.
type tunnelRecords struct{ conn *quic.Conn }

var _ record.Writer = tunnelRecords{}

func (tr tunnelRecords) WriteRecord(ctx context.Context, wr record.Write) (*corev1.ConfigMap, error) {
	body, err := json.Marshal(wr.ConfigMap)
	if err != nil {
		return nil, err
	}
	req := tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection, Pool: wr.Pool, ConfigMap: body}
	if wr.Create {
		req.Op = tunnel.ElectionCreate
	}
	if wr.Kind == record.KindSync {
		req.Record = tunnel.RecordSync
	}
	rep, err := electionRoundTrip(ctx, tr.conn, req)
	if rep.Code == tunnel.Conflict {
		return nil, apierrors.NewConflict(corev1.Resource("configmaps"), wr.ConfigMap.Name, err)
	}
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := json.Unmarshal(rep.ConfigMap, &cm); err != nil {
		return nil, err
	}
	return &cm, nil
}

// staticMembers are the pool's members as the rogue knows them: node →
// [pool, address].
type staticMembers map[string][2]string

var _ poolstore.Members = staticMembers{}

func (m staticMembers) Pool(node string) (string, bool) {
	v, ok := m[node]
	return v[0], ok
}

func (m staticMembers) Address(node string) (string, bool) {
	v, ok := m[node]
	return v[1], ok
}

// The reasons a follower refuses a leader whose data does not verify
// (tether_edge_pool_leaders_refused_total).
var forgeryRefusals = []string{"unsigned", "unknown_key", "bad_chain", "bad_signature", "root_mismatch", "rollback"}

func refusalSeries() []string {
	var s []string
	for _, reason := range forgeryRefusals {
		s = append(s, fmt.Sprintf(`tether_edge_pool_leaders_refused_total{reason=%q}`, reason))
	}
	return s
}

// refusedTotal is how many times e refused its leader's data as forged.
func refusedTotal(t *testing.T, e *world.Edge) float64 {
	t.Helper()
	n, err := metricSum(context.Background(), e, refusalSeries())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// metricSum is the sum of e's series.
func metricSum(ctx context.Context, e *world.Edge, series []string) (float64, error) {
	body, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
	if err != nil {
		return 0, err
	}
	n := 0.0
	for _, s := range series {
		n += world.Metric(body, s)
	}
	return n, nil
}

// servesAsCloud is nil when e serves kube-proxy the cloud's EndpointSlices
// and Services of ns: the same objects at the same resourceVersions with
// the same addresses and ports.
func servesAsCloud(ctx context.Context, admin kubernetes.Interface, e *world.Edge, ns string) error {
	c := e.ProxyClient(kubeProxyUA)
	var errs []error
	cloudSlices, err := admin.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	edgeSlices, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("%s: %w", e.Name, err)
	}
	if got, want := shapes(edgeSlices.Items, sliceShape), shapes(cloudSlices.Items, sliceShape); !slices.Equal(got, want) {
		errs = append(errs, fmt.Errorf("%s serves the EndpointSlices of %s\n %v\nthe cloud has\n %v", e.Name, ns, got, want))
	}
	cloudSvcs, err := admin.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	edgeSvcs, err := c.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("%s: %w", e.Name, err)
	}
	if got, want := shapes(edgeSvcs.Items, serviceShape), shapes(cloudSvcs.Items, serviceShape); !slices.Equal(got, want) {
		errs = append(errs, fmt.Errorf("%s serves the Services of %s\n %v\nthe cloud has\n %v", e.Name, ns, got, want))
	}
	return errors.Join(errs...)
}

func shapes[T any](items []T, shape func(T) string) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, shape(it))
	}
	slices.Sort(out)
	return out
}

func sliceShape(s discoveryv1.EndpointSlice) string {
	return s.Name + "@" + s.ResourceVersion + " " + sliceAddresses(s)
}

func sliceAddresses(s discoveryv1.EndpointSlice) string {
	var a []string
	for _, ep := range s.Endpoints {
		a = append(a, ep.Addresses...)
	}
	return strings.Join(a, ",")
}

func serviceShape(s corev1.Service) string {
	var ports []string
	for _, p := range s.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
	}
	return fmt.Sprintf("%s@%s %s:%s", s.Name, s.ResourceVersion, s.Spec.ClusterIP, strings.Join(ports, ","))
}

// holds reports whether obj's JSON holds addr.
func holds(obj any, addr string) bool {
	b, _ := json.Marshal(obj)
	return strings.Contains(string(b), `"`+addr+`"`)
}

// kubernetesEndpoints is the cloud's addresses of default/kubernetes,
// sorted.
func kubernetesEndpoints(t *testing.T, ctx context.Context, admin kubernetes.Interface) []string {
	t.Helper()
	l, err := admin.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil || len(l.Items) == 0 {
		t.Fatalf("the cloud's EndpointSlices of default/kubernetes: %d, %v", len(l.Items), err)
	}
	var a []string
	for _, s := range l.Items {
		for _, ep := range s.Endpoints {
			a = append(a, ep.Addresses...)
		}
	}
	slices.Sort(a)
	return slices.Compact(a)
}

// createService makes a ClusterIP Service ns/name with one TCP port.
func createService(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name string, port int32) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(port)}}}}
	if _, err := c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
