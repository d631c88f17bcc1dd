// Package poolfeed is the gateway's side of the signed pool feed (package
// poolstore/feed): each replica list/watches the pool-scope resources
// once for every pool, signs statements about them with its TLS serving
// key, and streams them to the pools' leaders through their tunnels; the
// leaders relay them to their pools' members, who verify them. A node's
// key can then withhold the pool's data, never forge it.
//
// # Data flow
//
// Per resource (Options.Resources; default feed.DefaultResources) a list, then
// a watch from its resourceVersion, relisting on 410 Gone and retrying
// with backoff while the apiserver fails. Each object is encoded once to
// JSON with kind and apiVersion set; those exact bytes are hashed into
// the resource's feed.Tree and sent as the item's Object (the edge hashes
// what it receives: they are never encoded again). The watch's events of
// one resource that arrive within Options.Coalesce (20 ms) make one
// unit; a relist makes one unit of its differences with the state before
// (ADDED, MODIFIED, DELETED with the object's last JSON); a bookmark
// makes none. Every unit is attested: feed.Header{Kind: attest, Resource,
// To: the resourceVersion reached, Root: the tree's root after it},
// signed under the same lock as the tree is updated, so the attestation
// always matches the state, and To strictly increases per resource.
// Every feed.MarkEvery, while every resource is synced, a mark: every
// resource's (To, Root).
//
// # Subscribers
//
// Every unit, mark and certificate frame is encoded once into frame lines
// and appended to a bounded in-memory log (MaxLogUnits entries,
// MaxLogBytes bytes; the oldest go first). A subscriber (Serve) waits
// until every resource is synced, then gets a FrameCerts with the
// current chain, a whole-resource unit per resource (Replace on its first
// frame, every item ADDED, the current attestation on its last), the
// latest mark, and then tails the log. One that falls behind the log's
// start is ended: it subscribes again and starts over with whole
// resources. The serving certificate is read again at each mark tick; a
// new one is put in the log as a FrameCerts before the first statement
// it signs.
//
// Handler answers the edges' pool feed requests for the tunnel server:
// only the pool's current leader is served (gateway/poolcheck), checked
// again every LeaderRecheck while the stream lasts.
package poolfeed

import (
	"bytes"
	"cmp"
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/ticker"
	"github.com/tether-edge/tether/poolstore/feed"
)

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read by older clients; the pool shares it.

// Bounds of the log subscribers tail.
const (
	MaxLogUnits = 16384
	MaxLogBytes = 64 << 20
)

// Options configure a Feed.
type Options struct {
	// Client reads the feed.DefaultResources (in protobuf); Dynamic, if set,
	// any other resource.
	Client  *kube.Client
	Dynamic dynamic.Interface
	// Resources are fed; nil means feed.DefaultResources.
	Resources []schema.GroupVersionResource
	// Name is the replica's feed name (its host or pod name), in every
	// statement.
	Name string
	// Signer returns the current serving key and its chain (DER, leaf
	// first): the certificate the tunnel listener serves by default.
	Signer func() (crypto.Signer, [][]byte, error)
	// MarkEvery is how often a mark is signed; 0 means feed.MarkEvery.
	MarkEvery time.Duration
	// Coalesce is how long a resource's events gather into one unit; 0
	// means 20 ms.
	Coalesce time.Duration
	// MaxLogUnits and MaxLogBytes bound the log; 0 means the package's.
	MaxLogUnits, MaxLogBytes int
	Logger                   *slog.Logger
	Registerer               prometheus.Registerer
}

// Feed list/watches the pool resources, signs and logs their changes, and
// serves them to subscribers. Run runs it; Serve serves one subscriber.
type Feed struct {
	o   Options
	res []*resource
	log *slog.Logger
	*metrics

	mu      sync.Mutex
	key     crypto.Signer // guarded by mu: the signing key, nil until read
	chain   [][]byte      // guarded by mu
	certs   []byte        // guarded by mu: the FrameCerts line of chain
	mark    []byte        // guarded by mu: the latest mark's line
	entries []entry       // guarded by mu: the log
	first   uint64        // guarded by mu: the sequence number of entries[0]
	size    int           // guarded by mu: bytes in entries
	changed chan struct{} // guarded by mu: closed when the log grows or a resource syncs
}

// entry is one unit, mark or certs frame in the log, as encoded lines.
type entry struct {
	lines [][]byte
	size  int
}

// resource is one fed resource; its state is guarded by Feed.mu.
type resource struct {
	key    string
	lw     listWatcher
	synced bool
	listed bool // listed once: its state is known
	objs   map[string]json.RawMessage
	tree   *feed.Tree
	to     uint64
	attest feed.Signed
	snap   [][]byte // the whole-resource unit's lines, nil when stale
}

// New returns a Feed.
func New(o Options) (*Feed, error) {
	if o.Client == nil || o.Signer == nil || o.Name == "" {
		return nil, errors.New("pool feed: a Kubernetes client, a signer and a name are required")
	}
	if len(o.Resources) == 0 {
		o.Resources = feed.DefaultResources
	}
	o.MarkEvery = cmp.Or(o.MarkEvery, feed.MarkEvery)
	o.Coalesce = cmp.Or(o.Coalesce, 20*time.Millisecond)
	o.MaxLogUnits = cmp.Or(o.MaxLogUnits, MaxLogUnits)
	o.MaxLogBytes = cmp.Or(o.MaxLogBytes, MaxLogBytes)
	f := &Feed{o: o, log: o.Logger, changed: make(chan struct{})}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	var keys []string
	for _, gvr := range o.Resources {
		lw, err := newListWatcher(o.Client, o.Dynamic, gvr)
		if err != nil {
			return nil, fmt.Errorf("pool feed of %s: %w", feed.ResourceKey(gvr), err)
		}
		k := feed.ResourceKey(gvr)
		if slices.Contains(keys, k) {
			return nil, fmt.Errorf("pool feed: resource %s given twice", k)
		}
		keys = append(keys, k)
		f.res = append(f.res, &resource{key: k, lw: lw, objs: map[string]json.RawMessage{}, tree: feed.NewTree()})
	}
	var err error
	if f.metrics, err = newMetrics(o.Registerer, keys); err != nil {
		return nil, fmt.Errorf("register pool feed metrics: %w", err)
	}
	return f, nil
}

// Run reads the serving certificate, then list/watches every resource
// and signs marks until ctx ends.
func (f *Feed) Run(ctx context.Context) error {
	for {
		err := f.refreshCert()
		if err == nil {
			break
		}
		f.log.Warn("pool feed: no serving certificate to sign with yet", "err", err)
		if !ticker.Sleep(ctx, nil, time.Second) {
			return nil
		}
	}
	var wg sync.WaitGroup
	for _, r := range f.res {
		wg.Go(func() { f.run(ctx, r) })
	}
	wg.Go(func() { f.marks(ctx) })
	wg.Wait()
	return nil
}

// Synced reports whether every resource is listed and watched.
func (f *Feed) Synced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncedLocked()
}

func (f *Feed) syncedLocked() bool {
	for _, r := range f.res {
		if !r.synced {
			return false
		}
	}
	return true
}

// Ready is Synced as an error, for the gateway's readiness.
func (f *Feed) Ready() error {
	if !f.Synced() {
		return errors.New("pool resources not synced")
	}
	return nil
}

// refreshCert reads the serving certificate and, when it changed, logs a
// FrameCerts.
func (f *Feed) refreshCert() error {
	key, chain, err := f.o.Signer()
	if err != nil {
		return err
	}
	if key == nil || len(chain) == 0 {
		return errors.New("pool feed: the serving certificate has no key or chain")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.chain) > 0 && bytes.Equal(f.chain[0], chain[0]) {
		return nil
	}
	line, err := encodeLine(feed.Frame{Type: feed.FrameCerts, Chain: chain})
	if err != nil {
		return err
	}
	first := f.key == nil
	f.key, f.chain, f.certs = key, chain, line
	if first {
		return nil
	}
	f.log.Info("pool feed: serving certificate changed; statements are signed with the new key", "key", feed.KeyID(chain[0]))
	f.appendLocked(entry{lines: [][]byte{line}, size: len(line)})
	// A new subscriber gets only the new chain: the whole-resource units
	// it starts with carry attestations of the state signed again with
	// the new key, and it waits for the next mark.
	f.mark = nil
	for _, r := range f.res {
		if !r.listed {
			continue
		}
		s, err := feed.Sign(key, chain[0], feed.Header{Kind: feed.KindAttest, Feed: f.o.Name, T: time.Now(),
			Resource: r.key, To: r.to, Root: r.tree.Root()})
		if err != nil {
			return err
		}
		r.attest, r.snap = s, nil
	}
	return nil
}

// marks signs a mark every MarkEvery while every resource is synced, and
// reads the serving certificate again first.
func (f *Feed) marks(ctx context.Context) {
	ticker.Every(ctx, nil, f.o.MarkEvery, func() bool {
		if err := f.refreshCert(); err != nil {
			f.log.Warn("pool feed: cannot read the serving certificate; signing with the previous one", "err", err)
		}
		if err := f.signMark(); err != nil {
			f.log.Error("pool feed: mark not signed", "err", err)
		}
		return true
	})
}

func (f *Feed) signMark() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.syncedLocked() {
		return nil
	}
	h := feed.Header{Kind: feed.KindMark, Feed: f.o.Name, T: time.Now(), Resources: map[string]feed.Point{}}
	for _, r := range f.res {
		h.Resources[r.key] = feed.Point{To: r.to, Root: r.tree.Root()}
	}
	s, err := feed.Sign(f.key, f.chain[0], h)
	if err != nil {
		return err
	}
	line, err := encodeLine(feed.Frame{Type: feed.FrameMark, Mark: s})
	if err != nil {
		return err
	}
	f.mark = line
	f.appendLocked(entry{lines: [][]byte{line}, size: len(line)})
	return nil
}

// appendLocked appends e to the log, drops the oldest entries past the
// bounds and wakes the subscribers. f.mu is held.
func (f *Feed) appendLocked(e entry) {
	f.entries = append(f.entries, e)
	f.size += e.size
	drop := 0
	for len(f.entries)-drop > 1 && (len(f.entries)-drop > f.o.MaxLogUnits || f.size > f.o.MaxLogBytes) {
		f.size -= f.entries[drop].size
		drop++
	}
	if drop > 0 {
		// Not cleared: subscribers may still be writing them (entries
		// never change once appended); append lets the old array go.
		f.entries = f.entries[drop:]
		f.first += uint64(drop)
	}
	f.wakeLocked()
}

func (f *Feed) wakeLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// change is one event of a unit.
type change struct {
	typ string // ADDED, MODIFIED, DELETED
	key string
	raw json.RawMessage
}

// apply applies changes to r as one unit reaching resourceVersion to,
// attests it and logs it. A relist's first list (replace, r not listed
// yet) is attested but not logged: no subscriber is served before it.
func (f *Feed) apply(r *resource, changes []change, to uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(changes) == 0 && to <= r.to && r.listed {
		return nil
	}
	if to <= r.to && r.listed {
		f.log.Warn("pool feed: resourceVersion went back; attesting at the one reached", "resource", r.key, "to", to, "was", r.to)
		to = r.to
	}
	// The objects before, to put back if the unit cannot be signed: the
	// state never moves unattested.
	before := make(map[string]json.RawMessage, len(changes))
	for _, c := range changes {
		if _, seen := before[c.key]; !seen {
			before[c.key] = r.objs[c.key]
		}
		setObject(r, c.key, c.raw, c.typ == string(watch.Deleted))
	}
	s, err := feed.Sign(f.key, f.chain[0], feed.Header{Kind: feed.KindAttest, Feed: f.o.Name, T: time.Now(),
		Resource: r.key, To: to, Root: r.tree.Root()})
	if err != nil {
		for k, raw := range before {
			setObject(r, k, raw, raw == nil)
		}
		return err
	}
	r.to, r.attest, r.snap = to, s, nil
	f.units.WithLabelValues(r.key).Inc()
	if !r.listed {
		r.listed = true
		return nil
	}
	items := make([]feed.Item, len(changes))
	for i, c := range changes {
		items[i] = feed.Item{Type: c.typ, Object: c.raw}
	}
	lines, size, err := unitLines(r.key, false, items, s)
	if err != nil {
		return err
	}
	f.appendLocked(entry{lines: lines, size: size})
	return nil
}

// setObject puts the object of key in r's state, or takes it out.
func setObject(r *resource, key string, raw json.RawMessage, del bool) {
	if del {
		delete(r.objs, key)
		r.tree.Delete(key)
		return
	}
	r.objs[key] = raw
	r.tree.Set(key, raw)
}

// unitLines encodes a unit's frames.
func unitLines(resource string, replace bool, items []feed.Item, attest feed.Signed) ([][]byte, int, error) {
	batches := feed.Batches(items)
	if len(batches) == 0 {
		batches = [][]feed.Item{nil}
	}
	lines := make([][]byte, len(batches))
	size := 0
	for i, b := range batches {
		fr := feed.Frame{Type: feed.FrameUnit, Resource: resource, Replace: replace && i == 0, Items: b}
		if i == len(batches)-1 {
			fr.Attest = attest
		}
		line, err := encodeLine(fr)
		if err != nil {
			return nil, 0, err
		}
		lines[i] = line
		size += len(line)
	}
	return lines, size, nil
}

func encodeLine(fr feed.Frame) ([]byte, error) {
	b, err := json.Marshal(fr)
	if err != nil {
		return nil, fmt.Errorf("encode %s frame: %w", fr.Type, err)
	}
	return append(b, '\n'), nil
}

// snapshotLocked returns r's whole-resource unit, encoded once per state.
func (f *Feed) snapshotLocked(r *resource) ([][]byte, error) {
	if r.snap != nil {
		return r.snap, nil
	}
	keys := make([]string, 0, len(r.objs))
	for k := range r.objs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	items := make([]feed.Item, len(keys))
	for i, k := range keys {
		items[i] = feed.Item{Type: string(watch.Added), Object: r.objs[k]}
	}
	lines, _, err := unitLines(r.key, true, items, r.attest)
	if err != nil {
		return nil, err
	}
	r.snap = lines
	return lines, nil
}

// ErrBehind ends a subscriber that fell behind the log.
var ErrBehind = errors.New("pool feed: subscriber fell behind the log")

// Serve writes the feed to w (feed.Writer's frames) until ctx ends, a
// write fails or w falls behind the log (ErrBehind). It waits until every
// resource is synced before it writes anything.
func (f *Feed) Serve(ctx context.Context, w io.Writer) (err error) {
	f.subscribers.Inc()
	defer f.subscribers.Dec()
	var reason string
	defer func() { f.ended.WithLabelValues(reason).Inc() }()
	head, next, err := f.start(ctx)
	if err != nil {
		reason = endCanceled
		return err
	}
	fw := feed.NewWriter(w)
	write := func(lines [][]byte) error {
		for _, l := range lines {
			if err := fw.WriteLine(l); err != nil {
				return fmt.Errorf("write pool feed: %w", err)
			}
			f.bytes.Add(float64(len(l)))
		}
		return nil
	}
	if err := write(head); err != nil {
		reason = endWrite
		return err
	}
	for {
		f.mu.Lock()
		if next < f.first {
			f.mu.Unlock()
			reason = endBehind
			return ErrBehind
		}
		pending := f.entries[next-f.first:]
		changed := f.changed
		f.mu.Unlock()
		if len(pending) == 0 {
			select {
			case <-ctx.Done():
				reason = endReason(ctx)
				return context.Cause(ctx)
			case <-changed:
			}
			continue
		}
		for _, e := range pending {
			if err := write(e.lines); err != nil {
				reason = endWrite
				if ctx.Err() != nil {
					reason, err = endReason(ctx), context.Cause(ctx)
				}
				return err
			}
			next++
		}
	}
}

// endReason is why ctx ended a subscription.
func endReason(ctx context.Context) string {
	if errors.Is(context.Cause(ctx), errLeadLost) {
		return endNotLeader
	}
	return endCanceled
}

// start waits until every resource is synced and returns the head of a
// subscription (certs, whole resources, latest mark) and the log's
// sequence number that follows it.
func (f *Feed) start(ctx context.Context) ([][]byte, uint64, error) {
	for {
		f.mu.Lock()
		if f.syncedLocked() && f.key != nil {
			break
		}
		changed := f.changed
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, 0, context.Cause(ctx)
		case <-changed:
		}
	}
	defer f.mu.Unlock()
	head := [][]byte{f.certs}
	for _, r := range f.res {
		lines, err := f.snapshotLocked(r)
		if err != nil {
			return nil, 0, err
		}
		head = append(head, lines...)
	}
	if f.mark != nil {
		head = append(head, f.mark)
	}
	return head, f.first + uint64(len(f.entries)), nil
}

// setSynced marks r synced or not, and wakes the subscribers waiting for
// it.
func (f *Feed) setSynced(r *resource, v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r.synced = v
	f.wakeLocked()
}

// listWatcher reads one resource: its objects, encoded with kind and
// apiVersion set.
type listWatcher struct {
	gvk   schema.GroupVersionKind
	list  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error)
	watch func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
}

func newListWatcher(c *kube.Client, dyn dynamic.Interface, gvr schema.GroupVersionResource) (listWatcher, error) {
	switch gvr {
	case feed.DefaultResources[0]:
		i := c.EndpointSlices("")
		return listWatcher{discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch}, nil
	case feed.DefaultResources[1]:
		i := c.Endpoints("")
		return listWatcher{corev1.SchemeGroupVersion.WithKind("Endpoints"),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch}, nil
	case feed.DefaultResources[2]:
		i := c.Services("")
		return listWatcher{corev1.SchemeGroupVersion.WithKind("Service"),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch}, nil
	}
	if dyn == nil {
		return listWatcher{}, errors.New("no dynamic client for it")
	}
	i := dyn.Resource(gvr)
	return listWatcher{schema.GroupVersionKind{}, // unstructured objects carry theirs
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch}, nil
}

// encode returns obj's key and JSON with kind and apiVersion set.
func (lw listWatcher) encode(obj runtime.Object) (string, json.RawMessage, error) {
	if !lw.gvk.Empty() {
		obj.GetObjectKind().SetGroupVersionKind(lw.gvk)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", nil, err
	}
	raw, err := json.Marshal(obj)
	return feed.Key(m.GetNamespace(), m.GetName()), raw, err
}

var errRelist = errors.New("watch expired: relist")

// run lists and watches r until ctx ends, relisting when the watch's
// resourceVersion is too old, retrying with backoff while the apiserver
// does not answer.
func (f *Feed) run(ctx context.Context, r *resource) {
	log := f.log.With("resource", r.key)
	backoff := time.Second
	for ctx.Err() == nil {
		rv, err := f.list(ctx, r)
		for err == nil {
			backoff = time.Second
			rv, err = f.watch(ctx, r, rv)
		}
		f.setSynced(r, false)
		if ctx.Err() != nil {
			return
		}
		if !errors.Is(err, errRelist) {
			log.Warn("pool feed: list/watch failed; relisting", "err", err, "in", backoff)
			if !ticker.Sleep(ctx, nil, backoff+rand.N(backoff/2)) {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}
}

// list lists r and applies the differences with its state as one unit.
func (f *Feed) list(ctx context.Context, r *resource) (string, error) {
	obj, err := r.lw.list(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list: %w", err)
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return "", fmt.Errorf("list: %w", err)
	}
	lm, err := meta.ListAccessor(obj)
	if err != nil {
		return "", fmt.Errorf("list: %w", err)
	}
	rv := lm.GetResourceVersion()
	to, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return "", fmt.Errorf("list: resourceVersion %q: %w", rv, err)
	}
	listed := make(map[string]json.RawMessage, len(items))
	for _, it := range items {
		k, raw, err := r.lw.encode(it)
		if err != nil {
			return "", fmt.Errorf("list: %w", err)
		}
		listed[k] = raw
	}
	f.mu.Lock()
	var changes []change
	for k, raw := range listed {
		old, ok := r.objs[k]
		switch {
		case !ok:
			changes = append(changes, change{string(watch.Added), k, raw})
		case !bytes.Equal(old, raw):
			changes = append(changes, change{string(watch.Modified), k, raw})
		}
	}
	for k, old := range r.objs {
		if _, ok := listed[k]; !ok {
			changes = append(changes, change{string(watch.Deleted), k, old})
		}
	}
	f.mu.Unlock()
	slices.SortFunc(changes, func(a, b change) int { return cmp.Compare(a.key, b.key) })
	if err := f.apply(r, changes, to); err != nil {
		return "", fmt.Errorf("list: %w", err)
	}
	f.setSynced(r, true)
	return rv, nil
}

// watch applies events from rv until the watch ends, the events of one
// Coalesce window as one unit; it returns the last resourceVersion seen,
// errRelist when the apiserver says it is too old.
func (f *Feed) watch(ctx context.Context, r *resource, rv string) (string, error) {
	timeout := int64(300 + rand.N(300))
	w, err := r.lw.watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout})
	if err != nil {
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return rv, errRelist
		}
		return rv, fmt.Errorf("watch: %w", err)
	}
	defer w.Stop()
	var pending []change
	var to uint64
	var window <-chan time.Time
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		err := f.apply(r, pending, to)
		pending, window = nil, nil
		return err
	}
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return rv, ctx.Err()
		case <-window:
			if err := flush(); err != nil {
				return rv, err
			}
			continue
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return rv, flush() // ended (timeout): watch again from rv
		}
		if ev.Type == watch.Error {
			if err := flush(); err != nil {
				return rv, err
			}
			if st := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(st) || apierrors.IsGone(st) {
				return rv, errRelist
			}
			return rv, fmt.Errorf("watch: %v", apierrors.FromObject(ev.Object))
		}
		m, err := meta.Accessor(ev.Object)
		if err != nil {
			return rv, fmt.Errorf("watch: %w", err)
		}
		evRV := m.GetResourceVersion()
		if ev.Type == watch.Bookmark {
			// Nothing changed up to it: resume from it, attest nothing.
			if len(pending) == 0 {
				rv = evRV
			}
			continue
		}
		n, err := strconv.ParseUint(evRV, 10, 64)
		if err != nil {
			return rv, fmt.Errorf("watch: resourceVersion %q: %w", evRV, err)
		}
		k, raw, err := r.lw.encode(ev.Object)
		if err != nil {
			return rv, fmt.Errorf("watch: %w", err)
		}
		pending = append(pending, change{string(ev.Type), k, raw})
		to, rv = n, evRV
		if window == nil {
			window = time.After(f.o.Coalesce)
		}
		if len(pending) >= feed.FrameMaxItems*16 {
			if err := flush(); err != nil {
				return rv, err
			}
		}
	}
}
