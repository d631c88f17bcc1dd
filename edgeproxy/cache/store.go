package cache

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/internal/boltfile"
	"github.com/tether-edge/tether/internal/localapi"
)

// FileName is the store's file in the data directory.
const FileName = "apiserver-cache.db"

// SchemaVersion is the version of the bucket tree (internal/localapi/README.md).
const SchemaVersion = "2"

var (
	bucketMeta      = []byte("meta")
	bucketResources = []byte("resources")
	bucketObjects   = []byte("objects")
	bucketQueue     = []byte("queue")
	keySchema       = []byte("schema-version")
)

const (
	flagObject    byte = 1
	flagTombstone byte = 2
	flagLocal     byte = 3 // an object as answered offline by the proxy
	headerLen          = 9

	// maxBatch bounds the updates committed in one transaction.
	maxBatch = 512
	// lockTimeout is how long Open waits for another process's lock.
	lockTimeout = 2 * time.Second
)

// ErrClosed is returned by writes submitted after Close.
var ErrClosed = errors.New("cache closed")

// errUnchanged rolls back a batch that changed nothing.
var errUnchanged = errors.New("unchanged")

// Store is the bbolt file. Its methods are safe for concurrent use.
type Store struct {
	db    *file
	path  string
	log   *slog.Logger
	clock clock.PassiveClock

	mu     sync.RWMutex // held for reading to submit, for writing to close
	closed bool
	ops    chan op
	done   chan struct{}
	dirty  bool // the batch being applied changed something (writer only)

	// The queue's usage as committed (queue) and within the batch being
	// applied (qtx, writer only), and its bounds; qmu guards queue and
	// the bounds.
	qmu        sync.Mutex
	queue, qtx queueUsage
	maxWrites  int
	maxBytes   int64

	// The size bound, tombstone expiry and compaction (bound.go,
	// compact.go); the writer's.
	upkeep upkeep

	// MovedAside is the name a corrupt file was renamed to by Open, or "".
	MovedAside string
}

// file is the open bbolt file. Compaction replaces it with a compacted
// copy: transactions hold mu for reading, the swap holds it for writing
// (for as long as a rename takes). Only the writer swaps, updates and
// reads the embedded DB's settings.
type file struct {
	mu sync.RWMutex
	*bolt.DB
}

func (f *file) View(fn func(*bolt.Tx) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.DB.View(fn)
}

func (f *file) Update(fn func(*bolt.Tx) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.DB.Update(fn)
}

func (f *file) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.DB.Close()
}

// op is one write: apply runs inside the batch's transaction; done, if
// not nil, receives its result once the batch is committed.
type op struct {
	apply func(tx *bolt.Tx) error
	done  chan error
}

// Options configure OpenWith.
type Options struct {
	Logger *slog.Logger
	// MaxSize bounds the bytes of the file's pages that hold data; 0 is
	// no bound. Past it whole resources are evicted (bound.go); queued
	// writes never are. DefaultMaxSize is tether-edge's default.
	MaxSize int64
	// TombstoneTTL is how long a tombstone is kept (0:
	// DefaultTombstoneTTL; negative: until a complete list removes it).
	TombstoneTTL time.Duration
	// Clock tells the time of tombstones, of resources' updates and of
	// compactions (default: the real clock).
	Clock clock.PassiveClock

	noCompact bool // tests and benchmarks: never compact
}

// Open opens the store at path, creating it (and its directory) if
// needed, without a size bound. A file that cannot be read is moved
// aside and replaced (see the package doc); a file locked by another
// process, or one the operating system will not let it read or write, is
// an error.
func Open(path string, log *slog.Logger) (*Store, error) {
	return OpenWith(path, Options{Logger: log})
}

// OpenWith is Open with options. It removes what an interrupted
// compaction left, and compacts the file first when that is worth it.
func OpenWith(path string, o Options) (*Store, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	s := &Store{path: path, log: log, clock: o.Clock, ops: make(chan op, 1024), done: make(chan struct{}),
		maxWrites: DefaultMaxQueuedWrites, maxBytes: DefaultMaxQueuedBytes}
	s.upkeep.init(o, s.clock.Now())
	db, aside, err := boltfile.Open(path, boltfile.Options{Bolt: boltOptions(), Init: initFile})
	var schemaErr *schemaError
	switch {
	case aside != nil && err == nil && errors.As(aside.Cause, &schemaErr):
		n, cerr := carryQueue(db, aside.Path)
		if cerr != nil {
			db.Close()
			return nil, restore(path, aside.Path, fmt.Errorf("%w: cache %s (%v) holds status writes queued offline that this build cannot read (%w); "+
				"tether-edge does not start rather than drop them: run the tether-edge that wrote the file until the cloud is reachable "+
				"and the queue is replayed (tether_edge_apiserver_queue_length 0), or move the file away to drop them",
				ErrQueueNotCarried, path, schemaErr, cerr))
		}
		log.Warn("cache schema changed: starting with an empty cache, queued status writes carried over",
			"path", path, "old_file", aside.Path, "from", schemaErr.found, "to", SchemaVersion, "queued", n)
		s.MovedAside = aside.Path
	case aside != nil:
		log.Error("cache file unreadable: moved aside, starting with an empty cache (status writes queued in it are lost)",
			"path", path, "moved_to", aside.Path, "err", aside.Cause)
		s.MovedAside = aside.Path
	}
	if err != nil {
		return nil, fmt.Errorf("open cache %s: %w", path, err)
	}
	removeCompactLeftover(path, log) // under the file's lock: no other process is compacting it
	s.db = &file{DB: db}
	var ledger Ledger
	var lerr error
	db.View(func(tx *bolt.Tx) error {
		s.queue = countQueue(tx)
		ledger, lerr = readLedger(tx)
		return nil
	})
	switch {
	case lerr != nil:
		log.Error("cache: the queue's ledger does not read; the queue itself is whole", "path", path, "err", lerr)
	case !ledger.Balanced():
		log.Error("cache: the queue's ledger does not balance (a build without the ledger wrote the file since?)", "path", path, "ledger", ledger.String())
	case ledger.Unconfirmed > 0:
		log.Info("cache: queued status writes were being sent when the process ended; their next send counts as resent",
			"path", path, "writes", ledger.Unconfirmed)
	}
	s.maintain()
	go s.run()
	return s, nil
}

// boltOptions are the options the file is opened with.
func boltOptions() bolt.Options {
	return bolt.Options{Timeout: lockTimeout, FreelistType: bolt.FreelistMapType}
}

// initFile creates the buckets of a new file and checks the schema
// version of an old one.
func initFile(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		if tx.Bucket(bucketObjects) != nil || tx.Bucket(bucketQueue) != nil {
			return &schemaError{}
		}
		var err error
		if meta, err = tx.CreateBucket(bucketMeta); err != nil {
			return err
		}
		if err := meta.Put(keySchema, []byte(SchemaVersion)); err != nil {
			return err
		}
	} else if v := meta.Get(keySchema); string(v) != SchemaVersion {
		return &schemaError{found: string(v)}
	}
	for _, b := range [][]byte{bucketResources, bucketObjects, bucketQueue, bucketTokens} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return initLedger(tx)
}

// Close waits for submitted writes and closes the file.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.ops)
	s.mu.Unlock()
	<-s.done
	return s.db.Close()
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

// submit hands o to the writer; it blocks while the writer is behind.
func (s *Store) submit(o op) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	s.ops <- o
	return nil
}

// write submits apply and waits until it is committed.
func (s *Store) write(apply func(tx *bolt.Tx) error) error {
	done := make(chan error, 1)
	if err := s.submit(op{apply: apply, done: done}); err != nil {
		return err
	}
	return <-done
}

// Sync waits until every write submitted before it is committed.
func (s *Store) Sync() error { return s.write(nil) }

// run is the writer: it commits ops in batches, in order, and after each
// batch, and every minute when idle, keeps the file within its bounds.
func (s *Store) run() {
	defer close(s.done)
	tick := time.NewTicker(upkeepEvery)
	defer tick.Stop()
	for {
		select {
		case first, ok := <-s.ops:
			if !ok {
				return
			}
			s.commit(first)
			s.maintain()
		case <-tick.C:
			s.maintain()
		case done := <-s.upkeep.compactNow:
			done <- s.compact(s.usage())
			s.maintain()
		}
	}
}

// commit applies first and the ops waiting behind it, up to maxBatch, in
// one transaction.
func (s *Store) commit(first op) {
	batch := []op{first}
fill:
	for len(batch) < maxBatch {
		select {
		case o, ok := <-s.ops:
			if !ok {
				break fill
			}
			batch = append(batch, o)
		default:
			break fill
		}
	}
	errs := make([]error, len(batch))
	s.dirty = false
	s.qmu.Lock()
	s.qtx = s.queue
	s.qmu.Unlock()
	err := s.db.Update(func(tx *bolt.Tx) error {
		for i, o := range batch {
			if o.apply != nil {
				errs[i] = o.apply(tx)
			}
		}
		if !s.dirty {
			return errUnchanged // roll back: no commit, no fsync
		}
		return nil
	})
	if errors.Is(err, errUnchanged) {
		err = nil
	} else if err == nil {
		s.qmu.Lock()
		s.queue = s.qtx
		s.qmu.Unlock()
	}
	if err != nil {
		s.log.Error("cache write failed; updates in this batch are lost", "err", err, "updates", len(batch))
	}
	for i, o := range batch {
		if err != nil {
			errs[i] = err
		}
		if o.done != nil {
			o.done <- errs[i]
		} else if errs[i] != nil && err == nil {
			s.log.Warn("cache update failed", "err", errs[i])
		}
	}
}

// objectsBucket returns the bucket of one component's resource, nil if
// there is none.
func objectsBucket(tx *bolt.Tx, component string, gvr schema.GroupVersionResource) *bolt.Bucket {
	c := tx.Bucket(bucketObjects).Bucket([]byte(component))
	if c == nil {
		return nil
	}
	return c.Bucket(resourceKey(gvr))
}

// createObjectsBucket returns the bucket of one component's resource,
// creating it if need be (in a read-write transaction).
func createObjectsBucket(tx *bolt.Tx, component string, gvr schema.GroupVersionResource) (*bolt.Bucket, error) {
	c, err := tx.Bucket(bucketObjects).CreateBucketIfNotExists([]byte(component))
	if err != nil {
		return nil, err
	}
	return c.CreateBucketIfNotExists(resourceKey(gvr))
}

// A record is: flag (1 byte), resourceVersion (8 bytes big-endian), the
// length of the meta section (4 bytes big-endian), the meta section (what
// lists and selectors need, so that they never decode the object), the
// object's JSON. A tombstone has no meta and no object.
//
// The meta section is a sequence of strings, each a uvarint length and
// the bytes: kind, apiVersion, namespace, name, uid, the number of labels
// (as a decimal string) and each label's key and value, the number of
// indexed fields and each field's path and value (see indexedFields;
// absent fields are there with "").
const recordHeaderLen = headerLen + 4

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendMap(b []byte, m map[string]string) []byte {
	b = appendString(b, strconv.Itoa(len(m)))
	for k, v := range m {
		b = appendString(appendString(b, k), v)
	}
	return b
}

func encodeRecord(flag byte, o *localapi.Object) []byte {
	b := make([]byte, recordHeaderLen, recordHeaderLen+256+len(o.Raw))
	b[0] = flag
	binary.BigEndian.PutUint64(b[1:], o.RV)
	if flag == flagTombstone {
		return b
	}
	for _, s := range []string{o.Kind, o.APIVersion, o.Namespace, o.Name, o.UID} {
		b = appendString(b, s)
	}
	b = appendMap(b, o.Labels)
	b = appendMap(b, indexFields(o))
	binary.BigEndian.PutUint32(b[headerLen:], uint32(len(b)-recordHeaderLen))
	return append(b, o.Raw...)
}

// encodeTombstone is the record of a deletion at rv: its meta section is
// the time of the deletion (Unix seconds, 8 bytes big-endian), for
// tombstones to expire; tombstones of older versions have none.
func encodeTombstone(rv uint64, at time.Time) []byte {
	b := make([]byte, recordHeaderLen+8)
	b[0] = flagTombstone
	binary.BigEndian.PutUint64(b[1:], rv)
	binary.BigEndian.PutUint32(b[headerLen:], 8)
	binary.BigEndian.PutUint64(b[recordHeaderLen:], uint64(at.Unix()))
	return b
}

// deletedAt is a tombstone's time, if it has one.
func (r record) deletedAt() (time.Time, bool) {
	if r.flag != flagTombstone || len(r.meta) != 8 {
		return time.Time{}, false
	}
	return time.Unix(int64(binary.BigEndian.Uint64(r.meta)), 0), true
}

// record is a decoded record; meta and raw point into the value.
type record struct {
	flag      byte
	rv        uint64
	meta, raw []byte
}

// decodeRecord splits a record; ok is false for a malformed one.
func decodeRecord(v []byte) (r record, ok bool) {
	if len(v) < recordHeaderLen || v[0] < flagObject || v[0] > flagLocal {
		return r, false
	}
	n := int(binary.BigEndian.Uint32(v[headerLen:]))
	if recordHeaderLen+n > len(v) {
		return r, false
	}
	return record{flag: v[0], rv: binary.BigEndian.Uint64(v[1:headerLen]),
		meta: v[recordHeaderLen : recordHeaderLen+n], raw: v[recordHeaderLen+n:]}, true
}

// metaReader reads the strings of a meta section.
type metaReader struct {
	b   []byte
	err error
}

func (m *metaReader) string() string {
	n, k := binary.Uvarint(m.b)
	if k <= 0 || uint64(len(m.b)-k) < n {
		m.err = errors.New("malformed record meta")
		m.b = nil
		return ""
	}
	s := string(m.b[k : k+int(n)])
	m.b = m.b[k+int(n):]
	return s
}

func (m *metaReader) stringMap() map[string]string {
	n, err := strconv.Atoi(m.string())
	if err != nil || n < 0 || n > len(m.b) {
		if m.err == nil {
			m.err = errors.New("malformed record meta")
		}
		return nil
	}
	if n == 0 {
		return nil
	}
	out := make(map[string]string, n)
	for range n {
		k := m.string()
		out[k] = m.string()
	}
	return out
}

// object returns the record's object from its meta section. Its Raw
// points into the record: clone it before the transaction ends.
func (r record) object() (*localapi.Object, error) {
	m := metaReader{b: r.meta}
	o := &localapi.Object{Kind: m.string(), APIVersion: m.string(), Namespace: m.string(), Name: m.string(), UID: m.string(), RV: r.rv, Raw: r.raw}
	o.Labels = m.stringMap()
	o.Indexed = m.stringMap()
	if m.err != nil {
		return nil, m.err
	}
	return o, nil
}

// resourceInfo reads a resource's info (zero if none).
func resourceInfo(tx *bolt.Tx, component string, gvr schema.GroupVersionResource) (ResourceInfo, bool) {
	return resourceInfoAt(tx, component, resourceKey(gvr))
}

// resourceInfoAt reads the info of the resource of that key.
func resourceInfoAt(tx *bolt.Tx, component string, key []byte) (ResourceInfo, bool) {
	var info ResourceInfo
	c := tx.Bucket(bucketResources).Bucket([]byte(component))
	if c == nil {
		return info, false
	}
	v := c.Get(key)
	if v == nil {
		return info, false
	}
	return info, json.Unmarshal(v, &info) == nil
}

// noteResource records kind and apiVersion (when given) and raises MaxRV.
func (s *Store) noteResource(tx *bolt.Tx, component string, gvr schema.GroupVersionResource, kind, apiVersion string, rv uint64) error {
	info, found := resourceInfo(tx, component, gvr)
	changed := !found
	if kind != "" && (info.Kind != kind || info.APIVersion != apiVersion) {
		info.Kind, info.APIVersion, changed = kind, apiVersion, true
	}
	if rv > info.MaxRV {
		info.MaxRV, changed = rv, true
	}
	if now := s.clock.Now().Unix(); changed || now-info.Updated >= 60 {
		info.Updated, changed = now, true
	}
	if !changed {
		return nil
	}
	s.dirty = true
	c, err := tx.Bucket(bucketResources).CreateBucketIfNotExists([]byte(component))
	if err != nil {
		return err
	}
	v, err := json.Marshal(info)
	if err != nil {
		return err
	}
	return c.Put(resourceKey(gvr), v)
}

// Get returns a copy of the cached object, or nil if there is none.
func (s *Store) Get(component string, gvr schema.GroupVersionResource, namespace, name string) (*localapi.Object, error) {
	var o *localapi.Object
	err := s.db.View(func(tx *bolt.Tx) error {
		b := objectsBucket(tx, component, gvr)
		if b == nil {
			return nil
		}
		r, ok := decodeRecord(b.Get([]byte(namespace + "/" + name)))
		if !ok || r.flag == flagTombstone {
			return nil
		}
		var err error
		if o, err = r.object(); err != nil {
			return err
		}
		o.Raw = bytes.Clone(o.Raw)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read cache: %w", err)
	}
	return o, nil
}

// List returns copies of the cached objects of a resource in scope, and
// what the cache knows of the resource; found is false when the
// component never cached this resource, or when it was evicted and no
// complete list has filled it again since (see Info).
func (s *Store) List(component string, gvr schema.GroupVersionResource, scope Scope) (items []*localapi.Object, info ResourceInfo, found bool, err error) {
	info, found, err = s.Scan(component, gvr, scope, func(o *localapi.Object) {
		o.Raw = bytes.Clone(o.Raw)
		items = append(items, o)
	})
	return items, info, found, err
}

// Scan calls f with each cached object of a resource in scope, inside one
// read transaction: o.Raw points into the memory map and is valid only
// during the call (copy what you keep), and f must not block. Selectors
// are matched on the records' meta sections; only a field that is not
// indexed makes it decode an object.
func (s *Store) Scan(component string, gvr schema.GroupVersionResource, scope Scope, f func(o *localapi.Object)) (info ResourceInfo, found bool, err error) {
	bad := 0
	err = s.db.View(func(tx *bolt.Tx) error {
		if info, found = resourceInfo(tx, component, gvr); !found || evicted(tx, component, gvr) {
			found = false
			return nil
		}
		b := objectsBucket(tx, component, gvr)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		prefix := []byte(scope.Namespace + "/")
		var k, v []byte
		if scope.Namespace == "" {
			k, v = c.First()
		} else {
			k, v = c.Seek(prefix)
		}
		for ; k != nil && (scope.Namespace == "" || bytes.HasPrefix(k, prefix)); k, v = c.Next() {
			r, ok := decodeRecord(v)
			if !ok || r.flag == flagTombstone {
				continue
			}
			o, err := r.object()
			if err != nil {
				bad++
				continue
			}
			if scope.Matches(o) {
				f(o)
			}
		}
		return nil
	})
	if err != nil {
		return info, false, fmt.Errorf("read cache: %w", err)
	}
	if bad > 0 {
		s.log.Warn("skipped cached objects that do not decode", "resource", gvr.String(), "count", bad)
	}
	return info, found, nil
}

// Info returns what the cache knows of a resource; found is false when
// the component never cached it, or when it was evicted and no complete
// list has filled it again since.
func (s *Store) Info(component string, gvr schema.GroupVersionResource) (info ResourceInfo, found bool) {
	s.db.View(func(tx *bolt.Tx) error {
		info, found = resourceInfo(tx, component, gvr)
		found = found && !evicted(tx, component, gvr)
		return nil
	})
	return info, found
}

// Empty reports whether nothing at all is cached.
func (s *Store) Empty() bool {
	empty := true
	s.db.View(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(bucketResources).Cursor().First()
		empty = k == nil
		return nil
	})
	return empty
}

// Stats counts the cached objects (tombstones excluded) per component.
func (s *Store) Stats() map[string]int {
	out := map[string]int{}
	s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketObjects).ForEachBucket(func(comp []byte) error {
			cb := tx.Bucket(bucketObjects).Bucket(comp)
			n := 0
			cb.ForEachBucket(func(res []byte) error {
				return cb.Bucket(res).ForEach(func(_, v []byte) error {
					if r, ok := decodeRecord(v); ok && r.flag != flagTombstone {
						n++
					}
					return nil
				})
			})
			out[string(comp)] = n
			return nil
		})
	})
	return out
}
