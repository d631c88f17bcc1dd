package cache

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
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
	// Base is the object as cached before a patch (strategic merge or
	// JSON merge) applied: Body is the difference from it, so a later
	// patch of the object can take this write's place with one
	// difference from the same Base. Empty for updates and JSON patches,
	// and in writes queued by older versions.
	Base []byte `json:"base,omitempty"`
}

// Default bounds of the queue (SetQueueLimits changes them).
const (
	// DefaultMaxQueuedWrites bounds the number of queued writes.
	DefaultMaxQueuedWrites = 10000
	// DefaultMaxQueuedBytes bounds the bytes of the queued records (the
	// JSON QueuedWrite, body included): a handful of the largest bodies
	// kube-apiserver takes (3 MiB), or thousands of status patches of a
	// few KiB.
	DefaultMaxQueuedBytes = 32 << 20
)

// ErrQueueFull matches (errors.Is) the error of an Enqueue the queue has
// no room for; errors.As gives the *QueueFullError.
var ErrQueueFull = errors.New("queue full")

// QueueFullError says why a write was not queued.
type QueueFullError struct {
	Size      int   // bytes of the refused record
	Writes    int   // queued now
	Bytes     int64 // queued now
	MaxWrites int
	MaxBytes  int64
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("%d writes of %d bytes are queued (at most %d writes, %d bytes): no room for %d bytes more",
		e.Writes, e.Bytes, e.MaxWrites, e.MaxBytes, e.Size)
}

// Is makes errors.Is(err, ErrQueueFull) true.
func (e *QueueFullError) Is(target error) bool { return target == ErrQueueFull }

// queueUsage is what the queue holds.
type queueUsage struct {
	writes int
	bytes  int64
}

// SetQueueLimits bounds the queue: at most maxWrites writes and maxBytes
// bytes of records; a value <= 0 keeps the current bound. Writes already
// queued stay.
func (s *Store) SetQueueLimits(maxWrites int, maxBytes int64) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if maxWrites > 0 {
		s.maxWrites = maxWrites
	}
	if maxBytes > 0 {
		s.maxBytes = maxBytes
	}
}

// QueueUsage is the number of queued writes and the bytes of their
// records, as committed.
func (s *Store) QueueUsage() (writes int, bytes int64) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.queue.writes, s.queue.bytes
}

// Enqueue appends w to the queue, setting w.Seq, and returns once it is
// committed to disk. A write the queue has no room for is refused
// (ErrQueueFull); the bounds are checked by the store's single writer, in
// the transaction that adds the write, so concurrent writers never exceed
// them.
func (s *Store) Enqueue(w *QueuedWrite) error {
	err := s.write(func(tx *bolt.Tx) error {
		return s.appendQueued(tx.Bucket(bucketQueue), w, queueUsage{})
	})
	if err != nil {
		return fmt.Errorf("queue write: %w", err)
	}
	return nil
}

// appendQueued adds w at the end of the queue bucket b, setting w.Seq, if
// the queue has room for it once freed (what the caller is about to
// remove) is counted as free; otherwise it returns a *QueueFullError and
// leaves w.Seq 0 (the writer's transaction only).
func (s *Store) appendQueued(b *bolt.Bucket, w *QueuedWrite, freed queueUsage) error {
	// The sequence is taken before the size is known (it is part of the
	// record): a refused write leaves a gap in the sequence, which is
	// harmless.
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	w.Seq = seq
	v, err := json.Marshal(w)
	if err != nil {
		return err
	}
	s.qmu.Lock()
	maxWrites, maxBytes := s.maxWrites, s.maxBytes
	s.qmu.Unlock()
	if s.qtx.writes-freed.writes+1 > maxWrites || s.qtx.bytes-freed.bytes+int64(len(v)) > maxBytes {
		w.Seq = 0
		return &QueueFullError{Size: len(v), Writes: s.qtx.writes, Bytes: s.qtx.bytes, MaxWrites: maxWrites, MaxBytes: maxBytes}
	}
	s.dirty = true
	if err := b.Put(seqKey(seq), v); err != nil {
		return err
	}
	s.qtx.writes++
	s.qtx.bytes += int64(len(v))
	return s.count(b.Tx(), ledgerEnqueued, 1)
}

// QueuedWrites yields the queued writes with a Seq above after, oldest
// first. Each is read in a transaction of its own, so that the queue is
// never held in memory whole nor a read transaction open while the caller
// works; writes queued or dequeued meanwhile are seen or skipped as they
// come. It stops at the first error.
func (s *Store) QueuedWrites(after uint64) iter.Seq2[QueuedWrite, error] {
	return func(yield func(QueuedWrite, error) bool) {
		for {
			var w QueuedWrite
			found := false
			err := s.db.View(func(tx *bolt.Tx) error {
				k, v := tx.Bucket(bucketQueue).Cursor().Seek(seqKey(after + 1))
				if k == nil || after == ^uint64(0) {
					return nil
				}
				found = true
				if err := json.Unmarshal(v, &w); err != nil { // copies out of v
					return fmt.Errorf("queued write %d: %w", binary.BigEndian.Uint64(k), err)
				}
				w.Seq = binary.BigEndian.Uint64(k)
				return nil
			})
			if err != nil {
				yield(QueuedWrite{}, fmt.Errorf("read queue: %w", err))
				return
			}
			if !found || !yield(w, nil) {
				return
			}
			after = w.Seq
		}
	}
}

// QueueLen is the number of queued writes.
func (s *Store) QueueLen() int {
	n, _ := s.QueueUsage()
	return n
}

// Dequeue removes a write from the queue, counting it in the ledger as
// the outcome says and removing its MarkSending mark, in one
// transaction, and returns once that is committed. A write no longer
// queued is left alone (and not counted).
func (s *Store) Dequeue(seq uint64, outcome Outcome) error {
	counter, err := outcome.counter()
	if err != nil {
		return fmt.Errorf("dequeue write %d: %w", seq, err)
	}
	err = s.write(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketQueue)
		v := b.Get(seqKey(seq))
		if v == nil {
			return nil
		}
		s.dirty = true
		s.qtx.writes--
		s.qtx.bytes -= int64(len(v))
		if err := b.Delete(seqKey(seq)); err != nil {
			return err
		}
		if err := sendingBucket(tx).Delete(seqKey(seq)); err != nil {
			return err
		}
		return s.count(tx, counter, 1)
	})
	if err != nil {
		return fmt.Errorf("dequeue write %d: %w", seq, err)
	}
	return nil
}

// countQueue reads what the queue holds.
func countQueue(tx *bolt.Tx) queueUsage {
	var u queueUsage
	tx.Bucket(bucketQueue).ForEach(func(_, v []byte) error {
		u.writes++
		u.bytes += int64(len(v))
		return nil
	})
	return u
}

func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}
