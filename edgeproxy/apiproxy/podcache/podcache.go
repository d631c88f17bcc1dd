// Package podcache keeps the answers pods' reads got from the cloud
// through tether-edge's pod listener, per identity, so that the same
// identity can read them again while the cloud is away (package apiproxy,
// podapi.go). It is a bbolt file of its own (pod-api-cache.db in the data
// dir), apart from the node components' cache: no code path of the node
// components' cache reaches it, nor the other way round.
//
// # Schema (version 1)
//
//	meta/schema-version          -> "1"
//	reads/<identity>/<key hash>  -> JSON Entry
//
// identity is an opaque name the caller derives from what the cloud
// issued (apiproxy: a hash of namespace, service account, pod name and
// UID of a token the kubelet obtained through tether-edge); key hash is
// the SHA-256 of the request key (method, path and query, Accept).
//
// # Invariants
//
//   - An entry is served only to the identity it was stored under, for
//     the same request key (Get compares the whole key, not its hash).
//   - Bounded: at most MaxBytesPerIdentity of entries per identity and
//     MaxBytes in all; a Put past a bound evicts the oldest entries (of
//     the identity, then of any identity) first.
//   - A file that does not open or is damaged is moved aside and a fresh
//     one is made (internal/boltfile): it is a copy of what the cloud
//     answered, never the only copy of anything.
//   - A Put that fails (a full disk) leaves the file as it was; the
//     caller counts it and serves the answer online only.
package podcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-edge/tether/internal/boltfile"
)

// FileName is the cache's file in tether-edge's data dir.
const FileName = "pod-api-cache.db"

const schemaVersion = "1"

var (
	bucketMeta  = []byte("meta")
	bucketReads = []byte("reads")
	keyVersion  = []byte("schema-version")
)

// Default bounds.
const (
	DefaultMaxBytesPerIdentity = 4 << 20
	DefaultMaxBytes            = 64 << 20
)

// Options configure Open.
type Options struct {
	// MaxBytesPerIdentity and MaxBytes bound the stored entries (their
	// encoded size); zero means the defaults.
	MaxBytesPerIdentity, MaxBytes int64
	Logger                        *slog.Logger
}

// Cache is the pods' read cache.
type Cache struct {
	db       *bolt.DB
	maxPerID int64
	max      int64
	log      *slog.Logger
	path     string
}

// Entry is one answer of the cloud, as relayed.
type Entry struct {
	Key         string    `json:"key"`
	ContentType string    `json:"contentType"`
	Body        []byte    `json:"body"`
	Stored      time.Time `json:"stored"`
}

// ErrTooLarge is returned by Put for an entry larger than a bound.
var ErrTooLarge = errors.New("answer larger than the pod cache's bound")

// Open opens (or creates) the cache file at path.
func Open(path string, o Options) (*Cache, error) {
	c := &Cache{maxPerID: o.MaxBytesPerIdentity, max: o.MaxBytes, log: o.Logger, path: path}
	if c.maxPerID <= 0 {
		c.maxPerID = DefaultMaxBytesPerIdentity
	}
	if c.max <= 0 {
		c.max = DefaultMaxBytes
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	db, aside, err := boltfile.Open(path, boltfile.Options{Init: func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		switch v := meta.Get(keyVersion); {
		case v == nil:
			if err := meta.Put(keyVersion, []byte(schemaVersion)); err != nil {
				return err
			}
		case string(v) != schemaVersion:
			return fmt.Errorf("schema version %q, want %s", v, schemaVersion)
		}
		_, err = tx.CreateBucketIfNotExists(bucketReads)
		return err
	}})
	if aside != nil {
		c.log.Error("pod API cache: the file was damaged or of another version; moved aside, starting empty",
			"file", path, "moved_to", aside.Path, "err", aside.Cause)
	}
	if err != nil {
		return nil, fmt.Errorf("open pod API cache %s: %w", path, err)
	}
	c.db = db
	return c, nil
}

// Path is the cache's file.
func (c *Cache) Path() string { return c.path }

// Close closes the file.
func (c *Cache) Close() error { return c.db.Close() }

func keyHash(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return []byte(hex.EncodeToString(h[:]))
}

// Put stores e under identity and e.Key, in place of what was stored
// there, evicting the oldest entries past the bounds.
func (c *Cache) Put(identity string, e Entry) error {
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if int64(len(v)) > c.maxPerID || int64(len(v)) > c.max {
		return ErrTooLarge
	}
	return c.db.Update(func(tx *bolt.Tx) error {
		reads := tx.Bucket(bucketReads)
		ib, err := reads.CreateBucketIfNotExists([]byte(identity))
		if err != nil {
			return err
		}
		k := keyHash(e.Key)
		if err := ib.Put(k, v); err != nil {
			return err
		}
		if err := evict(ib, nil, k, c.maxPerID); err != nil {
			return err
		}
		return evict(reads, []byte(identity), k, c.max)
	})
}

// evict deletes the oldest entries under b (an identity's bucket, or with
// a non-nil keep the whole reads bucket) until their size is at most max;
// the entry just stored (keep's key k) goes last.
func evict(b *bolt.Bucket, keepID, k []byte, max int64) error {
	type entry struct {
		b      *bolt.Bucket
		k      []byte
		size   int64
		stored time.Time
		last   bool
	}
	var all []entry
	var total int64
	collect := func(b *bolt.Bucket, just bool) {
		b.ForEach(func(kk, v []byte) error {
			var e struct {
				Stored time.Time `json:"stored"`
			}
			json.Unmarshal(v, &e) // one that does not read is the oldest
			all = append(all, entry{b: b, k: bytes.Clone(kk), size: int64(len(kk) + len(v)), stored: e.Stored,
				last: just && bytes.Equal(kk, k)})
			total += int64(len(kk) + len(v))
			return nil
		})
	}
	if keepID == nil {
		collect(b, true)
	} else {
		b.ForEachBucket(func(id []byte) error {
			collect(b.Bucket(id), bytes.Equal(id, keepID))
			return nil
		})
	}
	if total <= max {
		return nil
	}
	slices.SortStableFunc(all, func(a, b entry) int {
		switch {
		case a.last != b.last:
			if a.last {
				return 1
			}
			return -1
		}
		return a.stored.Compare(b.stored)
	})
	for _, e := range all {
		if total <= max {
			break
		}
		if err := e.b.Delete(e.k); err != nil {
			return err
		}
		total -= e.size
	}
	return nil
}

// Get returns the entry stored under identity for key, or nil.
func (c *Cache) Get(identity, key string) (*Entry, error) {
	var e *Entry
	err := c.db.View(func(tx *bolt.Tx) error {
		ib := tx.Bucket(bucketReads).Bucket([]byte(identity))
		if ib == nil {
			return nil
		}
		v := ib.Get(keyHash(key))
		if v == nil {
			return nil
		}
		var got Entry
		if err := json.Unmarshal(v, &got); err != nil { // copies the bytes
			return fmt.Errorf("stored pod read: %w", err)
		}
		if got.Key == key {
			e = &got
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read pod API cache: %w", err)
	}
	return e, nil
}

// Size is the number of entries and their bytes per identity.
func (c *Cache) Size() map[string][2]int64 {
	out := map[string][2]int64{}
	c.db.View(func(tx *bolt.Tx) error {
		reads := tx.Bucket(bucketReads)
		return reads.ForEachBucket(func(id []byte) error {
			var n, size int64
			reads.Bucket(id).ForEach(func(k, v []byte) error { n++; size += int64(len(k) + len(v)); return nil })
			out[string(id)] = [2]int64{n, size}
			return nil
		})
	})
	return out
}
