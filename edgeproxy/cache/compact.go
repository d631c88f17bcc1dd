package cache

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bbolt never gives free pages back to the file system: a file grown by a
// burst (a long offline period's queue, a big list) keeps its size.
// Compaction copies what the file holds into a new file, fsyncs it and
// renames it over the old one; at every instant the file at the path is
// whole (the old one until the rename, the new one after), and a copy an
// interruption leaves behind is removed at the next open.

// compactSuffix names the copy being made: <file>.compact.
const compactSuffix = ".compact"

// compactTxBytes bounds what one transaction of the copy holds in memory.
const compactTxBytes = 4 << 20

// compactStep, when set (tests), is called after each step of a
// compaction: created, copied, synced, renamed.
var compactStep func(step string)

func step(name string) {
	if compactStep != nil {
		compactStep(name)
	}
}

// Compact compacts the file now, whatever its free space, and returns
// once the compacted file is in place (or the compaction failed, leaving
// the file as it was). Writes wait meanwhile; reads go on.
func (s *Store) Compact() error {
	done := make(chan error, 1)
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	s.upkeep.compactNow <- done
	s.mu.RUnlock()
	return <-done
}

// compact compacts the file (writer only), logs and counts the result.
func (s *Store) compact(use usage) error {
	u := &s.upkeep
	start := time.Now()
	err := s.compactFile()
	if err != nil {
		u.compactions.WithLabelValues("failed").Inc()
		s.log.Warn("cache compaction failed; the file stays as it was", "path", s.path, "err", err)
		return err
	}
	after := use.file
	if fi, err := os.Stat(s.path); err == nil {
		after = fi.Size()
	}
	u.compactions.WithLabelValues("ok").Inc()
	if after < use.file {
		u.reclaimed.Add(float64(use.file - after))
	}
	s.log.Info("cache compacted", "path", s.path, "before", mib(use.file), "after", mib(after),
		"data", mib(use.used), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// compactFile copies the file into <file>.compact, checks that the copy
// holds the whole queue and its ledger, fsyncs it, renames it over the file and swaps
// the open DB for it.
func (s *Store) compactFile() (err error) {
	tmp := s.path + compactSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	opts := boltOptions()
	opts.NoSync = true // the copy is synced once, whole, before it replaces the file
	dst, err := bolt.Open(tmp, 0o600, &opts)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			dst.Close()
			os.Remove(tmp)
		}
	}()
	step("created")
	if err := bolt.Compact(dst, s.db.DB, compactTxBytes); err != nil {
		return fmt.Errorf("copy into %s: %w", tmp, err)
	}
	step("copied")
	var q queueUsage
	var ledger, wantLedger string
	dst.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketQueue) != nil {
			q = countQueue(tx)
		}
		ledger = ledgerDump(tx)
		return nil
	})
	s.db.DB.View(func(tx *bolt.Tx) error {
		wantLedger = ledgerDump(tx)
		return nil
	})
	s.qmu.Lock()
	want := s.queue
	s.qmu.Unlock()
	if q != want {
		return fmt.Errorf("the copy holds %d queued writes of %d bytes, the file %d of %d", q.writes, q.bytes, want.writes, want.bytes)
	}
	if ledger != wantLedger {
		return fmt.Errorf("the copy's queue ledger (%s) is not the file's (%s)", ledger, wantLedger)
	}
	dst.NoSync = s.db.NoSync
	if err := dst.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	step("synced")
	s.db.mu.Lock()
	if err := os.Rename(tmp, s.path); err != nil {
		s.db.mu.Unlock()
		return err
	}
	old := s.db.DB
	s.db.DB = dst
	s.db.mu.Unlock()
	step("renamed")
	if err := syncDir(filepath.Dir(s.path)); err != nil {
		s.log.Warn("cache compacted, but its directory does not sync: after a power loss the old file may be back (whole)", "path", s.path, "err", err)
	}
	if err := old.Close(); err != nil {
		s.log.Warn("cache compacted; closing the old file failed", "err", err)
	}
	return nil
}

// syncDir fsyncs a directory, for a rename in it to last.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeCompactLeftover removes the copy an interrupted compaction left:
// the file itself is whole (the copy replaces it only once complete).
func removeCompactLeftover(path string, log *slog.Logger) {
	tmp := path + compactSuffix
	err := os.Remove(tmp)
	switch {
	case err == nil:
		log.Info("cache: removed the copy an interrupted compaction left; the cache file was not touched", "removed", tmp)
	case !errors.Is(err, fs.ErrNotExist):
		log.Warn("cache: cannot remove the copy an interrupted compaction left", "path", tmp, "err", err)
	}
}
