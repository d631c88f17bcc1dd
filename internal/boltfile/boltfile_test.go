package boltfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

func TestIsEnvironment(t *testing.T) {
	pathErr := func(errno syscall.Errno) error { return &fs.PathError{Op: "open", Path: "/x", Err: errno} }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{berrors.ErrTimeout, true},
		{fmt.Errorf("%w: %w", ErrLocked, berrors.ErrTimeout), true},
		{pathErr(syscall.EACCES), true},
		{pathErr(syscall.EROFS), true},
		{fmt.Errorf("commit: %w", syscall.ENOSPC), true},
		{pathErr(syscall.EIO), false},
		{berrors.ErrInvalid, false},
		{berrors.ErrChecksum, false},
		{errors.New("file size too small 10"), false},
		{errors.New("reading the file panicked: invalid page type"), false},
	} {
		if got := IsEnvironment(tc.err); got != tc.want {
			t.Errorf("IsEnvironment(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A file the process may not open is an error and stays where it is,
// even for root.
func TestPermissionDeniedFileStays(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.db")
	db, aside, err := Open(path, Options{})
	if err != nil || aside != nil {
		t.Fatalf("Open of a new file: %v, %v", aside, err)
	}
	db.Close()
	if err := os.Chmod(path, 0); err != nil {
		t.Fatal(err)
	}
	withoutDACOverride(t, func() { db, aside, err = Open(path, Options{}) })
	if db != nil {
		db.Close()
	}
	if !errors.Is(err, fs.ErrPermission) || aside != nil {
		t.Fatalf("Open of an unreadable file: %v, %v; want permission denied", aside, err)
	}
	if moved, _ := filepath.Glob(path + ".corrupt-*"); len(moved) > 0 {
		t.Fatalf("moved aside: %v", moved)
	}
}

// A panic or an error of Init moves the file aside; Init runs again on
// the fresh file.
func TestInitFailureMovesAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.db")
	db, _, err := Open(path, Options{Init: func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("old-schema"))
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	for _, fail := range []func(){func() { panic("bad value") }, nil} {
		calls := 0
		db, aside, err := Open(path, Options{Init: func(tx *bolt.Tx) error {
			calls++
			if tx.Bucket([]byte("old-schema")) == nil {
				_, err := tx.CreateBucket([]byte("old-schema"))
				return err
			}
			if fail != nil {
				fail()
			}
			return errors.New("schema version 0, this build reads 1")
		}})
		if err != nil || aside == nil || calls != 2 {
			t.Fatalf("Open: %v, aside %+v, Init ran %d times; want moved aside, Init twice", err, aside, calls)
		}
		db.Close()
		if moved, _ := filepath.Glob(path + ".corrupt-*"); len(moved) != 1 || moved[0] != aside.Path {
			t.Fatalf("files aside %v, want only %s", moved, aside.Path)
		}
	}
}

// withoutDACOverride runs fn on an OS thread without the capabilities
// that let root ignore file permissions. The thread is never unlocked,
// so it ends with fn's goroutine.
func withoutDACOverride(t *testing.T, fn func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capget: %w", err)
			return
		}
		for _, c := range []uint{unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH} {
			data[c/32].Effective &^= 1 << (c % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capset: %w", err)
			return
		}
		fn()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
