package cache

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The file's bounds (Options): its size, the age of tombstones, and
// compaction. The writer keeps them after each batch and every
// upkeepEvery when idle.
const (
	// DefaultMaxSize is tether-edge's bound of the bytes of the file's
	// pages that hold data (--cache-max-size): a node's own objects take
	// a few MiB, the queue at most DefaultMaxQueuedBytes; the rest is
	// room for what the node's components read cluster-wide
	// (EndpointSlices, Services).
	DefaultMaxSize = 256 << 20
	// DefaultTombstoneTTL is how long a tombstone keeps an older version
	// of a deleted object out. Such a version comes only from an answer
	// that started before the deletion, at a revision kube-apiserver
	// still serves: etcd compacts the older ones every 5 minutes by
	// default (they are 410 Gone), and a request lasts at most its
	// timeout. An hour outlasts both by far.
	DefaultTombstoneTTL = time.Hour

	// upkeepEvery is how often an idle writer checks the bounds.
	upkeepEvery = time.Minute
	// compactEvery spaces compactions (but the one at open).
	compactEvery = 10 * time.Minute
	// compactMinFree is the least free space worth a compaction: the
	// file is compacted when it has at least that much in free pages and
	// those are half of it or more, or the file is over MaxSize.
	compactMinFree = 4 << 20
)

// bucketEvicted holds the resources evicted for the bound, per component,
// until a complete list fills them again: evicted/<component>/<resource
// key> -> the time of the eviction (Unix seconds, 8 bytes big-endian).
var bucketEvicted = []byte("evicted")

// upkeep is the state of the bounds, the writer's (and Open's).
type upkeep struct {
	maxSize   int64
	ttl       time.Duration // <= 0: tombstones go only with complete lists
	noCompact bool
	opened    time.Time // the age of tombstones without a time starts here

	nextSweep, nextCompact time.Time
	nextTokenSweep         time.Time
	maxTokens              int  // per component (tokens.go)
	stuck                  bool // over the bound with nothing left to evict (logged once)
	compactNow             chan chan error

	fileBytes, usedBytes atomic.Int64
	*metrics
}

func (u *upkeep) init(o Options, now time.Time) {
	u.maxSize = max(o.MaxSize, 0)
	u.ttl = o.TombstoneTTL
	if u.ttl == 0 {
		u.ttl = DefaultTombstoneTTL
	}
	u.noCompact = o.noCompact
	u.opened = now
	u.compactNow = make(chan chan error)
	u.maxTokens = MaxTokensPerComponent
	u.metrics = newMetrics()
}

// usage is the file's size as bbolt sees it (its pages), the bytes of the
// pages that hold data, and the file's size on disk (bbolt grows it ahead
// of its pages).
type usage struct {
	size, used, file int64
}

// usage reads the file's usage; writer only.
func (s *Store) usage() usage {
	var u usage
	s.db.View(func(tx *bolt.Tx) error {
		u.size = tx.Size()
		return nil
	})
	st := s.db.Stats()
	u.used = u.size - int64(st.FreePageN+st.PendingPageN)*int64(s.db.Info().PageSize)
	if fi, err := os.Stat(s.path); err == nil {
		u.file = fi.Size()
	}
	return u
}

// Usage is the size of the file on disk and the bytes of its pages that
// hold data, as of the last commit.
func (s *Store) Usage() (file, used int64) {
	return s.upkeep.fileBytes.Load(), s.upkeep.usedBytes.Load()
}

// maintain keeps the bounds: evicts resources while the data is over
// MaxSize, expires tombstones, and compacts the file when that is worth
// it (at most once per compactEvery, but at open or when asked).
func (s *Store) maintain() {
	u := &s.upkeep
	now := s.clock.Now()
	use := s.usage()
	if u.maxSize > 0 && use.used > u.maxSize {
		if s.evict(use, now) {
			use = s.usage()
		}
	} else {
		u.stuck = false
	}
	if u.ttl > 0 && !now.Before(u.nextSweep) {
		u.nextSweep = now.Add(u.ttl / 4)
		if s.expireTombstones(now) > 0 {
			use = s.usage()
		}
	}
	if !now.Before(u.nextTokenSweep) {
		u.nextTokenSweep = now.Add(tokenSweepEvery)
		s.expireTokens(now)
	}
	if !u.noCompact && !now.Before(u.nextCompact) && u.worthCompacting(use) {
		u.nextCompact = now.Add(compactEvery)
		s.compact(use)
		use = s.usage()
	}
	u.fileBytes.Store(use.file)
	u.usedBytes.Store(use.used)
}

// worthCompacting: enough free pages, and half the file or a file over
// the bound.
func (u *upkeep) worthCompacting(use usage) bool {
	free := use.size - use.used
	return free >= compactMinFree && (free >= use.size/2 || (u.maxSize > 0 && use.file > u.maxSize))
}

// candidate is a resource that eviction may drop.
type candidate struct {
	component string
	key       []byte // the resource's key (resourceKey)
	updated   int64
	evicted   bool // already evicted, filled partly since by watch events
	bytes     int64
}

// evict drops whole resources (a component's objects of one resource,
// tombstones included) until the data is back under 90 % of the bound:
// first those already evicted and filled partly since, then the least
// recently updated, the larger first among equals. Queued writes are
// never evicted. A resource is dropped whole, never some of its objects,
// so that the cache never serves a list it holds only part of; it is
// served again once its component lists it completely (ApplyList,
// Prune). It reports whether it dropped anything.
func (s *Store) evict(use usage, now time.Time) bool {
	u := &s.upkeep
	target := u.maxSize / 10 * 9
	var gone []candidate
	err := s.db.Update(func(tx *bolt.Tx) error {
		gone = gone[:0]
		var cands []candidate
		objs := tx.Bucket(bucketObjects)
		err := objs.ForEachBucket(func(comp []byte) error {
			cb := objs.Bucket(comp)
			return cb.ForEachBucket(func(res []byte) error {
				c := candidate{component: string(comp), key: bytes.Clone(res), bytes: bucketBytes(cb.Bucket(res))}
				c.evicted = evictedAt(tx, c.component, res)
				if info, ok := resourceInfoAt(tx, c.component, res); ok {
					c.updated = info.Updated
				}
				cands = append(cands, c)
				return nil
			})
		})
		if err != nil {
			return err
		}
		slices.SortFunc(cands, func(a, b candidate) int {
			if a.evicted != b.evicted {
				if a.evicted {
					return -1
				}
				return 1
			}
			return cmp.Or(cmp.Compare(a.updated, b.updated), cmp.Compare(b.bytes, a.bytes))
		})
		excess := use.used - target
		for _, c := range cands {
			if excess <= 0 {
				break
			}
			if err := evictResource(tx, c, now); err != nil {
				return err
			}
			excess -= c.bytes
			gone = append(gone, c)
		}
		if len(gone) == 0 {
			return errUnchanged
		}
		return nil
	})
	switch {
	case err == errUnchanged:
		if !u.stuck {
			u.stuck = true
			wq, bq := s.QueueUsage()
			s.log.Error("cache over its bound with nothing left to evict: the queued status writes are never evicted",
				"used", mib(use.used), "max", mib(u.maxSize), "queued_writes", wq, "queued_bytes", mib(bq))
		}
		return false
	case err != nil:
		s.log.Error("cache over its bound: eviction failed", "err", err, "used", mib(use.used), "max", mib(u.maxSize))
		return false
	}
	// A resource evicted before and partly refilled since by watch
	// events or local answers was not served: dropping it again loses
	// nothing, and is only logged at debug (offline with the queue over
	// the bound, that happens after every batch).
	var names, again []string
	for _, c := range gone {
		name := fmt.Sprintf("%s %s (%s)", c.component, c.key, mib(c.bytes))
		if c.evicted {
			again = append(again, name)
			continue
		}
		u.evictions.WithLabelValues(c.component).Inc()
		names = append(names, name)
	}
	if len(again) > 0 {
		s.log.Debug("cache over its bound: dropped again what was refilled of evicted resources", "used", mib(use.used), "max", mib(u.maxSize), "dropped", strings.Join(again, ", "))
	}
	if len(names) == 0 {
		return true
	}
	s.log.Warn("cache over its bound: evicted whole resources, least recently updated first; each is served again once its component lists it completely (raise --cache-max-size if this repeats)",
		"used", mib(use.used), "max", mib(u.maxSize), "evicted", strings.Join(names, ", "))
	return true
}

// evictResource drops a resource's objects and info, and marks it
// evicted.
func evictResource(tx *bolt.Tx, c candidate, now time.Time) error {
	if err := tx.Bucket(bucketObjects).Bucket([]byte(c.component)).DeleteBucket(c.key); err != nil {
		return err
	}
	if rb := tx.Bucket(bucketResources).Bucket([]byte(c.component)); rb != nil {
		if err := rb.Delete(c.key); err != nil {
			return err
		}
	}
	eb, err := tx.CreateBucketIfNotExists(bucketEvicted)
	if err != nil {
		return err
	}
	cb, err := eb.CreateBucketIfNotExists([]byte(c.component))
	if err != nil {
		return err
	}
	return cb.Put(c.key, binary.BigEndian.AppendUint64(nil, uint64(now.Unix())))
}

// refilled notes that a complete list filled the resource: if it was
// evicted, it is served again.
func (s *Store) refilled(tx *bolt.Tx, component string, gvr schema.GroupVersionResource) error {
	eb := tx.Bucket(bucketEvicted)
	if eb == nil {
		return nil
	}
	cb := eb.Bucket([]byte(component))
	if cb == nil || cb.Get(resourceKey(gvr)) == nil {
		return nil
	}
	s.dirty = true
	return cb.Delete(resourceKey(gvr))
}

// evicted reports whether the resource was evicted and not filled again
// by a complete list since.
func evicted(tx *bolt.Tx, component string, gvr schema.GroupVersionResource) bool {
	return evictedAt(tx, component, resourceKey(gvr))
}

func evictedAt(tx *bolt.Tx, component string, key []byte) bool {
	eb := tx.Bucket(bucketEvicted)
	if eb == nil {
		return false
	}
	cb := eb.Bucket([]byte(component))
	return cb != nil && cb.Get(key) != nil
}

// bucketBytes is about what the bucket's pages take.
func bucketBytes(b *bolt.Bucket) int64 {
	st := b.Stats()
	return int64(max(st.BranchAlloc+st.LeafAlloc, st.InlineBucketInuse))
}

// expireTombstones removes the tombstones older than the TTL (those
// without a time count from the store's open) and returns how many.
// MaxRV stays: the list resourceVersion served offline never goes back.
func (s *Store) expireTombstones(now time.Time) int {
	u := &s.upkeep
	cutoff := now.Add(-u.ttl)
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		n = 0
		objs := tx.Bucket(bucketObjects)
		err := objs.ForEachBucket(func(comp []byte) error {
			cb := objs.Bucket(comp)
			return cb.ForEachBucket(func(res []byte) error {
				b := cb.Bucket(res)
				var drop [][]byte
				err := b.ForEach(func(k, v []byte) error {
					if len(v) == 0 || v[0] != flagTombstone {
						return nil
					}
					r, ok := decodeRecord(v)
					at, timed := r.deletedAt()
					if !timed {
						at = u.opened
					}
					if ok && at.Before(cutoff) {
						drop = append(drop, bytes.Clone(k))
					}
					return nil
				})
				if err != nil {
					return err
				}
				for _, k := range drop {
					if err := b.Delete(k); err != nil {
						return err
					}
					n++
				}
				return nil
			})
		})
		if err != nil {
			return err
		}
		if n == 0 {
			return errUnchanged
		}
		return nil
	})
	if err != nil {
		if err != errUnchanged {
			s.log.Warn("cache: expiring tombstones failed", "err", err)
		}
		return 0
	}
	u.expired.Add(float64(n))
	s.log.Debug("cache: expired tombstones", "count", n, "older_than", u.ttl)
	return n
}

// mib formats a byte count for logs.
func mib(n int64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
