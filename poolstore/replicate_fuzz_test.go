package poolstore

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// FuzzReplicationStream feeds arbitrary bytes to the follower's side of
// the replication stream: the frame reader, and the checks a snapshot and
// a batch of changes pass before they touch the replica. Nothing may
// panic, and what passes must be consistent: a snapshot that decodes
// holds only objects of the resources it lists, keyed by their own names,
// and changes that decode carry objects named as their keys.
// (The store itself is not in the loop: coverage-guided fuzzing of the
// whole package with its bbolt writes crawls; store_test.go and
// replicate_test.go apply real streams.)
func FuzzReplicationStream(f *testing.F) {
	a, b := slice("ns", "a", 5, "app", "x"), slice("ns", "b", 6)
	objects := []Change{{Rev: 3, Resource: slices_, Type: Added, Namespace: "ns", Name: "a", RV: 5, Object: a},
		{Rev: 3, Resource: slices_, Type: Added, Namespace: "ns", Name: "b", RV: 6, Object: b}}
	var seed bytes.Buffer
	enc := json.NewEncoder(&seed)
	enc.Encode(frame{Type: frameSnapshot, Epoch: "l/1", Rev: 3, Resources: map[string]uint64{slices_: 10}, Count: 2})
	enc.Encode(frame{Type: frameObjects, Epoch: "l/1", Rev: 3, Items: objects})
	enc.Encode(frame{Type: frameSync, Epoch: "l/1", Rev: 3, SyncedAt: time.Unix(1e9, 0), AgeMillis: 5})
	f.Add(seed.Bytes())
	seed.Reset()
	enc.Encode(frame{Type: frameChanges, Epoch: "l/1", Rev: 5, Items: []Change{
		{Rev: 4, Resource: slices_, Type: Modified, Namespace: "ns", Name: "a", RV: 11, Object: slice("ns", "a", 11)},
		{Rev: 5, Resource: slices_, Type: Deleted, Namespace: "ns", Name: "b", RV: 12, Object: b},
		{Rev: 6, Resource: slices_, Type: Bookmark, RV: 13}}})
	f.Add(seed.Bytes())
	f.Add([]byte("{\"type\":\"objects\",\"items\":[{}]}\n"))

	f.Fuzz(func(t *testing.T, stream []byte) {
		r := newFrameReader(bytes.NewReader(stream))
		var snap *Snapshot
		for range 64 {
			fr, _, err := r.next()
			if err != nil {
				return
			}
			switch fr.Type {
			case frameSnapshot:
				snap = &Snapshot{Epoch: fr.Epoch, Rev: fr.Rev, Resources: fr.Resources}
			case frameObjects:
				if snap != nil {
					snap.Objects = append(snap.Objects, fr.Items...)
				}
			case frameChanges:
				objs, err := decodeChanges(fr.Items)
				if err != nil {
					continue
				}
				for i, c := range fr.Items {
					if o := objs[i]; o != nil && (o.Namespace != c.Namespace || o.Name != c.Name) {
						t.Fatalf("change %d passed with object %s/%s under %s/%s", c.Rev, o.Namespace, o.Name, c.Namespace, c.Name)
					}
				}
			}
			if snap == nil {
				continue
			}
			resources, err := decodeSnapshot(*snap)
			if err != nil {
				continue
			}
			for name, res := range resources {
				if _, listed := snap.Resources[name]; !listed {
					t.Fatalf("snapshot passed with resource %q it does not list", name)
				}
				for k, o := range res.objs {
					if k != objKey(o.Namespace, o.Name) || o.RV > res.rv {
						t.Fatalf("snapshot passed with %s at key %s (rv %d > %d)", objKey(o.Namespace, o.Name), k, o.RV, res.rv)
					}
				}
			}
		}
	})
}
