package cache

import (
	"bytes"
	"encoding/json"
	"maps"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-edge/tether/internal/localapi"
)

// fuzzStore is a store for a fuzz target's inputs, one per fuzzing
// process (opening a file per input would measure bbolt's open, not the
// decoding), without fsync.
func fuzzStore(f *testing.F) *Store {
	s := openT(f, filepath.Join(f.TempDir(), FileName))
	s.db.NoSync = true
	return s
}

// putRaw writes v under the bucket path and key as they are, as if the
// file had been written so, and recounts the queue.
func putRaw(t *testing.T, s *Store, path []string, key, v []byte) {
	t.Helper()
	must(t, s.write(func(tx *bolt.Tx) error {
		s.dirty = true
		b, err := tx.CreateBucketIfNotExists([]byte(path[0]))
		for _, p := range path[1:] {
			if err != nil {
				return err
			}
			b, err = b.CreateBucketIfNotExists([]byte(p))
		}
		if err != nil {
			return err
		}
		if err := b.Put(key, v); err != nil {
			return err
		}
		s.qtx = countQueue(tx)
		return nil
	}))
}

// sameObject compares what a record holds of an object.
func sameObject(a, b *localapi.Object) bool {
	return a.Kind == b.Kind && a.APIVersion == b.APIVersion && a.Namespace == b.Namespace && a.Name == b.Name &&
		a.UID == b.UID && a.RV == b.RV && maps.Equal(a.Labels, b.Labels) && bytes.Equal(a.Raw, b.Raw)
}

// FuzzRecord decodes arbitrary object records, directly and as read back
// from the file by Get, List and Stats: a record decodes or is skipped,
// never a panic; what decodes encodes again to the same object; and Get,
// List and Stats agree with the decoder on what is there.
func FuzzRecord(f *testing.F) {
	withPhase := podJSON("ns", "b", 9, "edge-2", nil, true)
	withPhase = append(withPhase[:len(withPhase)-1], `,"status":{"phase":"Running"}}`...)
	for _, o := range []*localapi.Object{
		pod(f, "ns", "a", 7, "edge-1", map[string]string{"app": "web", "tier": "x"}),
		mustDecode(f, withPhase, "", ""),
		mustDecode(f, []byte(`{"metadata":{"name":"edge-1","uid":"u","resourceVersion":"12","labels":{"kubernetes.io/hostname":"edge-1"}},"spec":{"unschedulable":true}}`), "Node", "v1"),
		mustDecode(f, []byte(`{"metadata":{"name":"cm","namespace":"kube-system","resourceVersion":"x"},"data":{"k":"v"}}`), "ConfigMap", "v1"),
	} {
		f.Add(encodeRecord(flagObject, o))
		f.Add(encodeRecord(flagLocal, o))
		f.Add(encodeRecord(flagTombstone, o))
	}
	f.Add([]byte{})
	f.Add([]byte{flagObject, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 1, 'P', 0xff})
	s := fuzzStore(f)
	f.Fuzz(func(t *testing.T, v []byte) {
		r, ok := decodeRecord(v)
		var o *localapi.Object
		if ok {
			var err error
			if o, err = r.object(); err != nil {
				o = nil
			}
		}
		if o != nil && r.flag != flagTombstone {
			again, ok := decodeRecord(encodeRecord(r.flag, o))
			if !ok {
				t.Fatalf("re-encoded record of %+v does not decode", o)
			}
			o2, err := again.object()
			if err != nil || !sameObject(o, o2) || again.flag != r.flag {
				t.Fatalf("round trip: %+v, then %+v (%v)", o, o2, err)
			}
		}
		served := o != nil && r.flag != flagTombstone

		putRaw(t, s, []string{"resources", "fuzz"}, resourceKey(pods), []byte(`{"kind":"Pod","apiVersion":"v1","maxRV":1}`))
		putRaw(t, s, []string{"objects", "fuzz", string(resourceKey(pods))}, []byte("ns/x"), v)
		got, err := s.Get("fuzz", pods, "ns", "x")
		// A record that is not a tombstone but whose meta does not decode
		// is an error of Get.
		if badMeta := ok && r.flag != flagTombstone && o == nil; (err != nil) != badMeta {
			t.Fatalf("Get: %v; record decodes %v, flag %d, meta decodes %v", err, ok, r.flag, o != nil)
		} else if err == nil && (got != nil) != served || (got != nil && !sameObject(got, o)) {
			t.Fatalf("Get = %+v, decoder says %+v (served %v)", got, o, served)
		}
		items, _, found, err := s.List("fuzz", pods, Scope{})
		if err != nil || !found || len(items) != map[bool]int{false: 0, true: 1}[served] {
			t.Fatalf("List: %d items, found %v, %v; decoder serves it: %v", len(items), found, err, served)
		}
		if served && !sameObject(items[0], o) {
			t.Fatalf("List = %+v, decoder says %+v", items[0], o)
		}
		if n := s.Stats()["fuzz"]; (n == 1) != (ok && r.flag != flagTombstone) {
			t.Fatalf("Stats counts %d", n)
		}
	})
}

func mustDecode(t testing.TB, raw []byte, kind, apiVersion string) *localapi.Object {
	t.Helper()
	o, err := localapi.DecodeObject(raw, kind, apiVersion)
	must(t, err)
	return o
}

// FuzzResourceInfo reads arbitrary list metadata (a resource's
// ResourceInfo) back from the file: Info finds what decodes and nothing
// else, and a bookmark over anything leaves a ResourceInfo that decodes
// with the bookmark's kind and at least its resourceVersion.
func FuzzResourceInfo(f *testing.F) {
	for _, info := range []ResourceInfo{{Kind: "Pod", APIVersion: "v1", MaxRV: 1234}, {Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"}, {}} {
		b, err := json.Marshal(info)
		must(f, err)
		f.Add(b, uint64(77))
	}
	f.Add([]byte(`{"maxRV":-1}`), uint64(0))
	f.Add([]byte(`{"maxRV":1e30}`), uint64(1))
	f.Add([]byte(`null`), uint64(5))
	s := fuzzStore(f)
	f.Fuzz(func(t *testing.T, v []byte, rv uint64) {
		var want ResourceInfo
		decodes := json.Unmarshal(v, &want) == nil
		putRaw(t, s, []string{"resources", "fuzz"}, resourceKey(pods), v)
		got, found := s.Info("fuzz", pods)
		if found != decodes || (found && got != want) {
			t.Fatalf("Info = %+v, %v; JSON decoding gives %+v, %v", got, found, want, decodes)
		}
		must(t, s.Bookmark("fuzz", pods, "Pod", "v1", rv))
		must(t, s.Sync())
		got, found = s.Info("fuzz", pods)
		if !found || got.Kind != "Pod" || got.APIVersion != "v1" || got.MaxRV < rv || (decodes && got.MaxRV < want.MaxRV) {
			t.Fatalf("after a bookmark at %d over %q: %+v, %v", rv, v, got, found)
		}
	})
}

// FuzzQueuedWrite reads arbitrary queued writes back from the file:
// QueuedWrites yields what decodes, with the key's seq, and an error for
// what does not (never a panic, never a skipped write), and Dequeue
// removes either.
func FuzzQueuedWrite(f *testing.F) {
	for _, w := range []QueuedWrite{
		{Seq: 3, Component: "kubelet", UserAgent: "kubelet/v1.36.3 (linux/amd64) kubernetes/abc", Method: "PATCH",
			Path: "/api/v1/namespaces/ns/pods/p/status", ContentType: "application/strategic-merge-patch+json",
			Body: []byte(`{"status":{"phase":"Running"}}`), Version: "v1", Resource: "pods", Namespace: "ns", Name: "p", UID: "u",
			QueuedAt: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)},
		{Component: "kubelet", Method: "PUT", Path: "/api/v1/nodes/edge-1/status", RawQuery: "fieldManager=kubelet",
			ContentType: "application/vnd.kubernetes.protobuf", Body: []byte{0x6b, 0x38, 0x73, 0}, Version: "v1", Resource: "nodes", Name: "edge-1"},
	} {
		b, err := json.Marshal(w)
		must(f, err)
		f.Add(b, uint64(1))
	}
	f.Add([]byte(`{"body":"not base64"}`), uint64(2))
	f.Add([]byte(`{"seq":9,"queuedAt":"yesterday"}`), uint64(^uint64(0)))
	s := fuzzStore(f)
	f.Fuzz(func(t *testing.T, v []byte, seq uint64) {
		if seq == 0 || seq == ^uint64(0) {
			seq = 1 // NextSequence starts at 1; after ^0 nothing can follow
		}
		var want QueuedWrite
		werr := json.Unmarshal(v, &want)
		want.Seq = seq
		putRaw(t, s, []string{"queue"}, seqKey(seq), v)
		n := 0
		for w, err := range s.QueuedWrites(seq - 1) {
			n++
			if (err == nil) != (werr == nil) {
				t.Fatalf("QueuedWrites: %v; JSON decoding: %v", err, werr)
			}
			if err == nil {
				a, _ := json.Marshal(w)
				b, _ := json.Marshal(want)
				if !bytes.Equal(a, b) {
					t.Fatalf("QueuedWrites yields %s, want %s", a, b)
				}
			}
			break
		}
		if n != 1 {
			t.Fatal("QueuedWrites skipped the write")
		}
		if w, b := s.QueueUsage(); w != 1 || b != int64(len(v)) {
			t.Fatalf("QueueUsage = %d, %d; want 1, %d", w, b, len(v))
		}
		must(t, s.Dequeue(seq, OutcomeApplied))
		for _, err := range s.QueuedWrites(0) {
			t.Fatalf("the queue holds a write after Dequeue (%v)", err)
		}
		if w, b := s.QueueUsage(); w != 0 || b != 0 {
			t.Fatalf("QueueUsage after Dequeue = %d, %d", w, b)
		}
	})
}
