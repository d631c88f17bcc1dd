package cache

import (
	"bytes"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/internal/localapi"
)

// The update methods below submit a write and return without waiting for
// it (Sync waits). They fail only once the store is closed.

// Put caches obj, unless the cache holds a newer version or a tombstone
// that is not older.
func (s *Store) Put(component string, gvr schema.GroupVersionResource, obj *localapi.Object) error {
	return s.submit(op{apply: func(tx *bolt.Tx) error {
		b, err := createObjectsBucket(tx, component, gvr)
		if err != nil {
			return err
		}
		if err := s.put(b, obj); err != nil {
			return err
		}
		return s.noteResource(tx, component, gvr, obj.Kind, obj.APIVersion, obj.RV)
	}})
}

// PutLocal caches an object as the proxy answered a write offline (a
// Lease renewal, a status write). Its resourceVersion is made up: it does
// not raise the resource's MaxRV, and the next version from the cloud
// replaces it whatever its resourceVersion.
func (s *Store) PutLocal(component string, gvr schema.GroupVersionResource, obj *localapi.Object) error {
	return s.submit(op{apply: func(tx *bolt.Tx) error {
		b, err := createObjectsBucket(tx, component, gvr)
		if err != nil {
			return err
		}
		s.dirty = true
		if err := b.Put([]byte(obj.Key()), encodeRecord(flagLocal, obj)); err != nil {
			return err
		}
		return s.noteResource(tx, component, gvr, obj.Kind, obj.APIVersion, 0)
	}})
}

// Delete records that obj was deleted at obj.RV (a DELETED watch event):
// the object goes unless the cache holds a newer version. With tombstone
// set, a tombstone keeps older versions out; without, as for a watch with
// selectors (whose DELETED events also mean "left the selection"), the
// object just goes.
func (s *Store) Delete(component string, gvr schema.GroupVersionResource, obj *localapi.Object, tombstone bool) error {
	return s.submit(op{apply: func(tx *bolt.Tx) error {
		b, err := createObjectsBucket(tx, component, gvr)
		if err != nil {
			return err
		}
		key := []byte(obj.Key())
		if r, ok := decodeRecord(b.Get(key)); ok && r.rv > obj.RV && obj.RV != 0 && r.flag == flagObject {
			return nil // recreated since (a local record goes: the cloud knows better)
		}
		s.dirty = true
		if tombstone {
			err = b.Put(key, encodeTombstone(obj.RV, s.clock.Now()))
		} else {
			err = b.Delete(key)
		}
		if err != nil {
			return err
		}
		return s.noteResource(tx, component, gvr, obj.Kind, obj.APIVersion, obj.RV)
	}})
}

// Forget removes an object without a tombstone: the apiserver answered
// 404 to a get of it.
func (s *Store) Forget(component string, gvr schema.GroupVersionResource, namespace, name string) error {
	return s.submit(op{apply: func(tx *bolt.Tx) error {
		b := objectsBucket(tx, component, gvr)
		if b == nil || b.Get([]byte(namespace+"/"+name)) == nil {
			return nil
		}
		s.dirty = true
		return b.Delete([]byte(namespace + "/" + name))
	}})
}

// Bookmark raises the resource's MaxRV (a BOOKMARK watch event).
func (s *Store) Bookmark(component string, gvr schema.GroupVersionResource, kind, apiVersion string, rv uint64) error {
	return s.submit(op{apply: func(tx *bolt.Tx) error {
		return s.noteResource(tx, component, gvr, kind, apiVersion, rv)
	}})
}

// List is a list response to apply.
type List struct {
	// Kind and APIVersion of the items ("Pod", "v1").
	Kind, APIVersion string
	// RV is the list's resourceVersion.
	RV    uint64
	Items []*localapi.Object
	// Scope is what the request covered.
	Scope Scope
	// Complete is set for a whole list (not a page): objects it covers
	// but does not hold are removed.
	Complete bool
}

// ApplyList caches a list's items and, for a complete list, removes what
// it covers but lacks; a complete list also makes an evicted resource
// served again.
func (s *Store) ApplyList(component string, gvr schema.GroupVersionResource, l List) error {
	return s.submit(op{apply: func(tx *bolt.Tx) error {
		b, err := createObjectsBucket(tx, component, gvr)
		if err != nil {
			return err
		}
		keep := make(map[string]bool, len(l.Items))
		for _, o := range l.Items {
			keep[o.Key()] = true
			if err := s.put(b, o); err != nil {
				return err
			}
		}
		if l.Complete {
			if err := s.prune(b, l.Scope, l.RV, keep); err != nil {
				return err
			}
			if err := s.refilled(tx, component, gvr); err != nil {
				return err
			}
		}
		return s.noteResource(tx, component, gvr, l.Kind, l.APIVersion, l.RV)
	}})
}

// Prune removes the objects in scope, not newer than rv, whose keys are
// not in keep: the end of a watch's initial events (sendInitialEvents),
// which stand for a complete list at rv (and make an evicted resource
// served again, as ApplyList does).
func (s *Store) Prune(component string, gvr schema.GroupVersionResource, scope Scope, rv uint64, keep map[string]bool) error {
	return s.submit(op{apply: func(tx *bolt.Tx) error {
		b, err := createObjectsBucket(tx, component, gvr)
		if err != nil {
			return err
		}
		if err := s.prune(b, scope, rv, keep); err != nil {
			return err
		}
		if err := s.refilled(tx, component, gvr); err != nil {
			return err
		}
		return s.noteResource(tx, component, gvr, "", "", rv)
	}})
}

// put writes o into b unless b holds a newer version or a tombstone that
// is not older, or already holds this version (same resourceVersion,
// same object).
func (s *Store) put(b *bolt.Bucket, o *localapi.Object) error {
	key := []byte(o.Key())
	if r, ok := decodeRecord(b.Get(key)); ok && o.RV != 0 && r.flag != flagLocal {
		if o.RV < r.rv || (r.flag == flagTombstone && o.RV == r.rv) {
			return nil
		}
		if r.flag == flagObject && o.RV == r.rv && len(r.raw) == len(o.Raw) {
			return nil
		}
	}
	s.dirty = true
	return b.Put(key, encodeRecord(flagObject, o))
}

// prune removes from b the records in scope, not newer than rv, whose
// keys are not in keep. Tombstones not newer than rv go too (the list is
// now the reference), and local records in scope whatever their made-up
// resourceVersion; objects are decoded only when the scope has selectors.
func (s *Store) prune(b *bolt.Bucket, scope Scope, rv uint64, keep map[string]bool) error {
	var drop [][]byte
	prefix := scope.Namespace + "/"
	c := b.Cursor()
	var k, v []byte
	if scope.Namespace == "" {
		k, v = c.First()
	} else {
		k, v = c.Seek([]byte(prefix))
	}
	for ; k != nil && (scope.Namespace == "" || string(k[:min(len(k), len(prefix))]) == prefix); k, v = c.Next() {
		if keep[string(k)] {
			continue
		}
		r, ok := decodeRecord(v)
		newer := r.rv > rv && rv != 0
		switch {
		case !ok:
		case r.flag == flagTombstone || r.flag == flagObject:
			if newer {
				continue
			}
			if r.flag == flagTombstone || !scope.Selective() {
				break
			}
			fallthrough
		case r.flag == flagLocal && scope.Selective(): // its resourceVersion is made up
			o, err := r.object()
			if err == nil && !scope.Matches(o) {
				continue
			}
		}
		drop = append(drop, bytes.Clone(k))
	}
	for _, k := range drop {
		s.dirty = true
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
