package cache

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

// ErrQueueNotCarried matches (errors.Is) the error of an Open that found
// a file of another schema version holding queued writes it cannot read:
// the file is left where it was, and tether-edge must not start.
var ErrQueueNotCarried = errors.New("queued writes cannot be carried to this schema version")

// schemaError is a file of another schema version than this build's.
type schemaError struct {
	found string // "" for a file without one
}

func (e *schemaError) Error() string {
	if e.found == "" {
		return "no schema version"
	}
	return fmt.Sprintf("schema version %q, this build knows %q", e.found, SchemaVersion)
}

// carryQueue copies the queue of the file at old, which Open moved aside
// for its schema version, into db, a fresh file, keeping seqs and the
// bucket's sequence, and its ledger (carryLedger). Every schema version
// keeps queue/ as internal/localapi/README.md has it; a queued write that does not read as such (a newer build's
// format) fails the whole carry, and nothing is written.
func carryQueue(db *bolt.DB, old string) (int, error) {
	odb, err := bolt.Open(old, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", old, err)
	}
	defer odb.Close()
	n := 0
	err = odb.View(func(otx *bolt.Tx) error {
		ob := otx.Bucket(bucketQueue)
		if ob == nil {
			return nil
		}
		return db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketQueue)
			last := uint64(0)
			err := ob.ForEach(func(k, v []byte) error {
				if v == nil {
					return fmt.Errorf("queue holds bucket %q", k)
				}
				if len(k) != 8 {
					return fmt.Errorf("queue key %x is not a seq", k)
				}
				seq := binary.BigEndian.Uint64(k)
				if err := checkQueued(v); err != nil {
					return fmt.Errorf("queued write %d: %w", seq, err)
				}
				last = seq
				n++
				return b.Put(bytes.Clone(k), bytes.Clone(v))
			})
			if err != nil {
				return err
			}
			if err := b.SetSequence(max(ob.Sequence(), last)); err != nil {
				return err
			}
			return carryLedger(tx, otx.Bucket(bucketLedger), n)
		})
	})
	return n, err
}

// checkQueued checks that v is a QueuedWrite as this build writes it:
// no field it does not know (which replay would drop), and what replay
// needs.
func checkQueued(v []byte) error {
	d := json.NewDecoder(bytes.NewReader(v))
	d.DisallowUnknownFields()
	var w QueuedWrite
	if err := d.Decode(&w); err != nil {
		return err
	}
	if d.More() {
		return errors.New("data after the write")
	}
	if w.Method == "" || w.Path == "" || w.Version == "" || w.Resource == "" || w.Name == "" {
		return errors.New("no method, path, version, resource or name")
	}
	return nil
}

// restore puts the file moved aside back at path, in place of the fresh
// one, and returns err with what went wrong doing so.
func restore(path, aside string, err error) error {
	if rerr := os.Remove(path); rerr != nil {
		return fmt.Errorf("%w; and the fresh file cannot be removed: %w", err, rerr)
	}
	if rerr := os.Rename(aside, path); rerr != nil {
		return fmt.Errorf("%w; and it cannot be put back from %s: %w", err, aside, rerr)
	}
	return err
}
