package cache

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// oldFile writes a cache file of another schema version with bbolt
// directly, as internal/localapi/README.md has the tree: a cached pod and the queue
// entries given (seq -> value), the queue's sequence at seqs' last. A
// version of "" writes no meta bucket (a file from before versions).
func oldFile(t *testing.T, path, version string, queue map[uint64][]byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	must(t, err)
	defer db.Close()
	must(t, db.Update(func(tx *bolt.Tx) error {
		if version != "" {
			meta, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			if err := meta.Put(keySchema, []byte(version)); err != nil {
				return err
			}
		}
		res, err := tx.CreateBucket(bucketResources)
		if err != nil {
			return err
		}
		comp, err := res.CreateBucket([]byte("kubelet"))
		if err != nil {
			return err
		}
		if err := comp.Put([]byte("core/v1/pods"), []byte(`{"kind":"Pod","apiVersion":"v1","maxRV":7}`)); err != nil {
			return err
		}
		objs, err := tx.CreateBucket(bucketObjects)
		if err != nil {
			return err
		}
		if comp, err = objs.CreateBucket([]byte("kubelet")); err != nil {
			return err
		}
		podsB, err := comp.CreateBucket([]byte("core/v1/pods"))
		if err != nil {
			return err
		}
		if err := podsB.Put([]byte("ns/a"), encodeRecord(flagObject, pod(t, "ns", "a", 7, "edge-1", nil))); err != nil {
			return err
		}
		q, err := tx.CreateBucket(bucketQueue)
		if err != nil {
			return err
		}
		last := uint64(0)
		for seq, v := range queue {
			if err := q.Put(seqKey(seq), v); err != nil {
				return err
			}
			last = max(last, seq)
		}
		return q.SetSequence(last)
	}))
}

func queuedJSON(t *testing.T, w QueuedWrite) []byte {
	t.Helper()
	b, err := json.Marshal(w)
	must(t, err)
	return b
}

// A schema version change empties the cache but carries the queued
// writes over: same seqs, same writes, and the next one after them.
func TestSchemaChangeCarriesQueue(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	writes := []QueuedWrite{
		{Seq: 5, Component: "kubelet", UserAgent: "kubelet/v1.36.3", Method: "PATCH", Path: "/api/v1/namespaces/ns/pods/a/status",
			ContentType: "application/strategic-merge-patch+json", Body: []byte(`{"status":{"phase":"Running"}}`),
			Version: "v1", Resource: "pods", Namespace: "ns", Name: "a", UID: "uid-a", QueuedAt: at},
		{Seq: 9, Component: "kubelet", Method: "PUT", Path: "/api/v1/nodes/edge-1/status", RawQuery: "fieldManager=kubelet",
			ContentType: "application/json", Body: []byte(`{"metadata":{"name":"edge-1"},"status":{}}`),
			Version: "v1", Resource: "nodes", Name: "edge-1", QueuedAt: at.Add(time.Second)},
	}
	// "1" is the version before service-account tokens (the upgrade).
	for _, version := range []string{"1", "0", ""} {
		t.Run(fmt.Sprintf("version %q", version), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			oldFile(t, path, version, map[uint64][]byte{5: queuedJSON(t, writes[0]), 9: queuedJSON(t, writes[1])})
			s := openT(t, path)
			if s.MovedAside == "" {
				t.Fatal("the old file was not moved aside")
			}
			if _, found := s.Info("kubelet", pods); found {
				t.Error("the old version's cache was kept")
			}
			got := queued(t, s)
			for i := range got {
				got[i].QueuedAt = got[i].QueuedAt.UTC()
			}
			if !slices.EqualFunc(got, writes, func(a, b QueuedWrite) bool {
				return string(queuedJSON(t, a)) == string(queuedJSON(t, b))
			}) {
				t.Errorf("queue after the version change:\n%+v\nwant\n%+v", got, writes)
			}
			if n, b := s.QueueUsage(); n != 2 || b != int64(len(queuedJSON(t, writes[0]))+len(queuedJSON(t, writes[1]))) {
				t.Errorf("QueueUsage = %d, %d", n, b)
			}
			w := writes[0]
			must(t, s.Enqueue(&w))
			if w.Seq != 10 {
				t.Errorf("next seq %d, want 10", w.Seq)
			}
			must(t, s.Close())
			s = openT(t, path)
			if s.MovedAside != "" || len(queued(t, s)) != 3 {
				t.Errorf("reopened: moved aside %q, %d queued", s.MovedAside, len(queued(t, s)))
			}
		})
	}
}

// A file of another version whose queue this build cannot read is left
// where it is, and Open fails saying what to do: its writes are never
// dropped in silence.
func TestSchemaChangeWithUnreadableQueueRefuses(t *testing.T) {
	for name, v := range map[string][]byte{
		"binary":        {0x0a, 0x05, 'P', 'A', 'T', 'C', 'H'},
		"unknown field": []byte(`{"method":"PATCH","path":"/api/v1/nodes/n/status","version":"v1","resource":"nodes","name":"n","headers":{"X":"y"}}`),
		"no path":       []byte(`{"method":"PATCH","version":"v1","resource":"nodes","name":"n"}`),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			good := queuedJSON(t, QueuedWrite{Method: "PATCH", Path: "/api/v1/nodes/n/status", Version: "v1", Resource: "nodes", Name: "n"})
			newer := fmt.Sprint(must1(strconv.Atoi(SchemaVersion)) + 1) // a newer build's file
			oldFile(t, path, newer, map[uint64][]byte{1: good, 2: v})
			before, err := os.ReadFile(path)
			must(t, err)
			s, err := Open(path, nil)
			if err == nil {
				s.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, ErrQueueNotCarried) || !strings.Contains(err.Error(), "move the file away") ||
				!strings.Contains(err.Error(), fmt.Sprintf("schema version %q", newer)) || !strings.Contains(err.Error(), "queued write 2") {
				t.Errorf("error does not say what and what to do: %v", err)
			}
			after, err := os.ReadFile(path)
			must(t, err)
			if !bytes.Equal(before, after) {
				t.Error("the file changed")
			}
			if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) > 0 {
				t.Errorf("left behind: %v", m)
			}
		})
	}
}

func must1[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
