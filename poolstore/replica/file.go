package replica

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/poolstore/feed"
)

// The file (FileName in the data directory) is an API: change the bucket
// tree only with a new schema version. The tree (meta/ with the schema
// version, epoch and revision; resources/ with each resource's
// resourceVersion; objects/ with each object's JSON) is in
// internal/localapi/README.md ("The two stores' files"), with the
// apiserver cache's.
//
// The file trails memory by at most flushDelay plus one transaction: it
// is what a node serves after a restart without the cloud and without the
// leader, and what a node that becomes leader starts from.
//
// Schema 2 adds trust/: each resource's last attestation ("attest/"
// and the resource), the last mark ("mark") and the gateway chains
// ("chains", JSON). A schema 1 file is read as a replica without
// attestations (what the node had before it verified): it is served
// offline as before, and the first verified snapshot or attestation
// replaces it.
const schemaVersion = "2"

// schemaV1 is the schema before trust/, still read.
const schemaV1 = "1"

var (
	bucketMeta      = []byte("meta")
	bucketResources = []byte("resources")
	bucketObjects   = []byte("objects")
	keySchema       = []byte("schema-version")
	keyEpoch        = []byte("epoch")
	keyRev          = []byte("rev")
	bucketTrust     = []byte("trust")
	keyMark         = []byte("mark")
	keyChains       = []byte("chains")
	prefixAttest    = "attest/"
)

// load reads the file into memory (creating the buckets of a new one);
// it is boltfile's Init, so a panic or an error moves the file aside. It
// sets the store's fields only once the whole file has been read.
func (s *Store) load(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		if tx.Bucket(bucketResources) != nil || tx.Bucket(bucketObjects) != nil {
			return errors.New("no schema version")
		}
		for _, b := range [][]byte{bucketMeta, bucketResources, bucketObjects, bucketTrust} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersion))
	}
	if v := string(meta.Get(keySchema)); v != schemaVersion && v != schemaV1 {
		return fmt.Errorf("schema version %q, this build reads %q and %q", v, schemaV1, schemaVersion)
	}
	epoch := string(meta.Get(keyEpoch))
	var rev uint64
	if v := meta.Get(keyRev); len(v) == 8 {
		rev = binary.BigEndian.Uint64(v)
	}
	resources, objects := tx.Bucket(bucketResources), tx.Bucket(bucketObjects)
	if resources == nil || objects == nil {
		return errors.New("buckets missing")
	}
	loaded := map[string]*resource{}
	err := resources.ForEach(func(k, v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("resource %s: bad resourceVersion", k)
		}
		res := newResource(binary.BigEndian.Uint64(v))
		loaded[string(k)] = res
		b := objects.Bucket(k)
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, raw []byte) error {
			o, err := localapi.DecodeObject(bytes.Clone(raw), "", "")
			if err != nil {
				return fmt.Errorf("resource %s: %w", k, err)
			}
			res.objs[objKey(o.Namespace, o.Name)] = o
			res.tree.Set(objKey(o.Namespace, o.Name), o.Raw)
			return nil
		})
	})
	if err != nil {
		return err
	}
	if err := s.loadTrust(tx, loaded); err != nil {
		return err
	}
	s.epoch, s.rev, s.resources = epoch, rev, loaded
	return nil
}

// loadTrust reads trust/ into loaded and the store (none in a schema 1
// file).
func (s *Store) loadTrust(tx *bolt.Tx, loaded map[string]*resource) error {
	trust := tx.Bucket(bucketTrust)
	if trust == nil {
		return nil
	}
	for r, res := range loaded {
		raw := trust.Get([]byte(prefixAttest + r))
		if raw == nil {
			continue
		}
		h, err := readHeader(raw)
		if err != nil {
			return fmt.Errorf("attestation of %s: %w", r, err)
		}
		res.attest, res.at = bytes.Clone(raw), feed.Point{To: h.To, Root: h.Root}
	}
	if raw := trust.Get(keyMark); raw != nil {
		h, err := readHeader(raw)
		if err != nil {
			return fmt.Errorf("mark: %w", err)
		}
		s.mark, s.syncedAt = bytes.Clone(raw), h.T
	}
	if raw := trust.Get(keyChains); raw != nil {
		if err := json.Unmarshal(raw, &s.chains); err != nil {
			return fmt.Errorf("chains: %w", err)
		}
	}
	return nil
}

// writeTrust replaces trust/ (and marks the file schema 2).
func writeTrust(tx *bolt.Tx, attests map[string][]byte, mark, chains []byte) error {
	if tx.Bucket(bucketTrust) != nil {
		if err := tx.DeleteBucket(bucketTrust); err != nil {
			return err
		}
	}
	b, err := tx.CreateBucket(bucketTrust)
	if err != nil {
		return err
	}
	for r, raw := range attests {
		if err := b.Put([]byte(prefixAttest+r), raw); err != nil {
			return err
		}
	}
	if mark != nil {
		if err := b.Put(keyMark, mark); err != nil {
			return err
		}
	}
	if chains != nil {
		if err := b.Put(keyChains, chains); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersion))
}

// writer writes what changed in memory to the file, gathering changes for
// flushDelay, until Close.
func (s *Store) writer() {
	defer close(s.done)
	for range s.flush {
		time.Sleep(flushDelay)
		s.write()
	}
	s.write()
}

// write commits the pending changes in one transaction.
func (s *Store) write() {
	s.mu.Lock()
	rewrite, objs, res, trust := s.rewrite, s.dirtyObjs, s.dirtyRes, s.dirtyTrust
	if !rewrite && len(objs) == 0 && len(res) == 0 && !trust {
		s.mu.Unlock()
		return
	}
	s.rewrite, s.dirtyObjs, s.dirtyRes, s.dirtyTrust = false, map[string]bool{}, map[string]bool{}, false
	var attests map[string][]byte
	var mark, chains []byte
	if rewrite || trust {
		attests = map[string][]byte{}
		for r, rr := range s.resources {
			if rr.attest != nil {
				attests[r] = rr.attest
			}
		}
		mark = s.mark
		if s.chains != nil {
			chains, _ = json.Marshal(s.chains) // [][][]byte always encodes
		}
	}
	// Copy what to write under the lock; write without it.
	epoch, rev := s.epoch, s.rev
	type put struct {
		resource, key string
		raw           []byte // nil: delete
	}
	var puts []put
	rvs := map[string]uint64{}
	if rewrite {
		for r, rr := range s.resources {
			rvs[r] = rr.rv
			for k, o := range rr.objs {
				puts = append(puts, put{r, k, o.Raw})
			}
		}
	} else {
		for r := range res {
			if rr := s.resources[r]; rr != nil {
				rvs[r] = rr.rv
			}
		}
		for rk := range objs {
			r, k, _ := strings.Cut(rk, "\x00")
			p := put{resource: r, key: k}
			if rr := s.resources[r]; rr != nil {
				if o := rr.objs[k]; o != nil {
					p.raw = o.Raw
				}
			}
			puts = append(puts, p)
		}
	}
	s.mu.Unlock()

	err := s.db.Update(func(tx *bolt.Tx) error {
		if attests != nil {
			if err := writeTrust(tx, attests, mark, chains); err != nil {
				return err
			}
		}
		if rewrite {
			for _, b := range [][]byte{bucketResources, bucketObjects} {
				if err := tx.DeleteBucket(b); err != nil {
					return err
				}
				if _, err := tx.CreateBucket(b); err != nil {
					return err
				}
			}
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyEpoch, []byte(epoch)); err != nil {
			return err
		}
		if err := meta.Put(keyRev, binary.BigEndian.AppendUint64(nil, rev)); err != nil {
			return err
		}
		resources, objects := tx.Bucket(bucketResources), tx.Bucket(bucketObjects)
		for r, rv := range rvs {
			if err := resources.Put([]byte(r), binary.BigEndian.AppendUint64(nil, rv)); err != nil {
				return err
			}
		}
		for _, p := range puts {
			b, err := objects.CreateBucketIfNotExists([]byte(p.resource))
			if err != nil {
				return err
			}
			if p.raw == nil {
				err = b.Delete([]byte(p.key))
			} else {
				err = b.Put([]byte(p.key), p.raw)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Error("pool store write failed; the file will be rewritten", "err", err)
		s.mu.Lock()
		s.rewrite = true
		s.mu.Unlock()
	}
}
