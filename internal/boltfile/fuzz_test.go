package boltfile

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Whatever the file holds, Open returns: the file opens, or it is moved
// aside and a fresh one opens; it never hangs, panics or fails. The
// corpus (testdata/fuzz/FuzzOpen) holds small bbolt files of 1 KiB
// pages with nested, inline and overflowing buckets, healthy and with a
// branch pointing back at its parent.
func FuzzOpen(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, content []byte) {
		path := filepath.Join(t.TempDir(), "f.db")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		db, aside, err := Open(path, Options{Bolt: bolt.Options{Timeout: time.Second}})
		if err != nil {
			t.Fatalf("Open: %v (aside %+v)", err, aside)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	})
}
