// Package boltfile opens a bbolt file that may be damaged. tether-edge's
// files (the apiserver cache, the pool replica) are copies of what the
// cloud or the pool's leader has; a damaged one must never stop the node
// (bbolt panics on some corrupt pages, so a plain bolt.Open crash-loops
// the service on every restart). Open reads the whole file before it is
// used, with memory faults turned into panics it recovers, after a check
// of its page graph that cannot loop (pages.go); a file that
// fails is renamed <file>.corrupt-<UTC time> (only the newest such file is
// kept) and a fresh one is created. Errors of the environment (the file
// locked by another process, permissions, a read-only or full disk) leave
// the file where it is and are returned.
package boltfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrLocked matches (errors.Is) the error of a file another process holds
// open (bbolt's lock timeout).
var ErrLocked = errors.New("locked by another process")

// Options configure Open.
type Options struct {
	// Bolt are bbolt's options; Timeout, the wait for another process's
	// lock, defaults to 1 s.
	Bolt bolt.Options
	// Init runs in a read-write transaction once the file passed the
	// checks (and again on the fresh file after a move): create buckets,
	// check the schema version, read what the caller keeps in memory. An
	// error or a panic in it counts as damage, unless the error is of the
	// environment (see IsEnvironment). It must not keep what it read from
	// a file it failed on.
	Init func(tx *bolt.Tx) error
}

// Aside says that a damaged file was moved aside, where, and why.
type Aside struct {
	Path  string
	Cause error
}

// Open opens the bbolt file at path, creating it and its directory as
// needed. It checks the page graph (every page reached once, inside the
// file, of the right type, its elements inside it), walks every bucket,
// key and value, runs bbolt's consistency check and o.Init. A file that fails is renamed (aside says where and
// why; the caller logs it) and replaced by a fresh one; an error of the
// environment is returned as is (errors.Is ErrLocked for a lock timeout)
// and the file left alone.
func Open(path string, o Options) (db *bolt.DB, aside *Aside, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, nil, err
	}
	if o.Bolt.Timeout == 0 {
		o.Bolt.Timeout = time.Second
	}
	db, err = openChecked(path, o)
	if err == nil {
		return db, nil, nil
	}
	if IsEnvironment(err) {
		return nil, nil, err
	}
	aside = &Aside{Path: path + ".corrupt-" + time.Now().UTC().Format("20060102T150405.000Z"), Cause: err}
	if rerr := os.Rename(path, aside.Path); rerr != nil {
		return nil, nil, fmt.Errorf("%w; and cannot move it aside: %w", err, rerr)
	}
	removeOlder(path, aside.Path)
	if db, err = openChecked(path, o); err != nil {
		return nil, aside, err
	}
	return db, aside, nil
}

// IsEnvironment reports whether err is the environment's rather than the
// file's content: bbolt's lock timeout, or an error of the operating
// system (permission, read-only file system, no space, too many open
// files...), except EIO, which says the file's blocks cannot be read.
func IsEnvironment(err error) bool {
	if errors.Is(err, berrors.ErrTimeout) || errors.Is(err, ErrLocked) {
		return true
	}
	var errno syscall.Errno
	return errors.As(err, &errno) && errno != syscall.EIO
}

// removeOlder removes the files moved aside before keep.
func removeOlder(path, keep string) {
	old, _ := filepath.Glob(globEscape(path) + ".corrupt-*")
	for _, f := range old {
		if f != keep {
			os.Remove(f)
		}
	}
}

// globEscape escapes the glob metacharacters of a path.
func globEscape(p string) string {
	out := make([]byte, 0, len(p))
	for i := range len(p) {
		switch c := p[i]; c {
		case '*', '?', '[', '\\':
			out = append(out, '\\', c)
		default:
			out = append(out, c)
		}
	}
	return string(out)
}

// openChecked opens the file, checks its page graph before bbolt reads
// it (under bbolt's lock, taken first on the same descriptor), walks
// every bucket and value in it, runs bbolt's consistency check and
// o.Init, with panics (memory faults of the map included) recovered as
// errors.
func openChecked(path string, o Options) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading the file panicked: %v", r)
		}
		if err != nil && db != nil {
			db.Close()
			db = nil
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	o.Bolt.OpenFile = lockedOpener(o.Bolt.OpenFile, o.Bolt.ReadOnly, o.Bolt.Timeout, o.Bolt.PageSize)
	db, err = bolt.Open(path, 0o600, &o.Bolt)
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%w (is another tether-edge running with this data directory?): %w", ErrLocked, err)
	}
	if err != nil {
		return nil, err
	}
	err = db.View(func(tx *bolt.Tx) error {
		if err := walk(tx.Cursor(), tx.Bucket, 0); err != nil {
			return err
		}
		var errs []error
		for e := range tx.Check() {
			errs = append(errs, e)
		}
		if len(errs) > 0 {
			return fmt.Errorf("consistency check: %w", errors.Join(errs[:min(len(errs), 5)]...))
		}
		return nil
	})
	if err != nil || o.Init == nil {
		return db, err
	}
	return db, db.Update(o.Init)
}

// walk reads every key and value under a cursor, descending into nested
// buckets, so that a broken page shows up now rather than later.
func walk(c *bolt.Cursor, bucket func([]byte) *bolt.Bucket, depth int) error {
	if depth > 8 {
		return errors.New("buckets nested too deep")
	}
	var sum byte
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			b := bucket(k)
			if b == nil {
				return fmt.Errorf("bucket %q does not open", k)
			}
			if err := walk(b.Cursor(), b.Bucket, depth+1); err != nil {
				return err
			}
			continue
		}
		for _, x := range v {
			sum ^= x
		}
	}
	runtime.KeepAlive(sum) // the reads are the point
	return nil
}
