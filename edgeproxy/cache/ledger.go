package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// The queue's ledger: what became of every status write ever queued in
// the file, counted in the transaction that does it (so a kill -9 never
// separates an event from its count), and the marks of writes whose send
// may have reached the cloud without the proxy learning the outcome.
//
//	ledger/
//	    "enqueued"  -> 8 bytes big-endian   writes put in the queue (coalescing replacements too)
//	    "coalesced" -> ...                   writes a later patch of the object took the place of
//	    "applied"   -> ...                   dequeued after the cloud answered them 2xx
//	    "obsolete"  -> ...                   dequeued unsent or refused as no longer wanted (replay)
//	    "rejected"  -> ...                   dequeued after a final 4xx
//	    "resent"    -> ...                   sends of a write that an earlier send may have applied
//	    sending/
//	        <seq, 8 bytes big-endian> -> the time of the mark (Unix seconds, 8 bytes big-endian)
//
// enqueued == coalesced + applied + obsolete + rejected + the writes still
// queued, at every commit. Queued writes are never evicted nor dropped
// otherwise (a file moved aside as corrupt takes its queue and its ledger
// with it). A file of an older build of this schema version, without a
// ledger, gets one at open with its queued writes counted as enqueued.
var (
	bucketLedger  = []byte("ledger")
	bucketSending = []byte("sending") // in ledger/
)

// The ledger's counters, in the order Ledger and the metric list them.
const (
	ledgerEnqueued  = "enqueued"
	ledgerCoalesced = "coalesced"
	ledgerApplied   = "applied"
	ledgerObsolete  = "obsolete"
	ledgerRejected  = "rejected"
	ledgerResent    = "resent"
)

var ledgerCounters = []string{ledgerEnqueued, ledgerCoalesced, ledgerApplied, ledgerObsolete, ledgerRejected, ledgerResent}

// Outcome is why a replayed write left the queue (Dequeue).
type Outcome uint8

const (
	// OutcomeApplied: the cloud answered the write 2xx.
	OutcomeApplied Outcome = iota + 1
	// OutcomeObsolete: no longer wanted (a later update of the object in
	// the queue, the object gone or recreated, its status written since
	// by another manager, a conflict): not sent, or refused for that.
	OutcomeObsolete
	// OutcomeRejected: the cloud refused it for good (4xx).
	OutcomeRejected
)

func (o Outcome) counter() (string, error) {
	switch o {
	case OutcomeApplied:
		return ledgerApplied, nil
	case OutcomeObsolete:
		return ledgerObsolete, nil
	case OutcomeRejected:
		return ledgerRejected, nil
	}
	return "", fmt.Errorf("unknown outcome %d", o)
}

// Ledger is the queue's ledger as committed.
type Ledger struct {
	Enqueued  uint64 // writes put in the queue, coalescing replacements included
	Coalesced uint64 // writes a later patch of the object took the place of
	Applied   uint64 // dequeued after a 2xx
	Obsolete  uint64 // dequeued as no longer wanted
	Rejected  uint64 // dequeued after a final 4xx
	// Resent counts sends of a write that an earlier send may have
	// applied: the process was killed after marking the write as being
	// sent and before dequeuing it, or the send ended without an answer
	// that settles it (no answer, or a 5xx).
	Resent uint64
	// Queued is the number of writes in the queue; Unconfirmed, of those,
	// the writes marked as being sent whose outcome is unknown (their
	// next send counts as resent).
	Queued      int
	Unconfirmed int
}

// Balanced reports whether every write enqueued is accounted for:
// coalesced, applied, obsolete, rejected or still queued.
func (l Ledger) Balanced() bool {
	return l.Enqueued == l.Coalesced+l.Applied+l.Obsolete+l.Rejected+uint64(l.Queued)
}

func (l Ledger) String() string {
	verdict := "balanced"
	if !l.Balanced() {
		verdict = "NOT balanced"
	}
	return fmt.Sprintf("enqueued %d = coalesced %d + applied %d + obsolete %d + rejected %d + queued %d (%s); resent %d, unconfirmed %d",
		l.Enqueued, l.Coalesced, l.Applied, l.Obsolete, l.Rejected, l.Queued, verdict, l.Resent, l.Unconfirmed)
}

// Ledger reads the queue's ledger, counters and queue in one read
// transaction.
func (s *Store) Ledger() (Ledger, error) {
	var l Ledger
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		l, err = readLedger(tx)
		return err
	})
	if err != nil {
		return l, fmt.Errorf("read the queue's ledger: %w", err)
	}
	return l, nil
}

func readLedger(tx *bolt.Tx) (Ledger, error) {
	var l Ledger
	lb := tx.Bucket(bucketLedger)
	if lb == nil {
		return l, errors.New("the file has no ledger")
	}
	for _, c := range ledgerCounters {
		v, err := counterValue(lb, c)
		if err != nil {
			return l, err
		}
		switch c {
		case ledgerEnqueued:
			l.Enqueued = v
		case ledgerCoalesced:
			l.Coalesced = v
		case ledgerApplied:
			l.Applied = v
		case ledgerObsolete:
			l.Obsolete = v
		case ledgerRejected:
			l.Rejected = v
		case ledgerResent:
			l.Resent = v
		}
	}
	l.Queued = tx.Bucket(bucketQueue).Stats().KeyN
	if sb := lb.Bucket(bucketSending); sb != nil {
		l.Unconfirmed = sb.Stats().KeyN
	}
	return l, nil
}

func counterValue(lb *bolt.Bucket, name string) (uint64, error) {
	v := lb.Get([]byte(name))
	switch len(v) {
	case 0:
		return 0, nil
	case 8:
		return binary.BigEndian.Uint64(v), nil
	}
	return 0, fmt.Errorf("ledger counter %s is %d bytes, not 8", name, len(v))
}

// count adds n to a counter of the ledger (the writer's transaction).
func (s *Store) count(tx *bolt.Tx, name string, n uint64) error {
	lb := tx.Bucket(bucketLedger)
	v, err := counterValue(lb, name)
	if err != nil {
		return err
	}
	s.dirty = true
	return lb.Put([]byte(name), binary.BigEndian.AppendUint64(nil, v+n))
}

// initLedger creates the ledger of a file that has none (a new file, or
// one of an older build: its queued writes count as enqueued now) and
// removes marks of writes no longer queued (Open's transaction).
func initLedger(tx *bolt.Tx) error {
	lb := tx.Bucket(bucketLedger)
	if lb == nil {
		var err error
		if lb, err = tx.CreateBucket(bucketLedger); err != nil {
			return err
		}
		n := tx.Bucket(bucketQueue).Stats().KeyN
		if err := lb.Put([]byte(ledgerEnqueued), binary.BigEndian.AppendUint64(nil, uint64(n))); err != nil {
			return err
		}
	}
	sb, err := lb.CreateBucketIfNotExists(bucketSending)
	if err != nil {
		return err
	}
	q := tx.Bucket(bucketQueue)
	var stale [][]byte
	sb.ForEach(func(k, _ []byte) error {
		if q.Get(k) == nil {
			stale = append(stale, bytes.Clone(k))
		}
		return nil
	})
	for _, k := range stale {
		if err := sb.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// sendingBucket is ledger/sending/.
func sendingBucket(tx *bolt.Tx) *bolt.Bucket {
	return tx.Bucket(bucketLedger).Bucket(bucketSending)
}

// MarkSending records, before the replay sends the queued write seq, that
// a send of it may reach the cloud, and returns once that is committed.
// If the write was marked already (a send of it by this process or one
// before it, killed before it could dequeue it, ended without an answer
// that settles it) the send about to be made may apply it twice: it is
// counted as resent, and resent is true. Status merge patches that set
// values (what kubelet sends) apply the same twice; the ledger says how
// often that happened.
//
// Its cost: one read-write transaction of its own per replayed write (two
// fdatasyncs of the file, as every commit), in addition to the one that
// dequeues it. It is what makes "each write applied exactly once, or
// counted as resent" checkable across a kill -9.
func (s *Store) MarkSending(seq uint64) (resent bool, err error) {
	err = s.write(func(tx *bolt.Tx) error {
		resent = false
		k := seqKey(seq)
		if tx.Bucket(bucketQueue).Get(k) == nil {
			return fmt.Errorf("write %d is not queued", seq)
		}
		sb := sendingBucket(tx)
		if sb.Get(k) != nil {
			resent = true
			return s.count(tx, ledgerResent, 1)
		}
		s.dirty = true
		return sb.Put(k, binary.BigEndian.AppendUint64(nil, uint64(s.clock.Now().Unix())))
	})
	if err != nil {
		return false, fmt.Errorf("mark write %d as being sent: %w", seq, err)
	}
	return resent, nil
}

// Unmark removes the mark of MarkSending when the send is known not to
// have applied the write (it was never sent, or the cloud answered 429).
func (s *Store) Unmark(seq uint64) error {
	err := s.write(func(tx *bolt.Tx) error {
		sb := sendingBucket(tx)
		if sb.Get(seqKey(seq)) == nil {
			return nil
		}
		s.dirty = true
		return sb.Delete(seqKey(seq))
	})
	if err != nil {
		return fmt.Errorf("unmark write %d: %w", seq, err)
	}
	return nil
}

// ledgerDump is the ledger's keys and values, to compare two files'.
func ledgerDump(tx *bolt.Tx) string {
	lb := tx.Bucket(bucketLedger)
	if lb == nil {
		return "none"
	}
	var b strings.Builder
	lb.ForEach(func(k, v []byte) error {
		fmt.Fprintf(&b, "%s=%x ", k, v)
		return nil
	})
	if sb := lb.Bucket(bucketSending); sb != nil {
		sb.ForEach(func(k, v []byte) error {
			fmt.Fprintf(&b, "sending/%x=%x ", k, v)
			return nil
		})
	}
	return b.String()
}

// carryLedger copies the ledger of a file moved aside for its schema
// version (ob, nil if it has none) into the fresh file's, whose queue
// holds the n writes carried from it. Every schema version keeps ledger/
// as the package doc has it; an old file without one (or with counters
// this build cannot read) gets the carried writes counted as enqueued.
func carryLedger(tx *bolt.Tx, ob *bolt.Bucket, n int) error {
	lb := tx.Bucket(bucketLedger)
	if ob != nil {
		if checkLedger(ob) == nil {
			for _, c := range ledgerCounters {
				if v := ob.Get([]byte(c)); v != nil {
					if err := lb.Put([]byte(c), bytes.Clone(v)); err != nil {
						return err
					}
				}
			}
			q := tx.Bucket(bucketQueue)
			sb := lb.Bucket(bucketSending)
			if osb := ob.Bucket(bucketSending); osb != nil {
				return osb.ForEach(func(k, v []byte) error {
					if q.Get(k) == nil {
						return nil
					}
					return sb.Put(bytes.Clone(k), bytes.Clone(v))
				})
			}
			return nil
		}
	}
	return lb.Put([]byte(ledgerEnqueued), binary.BigEndian.AppendUint64(nil, uint64(n)))
}

// checkLedger checks that every counter of lb reads.
func checkLedger(lb *bolt.Bucket) error {
	for _, c := range ledgerCounters {
		if _, err := counterValue(lb, c); err != nil {
			return err
		}
	}
	return nil
}
