package poolfeed

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/internal/pooltest"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/feed"
)

// gatewayName is the name the test gateway's serving certificate is for.
const gatewayName = "gateway.tether.test"

// env is a real apiserver with the gateway's RBAC, and a running Feed
// reading it with the gateway's identity, signing with a serving
// certificate of its own CA.
type env struct {
	*pooltest.Cluster
	feed *Feed
	ca   *testenv.CA
	// serving is the serving certificate the Feed signs with.
	serving atomic.Pointer[testenv.KeyPair]
}

func startFeed(t *testing.T, o Options, before func(*pooltest.Cluster)) *env {
	t.Helper()
	pc := pooltest.Start(t, pooltest.Options{Pools: map[string]string{"edge-1": "shop", "edge-2": "shop", "yard-1": "yard", "loner": ""}})
	if before != nil {
		before(pc)
	}
	kc, err := kube.NewForConfig(pc.RESTConfig(pc.GatewayCert))
	if err != nil {
		t.Fatal(err)
	}
	ca := testenv.MustCA(t, "gateway-ca")
	kp, err := ca.ServerCert("gateway", gatewayName)
	if err != nil {
		t.Fatal(err)
	}
	o.Client = kc
	o.Name = "gateway-0"
	e := &env{Cluster: pc, ca: ca}
	e.serving.Store(kp)
	o.Signer = func() (crypto.Signer, [][]byte, error) {
		kp := e.serving.Load()
		return kp.TLS.PrivateKey.(crypto.Signer), kp.TLS.Certificate, nil
	}
	o.MarkEvery = cmpOr(o.MarkEvery, 200*time.Millisecond)
	o.Registerer = prometheus.NewRegistry()
	f, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(pc.Ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e.feed = f
	return e
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

// subscriber reads a feed as a pool member would: it verifies every
// statement, rebuilds each resource's state and checks it against the
// attested roots.
type subscriber struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan struct{}
	serve  error // Serve's result, once done

	mu      sync.Mutex
	objs    map[string]map[string]json.RawMessage // resource → key → JSON
	to      map[string]uint64
	roots   map[string]map[uint64]feed.Hash // resource → To → attested root
	units   int                             // attestations verified
	marks   []feed.Header                   // verified
	errs    []error
	replace map[string]int // whole-resource units by resource
	// lastMarkKey is the KeyID of the last mark's key.
	lastMarkKey string
}

func (e *env) subscribe(t *testing.T) *subscriber {
	t.Helper()
	v, err := feed.NewVerifier(feed.VerifierOptions{Roots: e.ca.Pool, Names: []string{gatewayName}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.Ctx)
	pr, pw := io.Pipe()
	s := &subscriber{t: t, cancel: cancel, done: make(chan struct{}), objs: map[string]map[string]json.RawMessage{},
		to: map[string]uint64{}, roots: map[string]map[uint64]feed.Hash{}, replace: map[string]int{}}
	go func() {
		s.serve = e.feed.Serve(ctx, pw)
		pw.CloseWithError(s.serve)
		close(s.done)
	}()
	go s.read(feed.NewReader(pr), v)
	t.Cleanup(func() { cancel(); <-s.done; pr.Close() })
	return s
}

func (s *subscriber) fail(format string, args ...any) {
	s.errs = append(s.errs, fmt.Errorf(format, args...))
}

func (s *subscriber) read(rd *feed.Reader, v *feed.Verifier) {
	var unit []feed.Item
	var unitRes string
	var replace bool
	for {
		fr, _, err := rd.Next()
		if err != nil {
			return
		}
		s.mu.Lock()
		switch fr.Type {
		case feed.FrameCerts:
			if err := v.AddChain(fr.Chain); err != nil {
				s.fail("certs: %v", err)
			}
		case feed.FrameMark:
			h, err := v.Open(fr.Mark)
			if err != nil {
				s.fail("mark: %v", err)
				break
			}
			for r, p := range h.Resources {
				if root, ok := s.roots[r][p.To]; ok && root != p.Root {
					s.fail("mark: %s at %d has root %s, attested %s", r, p.To, p.Root, root)
				}
			}
			s.marks = append(s.marks, h)
			s.lastMarkKey = fr.Mark.K
		case feed.FrameUnit:
			if unitRes == "" {
				unitRes, replace = fr.Resource, fr.Replace
			} else if fr.Resource != unitRes || fr.Replace {
				s.fail("unit of %s continued by a frame of %s (replace %v)", unitRes, fr.Resource, fr.Replace)
			}
			unit = append(unit, fr.Items...)
			if fr.Attest.IsZero() {
				break
			}
			h, err := v.Open(fr.Attest)
			if err != nil {
				s.fail("attestation: %v", err)
			}
			s.applyUnit(h, unitRes, replace, unit)
			unit, unitRes, replace = nil, "", false
		}
		s.mu.Unlock()
	}
}

func (s *subscriber) applyUnit(h feed.Header, res string, replace bool, items []feed.Item) {
	if h.Resource != res {
		s.fail("unit of %s attested for %s", res, h.Resource)
	}
	if h.Kind != feed.KindAttest || h.Feed != "gateway-0" {
		s.fail("attestation %+v", h)
	}
	if !replace && h.To <= s.to[res] {
		s.fail("%s: To %d after %d", res, h.To, s.to[res])
	}
	if replace {
		s.objs[res] = map[string]json.RawMessage{}
		s.replace[res]++
	}
	if s.objs[res] == nil {
		s.fail("%s: a change before its whole-resource unit", res)
		s.objs[res] = map[string]json.RawMessage{}
	}
	for _, it := range items {
		var m struct {
			Kind     string            `json:"kind"`
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(it.Object, &m); err != nil || m.Kind == "" {
			s.fail("%s: item %s: kind %q, %v", res, it.Object, m.Kind, err)
			continue
		}
		k := feed.Key(m.Metadata.Namespace, m.Metadata.Name)
		if it.Type == "DELETED" {
			delete(s.objs[res], k)
		} else {
			s.objs[res][k] = it.Object
		}
	}
	tree := feed.NewTree()
	for k, raw := range s.objs[res] {
		tree.Set(k, raw)
	}
	if got := tree.Root(); got != h.Root {
		s.fail("%s at %d: state's root %s, attested %s", res, h.To, got, h.Root)
	}
	s.to[res] = h.To
	if s.roots[res] == nil {
		s.roots[res] = map[uint64]feed.Hash{}
	}
	s.roots[res][h.To] = h.Root
	s.units++
}

// check fails the test with the subscriber's verification errors.
func (s *subscriber) check() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, err := range s.errs {
		s.t.Error(err)
	}
}

// has reports whether the subscriber's state of res has key, with JSON
// that satisfies cond (nil: any).
func (s *subscriber) has(res, key string, cond func(json.RawMessage) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	raw, ok := s.objs[res][key]
	return ok && (cond == nil || cond(raw))
}

// rvs are the keys and resourceVersions of the subscriber's state of res.
func (s *subscriber) rvs(res string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, raw := range s.objs[res] {
		var m struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		json.Unmarshal(raw, &m)
		out[k] = m.Metadata.ResourceVersion
	}
	return out
}

// markCovers reports whether a mark was verified whose every resource is
// at the subscriber's state.
func (s *subscriber) markCovers() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.marks {
		ok := len(m.Resources) == 3
		for r, p := range m.Resources {
			ok = ok && p.To == s.to[r] && p.Root == s.roots[r][s.to[r]]
		}
		if ok {
			return true
		}
	}
	return false
}

const (
	keySlices   = "discovery.k8s.io/v1/endpointslices"
	keyServices = "core/v1/services"
	keyEndpts   = "core/v1/endpoints"
)

func makeObjects(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, n int) {
	t.Helper()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
		if _, err := c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(name, 5), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func endpointSlice(svc string, endpoints int) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-abcde", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for j := range endpoints {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.1.%d.%d", len(svc), j+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("edge-1")})
	}
	return es
}

// listed are the keys and resourceVersions the apiserver lists.
func listed(t *testing.T, ctx context.Context, c kubernetes.Interface) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{keySlices: {}, keyServices: {}, keyEndpts: {}}
	svcs, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range svcs.Items {
		out[keyServices][feed.Key(o.Namespace, o.Name)] = o.ResourceVersion
	}
	eps, err := c.CoreV1().Endpoints("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range eps.Items {
		out[keyEndpts][feed.Key(o.Namespace, o.Name)] = o.ResourceVersion
	}
	ess, err := c.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range ess.Items {
		out[keySlices][feed.Key(o.Namespace, o.Name)] = o.ResourceVersion
	}
	return out
}

// TestFeed: a subscriber gets the whole of every resource, then each
// change as a unit, every attestation and mark verifying against the
// gateway's certificate and every attested root the root of the state it
// rebuilt, which ends equal to what the apiserver lists; a second
// subscriber gets the same.
func TestFeed(t *testing.T) {
	e := startFeed(t, Options{}, func(pc *pooltest.Cluster) { makeObjects(t, pc.Ctx, pc.Client, "app", 20) })
	s1 := e.subscribe(t)
	testenv.Eventually(t, "the first subscriber has every resource and a mark covering them", func() bool {
		s1.mu.Lock()
		n := len(s1.replace)
		s1.mu.Unlock()
		return n == 3 && s1.markCovers()
	})
	if got := s1.rvs(keySlices); len(got) != 20 {
		t.Errorf("%d EndpointSlices in the feed, want 20", len(got))
	}

	// Changes: an update, a create and a delete, each a unit.
	c := e.Client
	svc, err := c.CoreV1().Services("app").Get(e.Ctx, "svc-3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Labels = map[string]string{"changed": "yes"}
	if _, err := c.CoreV1().Services("app").Update(e.Ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.DiscoveryV1().EndpointSlices("app").Delete(e.Ctx, "svc-4-abcde", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices("app").Create(e.Ctx, endpointSlice("svc-new", 3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the changes reach the subscriber", func() bool {
		return s1.has(keyServices, "app/svc-3", func(raw json.RawMessage) bool {
			var o corev1.Service
			return json.Unmarshal(raw, &o) == nil && o.Labels["changed"] == "yes"
		}) && !s1.has(keySlices, "app/svc-4-abcde", nil) && s1.has(keySlices, "app/svc-new-abcde", nil)
	})
	s2 := e.subscribe(t)
	testenv.Eventually(t, "both subscribers at the apiserver's state, covered by a mark", func() bool {
		want := listed(t, e.Ctx, c)
		for _, s := range []*subscriber{s1, s2} {
			for r, rvs := range want {
				if !maps.Equal(s.rvs(r), rvs) {
					return false
				}
			}
			if !s.markCovers() {
				return false
			}
		}
		return true
	})
	s1.check()
	s2.check()
	s1.mu.Lock()
	defer s1.mu.Unlock()
	if s1.replace[keySlices] != 1 || s1.units < 5 {
		t.Errorf("first subscriber: %v whole-resource units, %d units in all; want one of each resource and the changes", s1.replace, s1.units)
	}
}

// TestFeedBehind: a subscriber that does not read while the log moves
// past it is ended with ErrBehind.
func TestFeedBehind(t *testing.T) {
	e := startFeed(t, Options{MaxLogUnits: 4, MarkEvery: time.Hour}, nil)
	pr, pw := io.Pipe()
	defer pr.Close()
	done := make(chan error, 1)
	go func() { done <- e.feed.Serve(e.Ctx, pw) }()
	rd := feed.NewReader(pr)
	// Read the head (certs and three whole resources), then stop reading.
	for i := range 4 {
		if _, _, err := rd.Next(); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	if _, err := e.Client.CoreV1().Namespaces().Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", i)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
		if _, err := e.Client.CoreV1().Services("app").Create(e.Ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// One unit each: the next is made once this one is logged.
		testenv.Eventually(t, "a unit per Service", func() bool {
			n, err := metrictest.Value(e.feed.units, "tether_gateway_pool_feed_units_total", "resource="+keyServices)
			return err == nil && n >= float64(i+2) // the list's, then one each
		})
	}
	// Drain what the pipe holds: the subscriber is ended once the log has
	// moved past it.
	go io.Copy(io.Discard, pr)
	select {
	case err := <-done:
		if !errors.Is(err, ErrBehind) {
			t.Fatalf("Serve: %v, want ErrBehind", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the subscriber that fell behind was not ended")
	}
}

// TestFeedCertRotation: after the serving certificate changes, a
// subscriber gets the new chain before any statement the new key signs,
// and a new subscriber, given only the new chain, verifies all it gets.
func TestFeedCertRotation(t *testing.T) {
	e := startFeed(t, Options{}, func(pc *pooltest.Cluster) { makeObjects(t, pc.Ctx, pc.Client, "app", 3) })
	s1 := e.subscribe(t)
	testenv.Eventually(t, "the first subscriber has a mark", s1.markCovers)
	kp, err := e.ca.ServerCert("gateway", gatewayName)
	if err != nil {
		t.Fatal(err)
	}
	e.serving.Store(kp)
	newKey := feed.KeyID(kp.TLS.Certificate[0])
	signedByNew := func(s *subscriber) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.lastMarkKey == newKey
	}
	testenv.Eventually(t, "a mark signed with the new key reaches the first subscriber", func() bool { return signedByNew(s1) })
	s2 := e.subscribe(t)
	testenv.Eventually(t, "the second subscriber has whole resources and a mark of the new key", func() bool {
		s2.mu.Lock()
		n := len(s2.replace)
		s2.mu.Unlock()
		return n == 3 && signedByNew(s2) && s2.markCovers()
	})
	s1.check()
	s2.check()
}
