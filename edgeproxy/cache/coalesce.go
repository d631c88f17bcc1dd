package cache

import (
	"bytes"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ReplaceQueued puts w in the queue in place of the queued write old, in
// one transaction (the ledger counts w as enqueued and old as
// coalesced), setting w.Seq to a new sequence number: a node that is
// offline for hours keeps one status patch per object rather than one per
// kubelet sync. It reports whether old was still queued; when it was not
// (replayed meanwhile), w is simply queued. The bounds are checked as
// Enqueue checks them, with the room old held counted as free.
func (s *Store) ReplaceQueued(old uint64, w *QueuedWrite) (replaced bool, err error) {
	err = s.write(func(tx *bolt.Tx) error {
		replaced = false
		b := tx.Bucket(bucketQueue)
		var freed queueUsage
		if prev := b.Get(seqKey(old)); prev != nil {
			freed = queueUsage{writes: 1, bytes: int64(len(prev))}
		}
		// The new write goes in before the old one comes out: an error
		// between the two (the batch still commits) leaves both queued,
		// never neither.
		if err := s.appendQueued(b, w, freed); err != nil {
			return err
		}
		if freed.writes == 0 {
			return nil
		}
		if err := b.Delete(seqKey(old)); err != nil {
			return err
		}
		s.qtx.writes -= freed.writes
		s.qtx.bytes -= freed.bytes
		replaced = true
		// A send of old may have reached the cloud: w holds what old
		// did, so its first send counts as resent in its turn.
		sb := sendingBucket(tx)
		if mark := sb.Get(seqKey(old)); mark != nil {
			mark = bytes.Clone(mark)
			if err := sb.Delete(seqKey(old)); err != nil {
				return err
			}
			if err := sb.Put(seqKey(w.Seq), mark); err != nil {
				return err
			}
		}
		return s.count(tx, ledgerCoalesced, 1)
	})
	if err != nil {
		return false, fmt.Errorf("queue write in place of %d: %w", old, err)
	}
	return replaced, nil
}

// QueuedWrite returns the queued write seq, or nil if it is not queued.
func (s *Store) QueuedWrite(seq uint64) (*QueuedWrite, error) {
	var w *QueuedWrite
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketQueue).Get(seqKey(seq))
		if v == nil {
			return nil
		}
		w = &QueuedWrite{}
		if err := json.Unmarshal(v, w); err != nil {
			return fmt.Errorf("queued write %d: %w", seq, err)
		}
		w.Seq = seq
		return nil
	})
	return w, err
}
