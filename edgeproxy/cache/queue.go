package cache

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// QueuedWrite is a write a component made while the cloud was
// unreachable, kept to be sent when it is back.
type QueuedWrite struct {
	Seq uint64 `json:"seq"`
	// Component and UserAgent of the client that made it.
	Component string `json:"component"`
	UserAgent string `json:"userAgent"`
	// The request: method, path, raw query, content type and body.
	Method      string `json:"method"`
	Path        string `json:"path"`
	RawQuery    string `json:"rawQuery,omitempty"`
	ContentType string `json:"contentType"`
	Body        []byte `json:"body"`
	// The object written: group, version, resource, namespace, name, and
	// the UID the cache had for it (empty if unknown).
	Group     string `json:"group"`
	Version   string `json:"version"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	// QueuedAt is when the edge accepted it.
	QueuedAt time.Time `json:"queuedAt"`
}

// Enqueue appends w to the queue, setting w.Seq, and returns once it is
// committed to disk.
func (s *Store) Enqueue(w *QueuedWrite) error {
	err := s.write(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketQueue)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		w.Seq = seq
		s.dirty = true
		v, err := json.Marshal(w)
		if err != nil {
			return err
		}
		return b.Put(seqKey(seq), v)
	})
	if err != nil {
		return fmt.Errorf("queue write: %w", err)
	}
	return nil
}

// Queued returns the queued writes, oldest first.
func (s *Store) Queued() ([]QueuedWrite, error) {
	var out []QueuedWrite
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketQueue).ForEach(func(_, v []byte) error {
			var w QueuedWrite
			if err := json.Unmarshal(v, &w); err != nil { // copies out of v
				return err
			}
			out = append(out, w)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read queue: %w", err)
	}
	return out, nil
}

// QueueLen is the number of queued writes.
func (s *Store) QueueLen() int {
	n := 0
	s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketQueue).Stats().KeyN
		return nil
	})
	return n
}

// Dequeue removes a write from the queue and returns once that is
// committed.
func (s *Store) Dequeue(seq uint64) error {
	err := s.write(func(tx *bolt.Tx) error {
		s.dirty = true
		return tx.Bucket(bucketQueue).Delete(seqKey(seq))
	})
	if err != nil {
		return fmt.Errorf("dequeue write %d: %w", seq, err)
	}
	return nil
}

func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}
