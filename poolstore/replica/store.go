// Package replica is a node's copy of its pool's resources: Store, the
// objects in memory, written behind to a bbolt file (FileName in the data
// directory), with the pool's change log in memory. The leader's Source
// fills it, a Follower applies the leader's changes to it, and the
// Handler serves it; this package imports none of them (poolstore's
// README, "Pieces").
package replica

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/internal/boltfile"
	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/poolstore/feed"
)

// FileName is the replica's file in the data directory.
const FileName = "pool.db"

// Event types of the change log: the watch event types, and Bookmark,
// which only raises a resource's resourceVersion.
const (
	Added    = localapi.Added
	Modified = localapi.Modified
	Deleted  = localapi.Deleted
	Bookmark = localapi.Bookmark
	// Attest carries a gateway's signed attestation of the resource's
	// state after the changes before it (Object: the feed.Signed JSON; RV:
	// the resourceVersion attested). It changes no object.
	Attest = "ATTEST"
)

// Errors callers branch on.
var (
	// ErrCompacted: the in-memory change log no longer reaches back to
	// the revision (or resourceVersion) asked for; resync from a
	// snapshot (followers) or relist (watchers, HTTP 410).
	ErrCompacted = errors.New("poolstore: change log compacted past the requested revision")
	// ErrGap: replicated changes do not follow the replica's revision or
	// belong to another epoch; resync from a snapshot.
	ErrGap = errors.New("poolstore: replicated changes do not follow the replica")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("poolstore: store closed")
)

// Change is one entry of the pool's change log, in the leader's order.
type Change struct {
	// Rev is the pool revision: 1, 2, 3... within an epoch.
	Rev uint64 `json:"rev"`
	// Resource is ResourceKey of the object's resource.
	Resource string `json:"resource"`
	Type     string `json:"type"`
	// Namespace and Name identify the object (empty for a Bookmark).
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// RV is the object's resourceVersion in the cloud (a Bookmark's: the
	// resource's).
	RV uint64 `json:"rv"`
	// Object is the object's JSON with kind and apiVersion set; for
	// Deleted, its last state. Empty for a Bookmark.
	Object json.RawMessage `json:"object,omitempty"`
}

// Snapshot is the whole replica at one revision.
type Snapshot struct {
	Epoch string `json:"epoch"`
	Rev   uint64 `json:"rev"`
	// Resources maps each synced resource to its resourceVersion.
	Resources map[string]uint64 `json:"resources"`
	// Objects are Added changes, one per object (their Rev is Rev).
	Objects []Change `json:"objects"`
	// Attests are the resources' last signed attestations (feed.Signed
	// JSON), Mark the last signed mark and Chains the gateway
	// certificate chains that verify them (see trust.go).
	Attests map[string]json.RawMessage `json:"attests,omitempty"`
	Mark    json.RawMessage            `json:"mark,omitempty"`
	Chains  [][][]byte                 `json:"chains,omitempty"`
}

// ResourceKey names a resource in the store and on the wire:
// "<group>/<version>/<resource>", with "core" for the legacy group.
func ResourceKey(gvr schema.GroupVersionResource) string { return feed.ResourceKey(gvr) }

// MaxLog bounds the in-memory change log; when it is full the older half
// is dropped (followers further behind resync from a snapshot, watchers
// further behind relist).
const MaxLog = 16384

// flushDelay is how long changes gather in memory before they are written
// to the file in one transaction: at most four fsyncs a second while
// changes stream in, whatever their rate. The file only needs to be
// recent enough to start from after a restart (a follower resumes from
// the leader, which sends what the file lacks); 50 ms, the delay before,
// meant up to 20 fsyncs a second and 2.4 times the bytes written per
// change, on nodes whose storage is often flash (poolstore's README,
// "Write-behind delay").
const flushDelay = 250 * time.Millisecond

// Store is a node's pool replica: the objects in memory, written through
// to a bbolt file in the background, and the recent change log in memory.
// Its methods are safe for concurrent use.
type Store struct {
	db  *bolt.DB
	log *slog.Logger

	mu        sync.RWMutex
	epoch     string
	rev       uint64
	resources map[string]*resource
	changes   []Change          // the log: revisions logStart..rev
	baseRV    map[string]uint64 // per resource, its RV before changes[0]
	changed   chan struct{}
	syncedAt  time.Time
	closed    bool
	size      int64 // the objects' JSON bytes

	// Pending writes to the file: keys ("resource\x00namespace/name")
	// whose state changed, resources whose RV changed, and whether
	// everything is to be rewritten (after Load).
	dirtyObjs map[string]bool
	dirtyRes  map[string]bool
	rewrite   bool
	// Trust (trust.go): the last signed mark, the gateway chains, and
	// whether they or an attestation are to be written.
	mark       json.RawMessage
	chains     [][][]byte
	dirtyTrust bool
	flush      chan struct{}
	done       chan struct{}
}

type resource struct {
	rv   uint64
	objs map[string]*localapi.Object // by namespace/name
	// tree hashes objs (feed.Tree); attest is the last attestation
	// applied (feed.Signed JSON) and at the point it attests.
	tree   *feed.Tree
	attest json.RawMessage
	at     feed.Point
}

func newResource(rv uint64) *resource {
	return &resource{rv: rv, objs: map[string]*localapi.Object{}, tree: feed.NewTree()}
}

func objKey(namespace, name string) string { return namespace + "/" + name }

// Open opens the replica at path, creating it (and its directory) if
// needed. A file that cannot be read (bbolt refuses it or panics on it,
// its consistency check or schema fails) is moved aside to
// <path>.corrupt-<time>, keeping only the newest such file, and the
// replica starts empty: it is a copy, the leader's snapshot fills it. A
// file locked by another process, or one the operating system will not
// let this process read or write, is an error and stays where it is.
func Open(path string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{log: log, resources: map[string]*resource{}, baseRV: map[string]uint64{},
		changed: make(chan struct{}), dirtyObjs: map[string]bool{}, dirtyRes: map[string]bool{},
		flush: make(chan struct{}, 1), done: make(chan struct{})}
	db, aside, err := boltfile.Open(path, boltfile.Options{Init: s.load})
	if aside != nil {
		log.Error("pool store unreadable: moved aside, starting empty (the leader's snapshot fills it)",
			"path", path, "moved_to", aside.Path, "err", aside.Cause)
		s.rewrite = true
	}
	if err != nil {
		return nil, fmt.Errorf("open pool store %s: %w", path, err)
	}
	s.db = db
	s.size = sizeOf(s.resources)
	for r, res := range s.resources {
		s.baseRV[r] = res.rv
	}
	go s.writer()
	return s, nil
}

// Close flushes pending writes and closes the file.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.flush)
	<-s.done
	return s.db.Close()
}

// Path is the store's file.
func (s *Store) Path() string { return s.db.Path() }

// Epoch is the leader term the replica holds data of.
func (s *Store) Epoch() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.epoch
}

// Rev is the last revision applied.
func (s *Store) Rev() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rev
}

// StartEpoch begins a leader's term: revisions restart at 0, the objects
// are kept (a follower that becomes leader starts from its replica).
func (s *Store) StartEpoch(epoch string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.epoch, s.rev = epoch, 0
	s.resetLog()
	s.rewrite = true // meta changed; cheap next to a term change
	s.notify()
	return nil
}

// Replace applies a complete list of resource (leader): changes for what
// differs from the stored objects, then a Bookmark at listRV. items are
// objects' JSON with kind and apiVersion set.
func (s *Store) Replace(resource string, items []json.RawMessage, listRV uint64) error {
	objs := make(map[string]*localapi.Object, len(items))
	for _, raw := range items {
		o, err := localapi.DecodeObject(raw, "", "")
		if err != nil {
			return fmt.Errorf("list of %s: %w", resource, err)
		}
		objs[objKey(o.Namespace, o.Name)] = o
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	res := s.resource(resource)
	for _, k := range sortedKeys(objs) {
		o := objs[k]
		old := res.objs[k]
		switch {
		case old == nil:
			s.record(resource, res, Change{Type: Added, Namespace: o.Namespace, Name: o.Name, RV: o.RV, Object: o.Raw}, o)
		case old.RV != o.RV || !bytes.Equal(old.Raw, o.Raw):
			s.record(resource, res, Change{Type: Modified, Namespace: o.Namespace, Name: o.Name, RV: o.RV, Object: o.Raw}, o)
		}
	}
	for _, k := range sortedKeys(res.objs) {
		if _, ok := objs[k]; ok {
			continue
		}
		old := res.objs[k]
		// The deletion happened at or before listRV: that is its RV.
		last, err := localapi.WithResourceVersion(old.Raw, listRV, "", "")
		if err != nil {
			last = old.Raw
		}
		s.record(resource, res, Change{Type: Deleted, Namespace: old.Namespace, Name: old.Name, RV: listRV, Object: last}, nil)
	}
	s.record(resource, res, Change{Type: Bookmark, RV: listRV}, nil)
	s.notify()
	return nil
}

// Apply applies one watch event of resource (leader): typ is Added,
// Modified, Deleted or Bookmark; obj the event's object JSON with kind and
// apiVersion set. An event not newer than the stored object is ignored.
func (s *Store) Apply(resource, typ string, obj json.RawMessage) error {
	o, err := decodeEvent(typ, obj)
	if err != nil {
		return fmt.Errorf("%s event of %s: %w", typ, resource, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	res := s.resource(resource)
	k := objKey(o.Namespace, o.Name)
	old := res.objs[k]
	switch typ {
	case Bookmark:
		if o.RV <= res.rv {
			return nil
		}
		s.record(resource, res, Change{Type: Bookmark, RV: o.RV}, nil)
	case Added, Modified:
		if old != nil && old.RV >= o.RV {
			return nil
		}
		t := Modified
		if old == nil {
			t = Added
		}
		s.record(resource, res, Change{Type: t, Namespace: o.Namespace, Name: o.Name, RV: o.RV, Object: o.Raw}, o)
	case Deleted:
		if old == nil {
			if o.RV > res.rv {
				s.record(resource, res, Change{Type: Bookmark, RV: o.RV}, nil)
			}
			return nil
		}
		s.record(resource, res, Change{Type: Deleted, Namespace: o.Namespace, Name: o.Name, RV: o.RV, Object: o.Raw}, nil)
	default:
		return fmt.Errorf("event of %s: unknown type %q", resource, typ)
	}
	s.notify()
	return nil
}

// decodeEvent reads a watch event's object; a BOOKMARK's has no name,
// only its resourceVersion is read.
func decodeEvent(typ string, obj json.RawMessage) (*localapi.Object, error) {
	if typ != Bookmark {
		return localapi.DecodeObject(obj, "", "")
	}
	b, err := localapi.ReadBookmark(obj)
	return &localapi.Object{RV: b.RV}, err
}

// Load replaces the replica with a leader's snapshot (follower).
func (s *Store) Load(snap Snapshot) error {
	resources, err := decodeSnapshot(snap)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.epoch, s.rev, s.resources = snap.Epoch, snap.Rev, resources
	s.mark, s.chains, s.dirtyTrust = snap.Mark, snap.Chains, true
	s.size = sizeOf(resources)
	s.resetLog()
	s.rewrite = true
	s.notify()
	return nil
}

// ApplyChanges applies replicated changes (follower). It returns ErrGap,
// changing nothing, unless epoch is the replica's and cs starts at
// Rev()+1 and is contiguous.
func (s *Store) ApplyChanges(epoch string, cs []Change) error {
	if len(cs) == 0 {
		return nil
	}
	objs, err := decodeChanges(cs)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if epoch != s.epoch {
		return fmt.Errorf("%w: epoch %q, replica has %q", ErrGap, epoch, s.epoch)
	}
	for i, c := range cs {
		if c.Rev != s.rev+1+uint64(i) {
			return fmt.Errorf("%w: change %d where %d was due", ErrGap, c.Rev, s.rev+1+uint64(i))
		}
	}
	for i, c := range cs {
		res := s.resource(c.Resource)
		s.record(c.Resource, res, c, objs[i])
	}
	s.notify()
	return nil
}

// decodeChanges checks replicated changes and decodes the objects of
// Added and Modified ones; nothing of a bad batch is applied.
func decodeChanges(cs []Change) ([]*localapi.Object, error) {
	objs := make([]*localapi.Object, len(cs))
	for i, c := range cs {
		switch c.Type {
		case Added, Modified:
			o, err := localapi.DecodeObject(c.Object, "", "")
			if err != nil {
				return nil, fmt.Errorf("change %d: %w", c.Rev, err)
			}
			if o.Namespace != c.Namespace || o.Name != c.Name {
				return nil, fmt.Errorf("change %d: object %s/%s under key %s/%s", c.Rev, o.Namespace, o.Name, c.Namespace, c.Name)
			}
			if o.RV != c.RV {
				return nil, fmt.Errorf("change %d: object %s/%s at resourceVersion %d, the change says %d", c.Rev, o.Namespace, o.Name, o.RV, c.RV)
			}
			objs[i] = o
		case Deleted, Bookmark, Attest:
		default:
			return nil, fmt.Errorf("change %d: unknown type %q", c.Rev, c.Type)
		}
		if c.Resource == "" {
			return nil, fmt.Errorf("change %d: no resource", c.Rev)
		}
	}
	return objs, nil
}

// decodeSnapshot checks a snapshot and builds the resources it holds.
func decodeSnapshot(snap Snapshot) (map[string]*resource, error) {
	resources := make(map[string]*resource, len(snap.Resources))
	for r, rv := range snap.Resources {
		resources[r] = newResource(rv)
	}
	for _, c := range snap.Objects {
		res := resources[c.Resource]
		if res == nil {
			return nil, fmt.Errorf("snapshot: object %s/%s of resource %s it does not list", c.Namespace, c.Name, c.Resource)
		}
		o, err := localapi.DecodeObject(c.Object, "", "")
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		if o.RV > res.rv {
			return nil, fmt.Errorf("snapshot: object %s/%s newer than its resource", o.Namespace, o.Name)
		}
		res.objs[objKey(o.Namespace, o.Name)] = o
		res.tree.Set(objKey(o.Namespace, o.Name), o.Raw)
	}
	for r, raw := range snap.Attests {
		res := resources[r]
		if res == nil {
			return nil, fmt.Errorf("snapshot: attestation of resource %s it does not list", r)
		}
		h, err := readHeader(raw)
		if err != nil {
			return nil, fmt.Errorf("snapshot: attestation of %s: %w", r, err)
		}
		res.attest, res.at = raw, feed.Point{To: h.To, Root: h.Root}
	}
	return resources, nil
}

// Snapshot returns the whole replica.
func (s *Store) Snapshot() Snapshot {
	s.mu.RLock()
	defer s.mu.RUnlock()
	snap := Snapshot{Epoch: s.epoch, Rev: s.rev, Resources: make(map[string]uint64, len(s.resources)),
		Attests: map[string]json.RawMessage{}, Mark: s.mark, Chains: s.chains}
	for _, r := range sortedKeys(s.resources) {
		res := s.resources[r]
		snap.Resources[r] = res.rv
		if res.attest != nil {
			snap.Attests[r] = res.attest
		}
		for _, k := range sortedKeys(res.objs) {
			o := res.objs[k]
			snap.Objects = append(snap.Objects, Change{Rev: s.rev, Resource: r, Type: Added,
				Namespace: o.Namespace, Name: o.Name, RV: o.RV, Object: o.Raw})
		}
	}
	return snap
}

// Since returns the changes after rev, up to Rev(), in order; ErrCompacted
// when the log no longer holds rev+1.
func (s *Store) Since(rev uint64) ([]Change, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if rev >= s.rev {
		return nil, nil
	}
	start := s.rev + 1 - uint64(len(s.changes)) // rev of changes[0]
	if rev+1 < start {
		return nil, ErrCompacted
	}
	return slices.Clone(s.changes[rev+1-start:]), nil
}

// History returns the changes of resource whose RV is above afterRV, in
// order, and the revision they reach (Rev() at the call); ErrCompacted
// when the log cannot tell all of them.
func (s *Store) History(resource string, afterRV uint64) ([]Change, uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	res := s.resources[resource]
	if res == nil || afterRV >= res.rv {
		return nil, s.rev, nil
	}
	if afterRV < s.baseRV[resource] {
		return nil, s.rev, ErrCompacted
	}
	var out []Change
	for _, c := range s.changes {
		if c.Resource == resource && c.RV > afterRV && c.Type != Attest {
			out = append(out, c)
		}
	}
	return out, s.rev, nil
}

// Changed is closed at the next change of the replica (an applied change,
// a load, a new epoch, a sync mark).
func (s *Store) Changed() <-chan struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.changed
}

// List returns the objects of resource sorted by namespace and name, the
// resource's resourceVersion and the revision the list is consistent
// with; ok is false if the resource was never synced.
func (s *Store) List(resource string) (objs []localapi.Object, rv, rev uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	res := s.resources[resource]
	if res == nil {
		return nil, 0, s.rev, false
	}
	objs = make([]localapi.Object, 0, len(res.objs))
	for _, k := range sortedKeys(res.objs) {
		objs = append(objs, *res.objs[k])
	}
	return objs, res.rv, s.rev, true
}

// Resources lists the synced resources with their resourceVersion.
func (s *Store) Resources() map[string]uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m := make(map[string]uint64, len(s.resources))
	for r, res := range s.resources {
		m[r] = res.rv
	}
	return m
}

// Has reports whether resource was ever synced into the replica.
func (s *Store) Has(resource string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.resources[resource] != nil
}

// Len is the number of objects in the replica.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, res := range s.resources {
		n += len(res.objs)
	}
	return n
}

// Bytes is the size of the replica's objects, their JSON.
func (s *Store) Bytes() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.size
}

// sizeOf is the size of the objects' JSON in resources.
func sizeOf(resources map[string]*resource) int64 {
	var n int64
	for _, res := range resources {
		for _, o := range res.objs {
			n += int64(len(o.Raw))
		}
	}
	return n
}

// MarkSynced records that the leader's watches were all synced at t (on
// the leader itself, or as a sync frame of the replication stream).
func (s *Store) MarkSynced(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || t.Equal(s.syncedAt) {
		return
	}
	s.syncedAt = t
	s.notify()
}

// SyncedAt is the last MarkSynced time (zero if none since Open).
func (s *Store) SyncedAt() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.syncedAt
}

// Digest is a hash of the replica's content (resources, their
// resourceVersions, objects), independent of epoch and revision: two
// replicas with equal digests serve the same answers.
func (s *Store) Digest() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h := sha256.New()
	var n [8]byte
	for _, r := range sortedKeys(s.resources) {
		res := s.resources[r]
		binary.BigEndian.PutUint64(n[:], res.rv)
		fmt.Fprintf(h, "%s\x00%x\x00", r, n)
		for _, k := range sortedKeys(res.objs) {
			o := res.objs[k]
			binary.BigEndian.PutUint64(n[:], uint64(len(o.Raw)))
			h.Write([]byte(k))
			h.Write(n[:])
			h.Write(o.Raw)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// resource returns the named resource, creating it. s.mu is held.
func (s *Store) resource(name string) *resource {
	res := s.resources[name]
	if res == nil {
		res = newResource(0)
		s.resources[name] = res
		s.dirtyRes[name] = true
	}
	return res
}

// record applies c to res (o is the object for Added and Modified),
// assigns it the next revision unless it has one (replicated changes),
// logs it and marks it for the file. s.mu is held.
func (s *Store) record(name string, res *resource, c Change, o *localapi.Object) {
	if c.Rev == 0 {
		c.Rev = s.rev + 1
	}
	c.Resource = name
	s.rev = c.Rev
	k := objKey(c.Namespace, c.Name)
	switch c.Type {
	case Added, Modified, Deleted:
		if old := res.objs[k]; old != nil {
			s.size -= int64(len(old.Raw))
		}
		if c.Type == Deleted {
			delete(res.objs, k)
			res.tree.Delete(k)
		} else {
			res.objs[k] = o
			res.tree.Set(k, o.Raw)
			s.size += int64(len(o.Raw))
		}
		s.dirtyObjs[name+"\x00"+k] = true
	case Attest:
		// A follower commits an older attestation only of the same
		// content: the point never goes back.
		if res.attest == nil || c.RV >= res.at.To {
			res.attest, res.at = c.Object, feed.Point{To: c.RV, Root: res.tree.Root()}
			s.dirtyTrust = true
		}
	}
	if c.RV > res.rv {
		res.rv = c.RV
		s.dirtyRes[name] = true
	}
	if len(s.changes) == MaxLog {
		drop := s.changes[:MaxLog/2]
		for _, d := range drop {
			s.baseRV[d.Resource] = max(s.baseRV[d.Resource], d.RV)
		}
		s.changes = append(s.changes[:0], s.changes[MaxLog/2:]...)
	}
	s.changes = append(s.changes, c)
}

// resetLog empties the change log: what a watcher or follower saw before
// is no longer comparable. s.mu is held.
func (s *Store) resetLog() {
	s.changes = nil
	s.baseRV = make(map[string]uint64, len(s.resources))
	for r, res := range s.resources {
		s.baseRV[r] = res.rv
	}
}

// notify wakes those waiting on Changed and the file writer. s.mu is
// held.
func (s *Store) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
	select {
	case s.flush <- struct{}{}:
	default:
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
