package feed

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
)

// Hash is a SHA-256 hash, hex in JSON.
type Hash [32]byte

// IsZero reports whether h is all zeros (no root).
func (h Hash) IsZero() bool { return h == Hash{} }

func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// MarshalText implements encoding.TextMarshaler.
func (h Hash) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (h *Hash) UnmarshalText(b []byte) error {
	if len(b) != 64 {
		return fmt.Errorf("hash: %d hex digits, want 64", len(b))
	}
	_, err := hex.Decode(h[:], b)
	return err
}

// buckets is how many buckets a Tree splits its objects into: an update
// rehashes one bucket (1/256 of the objects) and the 256 bucket hashes.
const buckets = 256

// Tree is the root hash of a resource's objects: each object's leaf is
// H("leaf" ‖ key ‖ JSON), keys fall in buckets by the first byte of
// H(key), a bucket's hash is H of its sorted (key, leaf) pairs, and the
// root H of the bucket hashes. A hash over sorted leaves, not a sum or
// XOR of them: those a forger can solve for with enough objects of its
// own. Not safe for concurrent use.
type Tree struct {
	leaves [buckets]map[string]Hash
	hashes [buckets]Hash
	dirty  [buckets]bool
	root   Hash
	stale  bool
}

// NewTree returns an empty tree.
func NewTree() *Tree {
	t := &Tree{stale: true}
	for i := range t.dirty {
		t.dirty[i] = true
	}
	return t
}

// Key is an object's key in a tree: "namespace/name".
func Key(namespace, name string) string { return namespace + "/" + name }

func bucketOf(key string) int {
	h := sha256.Sum256([]byte(key))
	return int(h[0])
}

// Leaf is an object's leaf hash.
func Leaf(key string, raw []byte) Hash {
	h := sha256.New()
	h.Write([]byte("leaf\x00"))
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(raw)
	var out Hash
	h.Sum(out[:0])
	return out
}

// Set puts the object with key and JSON raw in the tree.
func (t *Tree) Set(key string, raw []byte) { t.setLeaf(key, Leaf(key, raw)) }

func (t *Tree) setLeaf(key string, leaf Hash) {
	b := bucketOf(key)
	if t.leaves[b] == nil {
		t.leaves[b] = map[string]Hash{}
	}
	t.leaves[b][key] = leaf
	t.dirty[b], t.stale = true, true
}

// Delete takes key out of the tree.
func (t *Tree) Delete(key string) {
	b := bucketOf(key)
	if _, ok := t.leaves[b][key]; ok {
		delete(t.leaves[b], key)
		t.dirty[b], t.stale = true, true
	}
}

// Len is the number of objects in the tree.
func (t *Tree) Len() int {
	n := 0
	for _, m := range t.leaves {
		n += len(m)
	}
	return n
}

// Root is the tree's root hash.
func (t *Tree) Root() Hash {
	if !t.stale {
		return t.root
	}
	for b := range t.hashes {
		if t.dirty[b] {
			t.hashes[b] = bucketHash(t.leaves[b])
			t.dirty[b] = false
		}
	}
	t.root = rootOf(&t.hashes)
	t.stale = false
	return t.root
}

// Edit is a change to a tree: Raw nil deletes Key.
type Edit struct {
	Key string
	Raw []byte
}

// RootWith is the root the tree would have after edits, in order,
// leaving the tree as it is.
func (t *Tree) RootWith(edits []Edit) Hash {
	if len(edits) == 0 {
		return t.Root()
	}
	hashes := t.rootHashes()
	touched := map[int]map[string]Hash{}
	for _, e := range edits {
		b := bucketOf(e.Key)
		m := touched[b]
		if m == nil {
			m = make(map[string]Hash, len(t.leaves[b])+1)
			for k, v := range t.leaves[b] {
				m[k] = v
			}
			touched[b] = m
		}
		if e.Raw == nil {
			delete(m, e.Key)
		} else {
			m[e.Key] = Leaf(e.Key, e.Raw)
		}
	}
	for b, m := range touched {
		hashes[b] = bucketHash(m)
	}
	return rootOf(&hashes)
}

// Apply makes edits in the tree.
func (t *Tree) Apply(edits []Edit) {
	for _, e := range edits {
		if e.Raw == nil {
			t.Delete(e.Key)
		} else {
			t.Set(e.Key, e.Raw)
		}
	}
}

// rootHashes brings the bucket hashes up to date and returns a copy.
func (t *Tree) rootHashes() [buckets]Hash {
	t.Root()
	return t.hashes
}

func bucketHash(m map[string]Hash) Hash {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0})
		leaf := m[k]
		h.Write(leaf[:])
	}
	var out Hash
	h.Sum(out[:0])
	return out
}

func rootOf(hashes *[buckets]Hash) Hash {
	h := sha256.New()
	h.Write([]byte("tether pool root v1\x00"))
	for i := range hashes {
		h.Write(hashes[i][:])
	}
	var out Hash
	h.Sum(out[:0])
	return out
}
