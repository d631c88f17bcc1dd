package boltfile

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// layout is where writeTree put things, read back with bbolt.
type layout struct {
	pageSize uint64
	hwm      uint64
	free     int    // free pages, as bbolt counts them
	root     uint64 // the root bucket's page (a leaf: it holds few buckets)
	a        uint64 // bucket a's page (a leaf: b, inl)
	b        uint64 // bucket a/b's root page (a branch, with branches under it)
	big      uint64 // bucket big's page (a leaf with overflow pages)
}

// writeTree writes a bbolt file with buckets a (holding the inline
// bucket inl and the bucket b of keys enough for three levels of branch
// and leaf pages), big (values larger than a page) and small (inline).
func writeTree(t testing.TB, path string, pageSize int) layout {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{PageSize: pageSize})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		a, err := tx.CreateBucket([]byte("a"))
		if err != nil {
			return err
		}
		inl, err := a.CreateBucket([]byte("inl"))
		if err != nil {
			return err
		}
		if err := inl.Put([]byte("k"), []byte("v")); err != nil {
			return err
		}
		b, err := a.CreateBucket([]byte("b"))
		if err != nil {
			return err
		}
		for i := range 3000 {
			if err := b.Put(fmt.Appendf(nil, "key-%06d-%s", i, strings.Repeat("k", 40)), fmt.Appendf(nil, "value %d", i)); err != nil {
				return err
			}
		}
		big, err := tx.CreateBucket([]byte("big"))
		if err != nil {
			return err
		}
		for i := range 3 {
			if err := big.Put(fmt.Appendf(nil, "big-%d", i), bytes.Repeat([]byte{byte(i)}, 3*pageSize)); err != nil {
				return err
			}
		}
		small, err := tx.CreateBucket([]byte("small"))
		if err != nil {
			return err
		}
		return small.Put([]byte("one"), []byte("1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	// A second transaction, so that the file has free pages and the two
	// meta pages differ.
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("small")).Put([]byte("two"), []byte("2")) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l := layout{pageSize: uint64(db.Info().PageSize), free: db.Stats().FreePageN}
	err = db.View(func(tx *bolt.Tx) error {
		l.hwm = uint64(tx.Size()) / l.pageSize
		a := tx.Bucket([]byte("a"))
		l.a, l.b, l.big = uint64(a.Root()), uint64(a.Bucket([]byte("b")).Root()), uint64(tx.Bucket([]byte("big")).Root())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	m, _, err := chooseMeta(f, fi.Size(), pageSize)
	if err != nil {
		t.Fatal(err)
	}
	l.root = m.root
	return l
}

// file is a bbolt file's bytes, to damage.
type file struct {
	b  []byte
	ps uint64
}

func (f file) page(id uint64) []byte        { return f.b[id*f.ps:] }
func (f file) flags(id uint64) uint16       { return ne.Uint16(f.page(id)[8:]) }
func (f file) count(id uint64) uint16       { return ne.Uint16(f.page(id)[10:]) }
func (f file) overflow(id uint64) uint32    { return ne.Uint32(f.page(id)[12:]) }
func (f file) elem(id, i uint64) []byte     { return f.page(id)[pageHeaderSize+i*elementSize:] }
func (f file) child(id, i uint64) uint64    { return ne.Uint64(f.elem(id, i)[8:]) }
func (f file) setChild(id, i, to uint64)    { ne.PutUint64(f.elem(id, i)[8:], to) }
func (f file) setFlags(id uint64, v int)    { ne.PutUint16(f.page(id)[8:], uint16(v)) }
func (f file) setCount(id uint64, v int)    { ne.PutUint16(f.page(id)[10:], uint16(v)) }
func (f file) setOverflow(id uint64, v int) { ne.PutUint32(f.page(id)[12:], uint32(v)) }

// value returns the value of the leaf element with key k in page id
// (bucket values included), in place.
func (f file) value(t *testing.T, id uint64, k string) []byte {
	t.Helper()
	if f.flags(id) != leafPage {
		t.Fatalf("page %d is not a leaf", id)
	}
	for i := range uint64(f.count(id)) {
		e := f.elem(id, i)
		pos, ksize, vsize := uint64(ne.Uint32(e[4:])), uint64(ne.Uint32(e[8:])), uint64(ne.Uint32(e[12:]))
		if string(e[pos:pos+ksize]) == k {
			return e[pos+ksize : pos+ksize+vsize]
		}
	}
	t.Fatalf("no key %q in page %d", k, id)
	return nil
}

// openBounded runs Open on a goroutine and fails the test if it does not
// return within 30 s, so that a loop fails instead of hanging.
func openBounded(t *testing.T, path string) (*bolt.DB, *Aside, error) {
	t.Helper()
	type result struct {
		db    *bolt.DB
		aside *Aside
		err   error
	}
	done := make(chan result, 1)
	go func() {
		db, aside, err := Open(path, Options{})
		done <- result{db, aside, err}
	}()
	select {
	case r := <-done:
		if r.db != nil {
			t.Cleanup(func() { r.db.Close() })
		}
		return r.db, r.aside, r.err
	case <-time.After(30 * time.Second):
		t.Fatal("Open did not return within 30 s")
		return nil, nil, nil
	}
}

// A healthy file with several levels of branch pages, overflow pages
// and inline buckets passes, and the check reaches every page in use.
func TestHealthyTreePasses(t *testing.T) {
	for _, ps := range []int{1024, 4096} {
		t.Run(fmt.Sprint(ps), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f.db")
			l := writeTree(t, path, ps)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f := file{raw, l.pageSize}
			if f.flags(l.b) != branchPage || f.flags(f.child(l.b, 0)) != branchPage {
				t.Fatalf("bucket a/b has not two levels of branch pages: %#x over %#x", f.flags(l.b), f.flags(f.child(l.b, 0)))
			}

			fd, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer fd.Close()
			st, err := checkPages(fd, ps)
			if err != nil {
				t.Fatalf("checkPages: %v", err)
			}
			if st.overflows == 0 || st.inlines != 2 || st.branches < 3 {
				t.Errorf("read %+v; want overflow pages, 2 inline buckets, 3 branch pages or more", st)
			}
			// Every page below the mark is a meta page, the freelist,
			// free or in the tree: the check saw the whole tree.
			if used := 2 + st.freelist + st.branches + st.leaves + st.overflows; uint64(used+l.free) != l.hwm {
				t.Errorf("reached %d pages (%+v) and %d are free, of %d", used, st, l.free, l.hwm)
			}

			db, aside, err := openBounded(t, path)
			if err != nil || aside != nil {
				t.Fatalf("Open of a healthy file: %v, %+v", err, aside)
			}
			err = db.View(func(tx *bolt.Tx) error {
				if v := tx.Bucket([]byte("a")).Bucket([]byte("b")).Get(fmt.Appendf(nil, "key-%06d-%s", 2999, strings.Repeat("k", 40))); string(v) != "value 2999" {
					return fmt.Errorf("last key of a/b: %q", v)
				}
				if v := tx.Bucket([]byte("big")).Get([]byte("big-2")); len(v) != 3*ps {
					return fmt.Errorf("big-2 has %d bytes", len(v))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Each kind of damage to the page graph is found before bbolt's cursors
// run, and the file is moved aside.
func TestDamagedPageGraphMovedAside(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	l := writeTree(t, good, 4096)
	goodBytes, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, f file) []byte // returns the file's new content, nil for f.b
		want   string                            // {root}, {a}, {b}: those pages' ids
	}{
		{"branch points at an ancestor", func(t *testing.T, f file) []byte {
			f.setChild(f.child(l.b, 0), 0, l.b)
			return nil
		}, "page {b} is referenced twice"},
		{"branch points at itself", func(t *testing.T, f file) []byte {
			c := f.child(l.b, 0)
			f.setChild(c, 1, c)
			return nil
		}, "is referenced twice"},
		{"two elements share a page", func(t *testing.T, f file) []byte {
			f.setChild(l.b, 1, f.child(l.b, 0))
			return nil
		}, "element 1 of page {b}"},
		{"bucket root points at an ancestor", func(t *testing.T, f file) []byte {
			ne.PutUint64(f.value(t, l.a, "b"), l.root)
			return nil
		}, "the bucket of element"},
		{"bucket root points at its own page", func(t *testing.T, f file) []byte {
			ne.PutUint64(f.value(t, l.root, "a"), l.root)
			return nil
		}, "page {root} is referenced twice"},
		{"bucket root points at a meta page", func(t *testing.T, f file) []byte {
			ne.PutUint64(f.value(t, l.root, "big"), 1)
			return nil
		}, "page 1 is a meta page"},
		{"page beyond the high-water mark", func(t *testing.T, f file) []byte {
			f.setChild(l.b, 0, l.hwm)
			return nil
		}, "beyond the high-water mark"},
		{"page far beyond the file", func(t *testing.T, f file) []byte {
			f.setChild(l.b, 0, 1<<60)
			return nil
		}, "beyond the high-water mark"},
		{"file cut short", func(t *testing.T, f file) []byte {
			last := f.child(l.b, uint64(f.count(l.b))-1)
			return f.b[:last*f.ps]
		}, "beyond the end of the file"},
		{"page says it is another", func(t *testing.T, f file) []byte {
			ne.PutUint64(f.page(f.child(l.b, 0)), 7777)
			return nil
		}, "says it is page 7777"},
		{"freelist page in the tree", func(t *testing.T, f file) []byte {
			f.setFlags(l.a, freelistPage)
			return nil
		}, "page {a} has type 0x10"},
		{"meta page in the tree", func(t *testing.T, f file) []byte {
			f.setFlags(f.child(l.b, 0), 0x04)
			return nil
		}, "has type 0x4"},
		{"unknown page type", func(t *testing.T, f file) []byte {
			f.setFlags(l.root, 0x03)
			return nil
		}, "has type 0x3"},
		{"branch without elements", func(t *testing.T, f file) []byte {
			f.setCount(l.b, 0)
			return nil
		}, "branch page without elements"},
		{"elements beyond the page", func(t *testing.T, f file) []byte {
			f.setCount(l.a, 0xFFFF)
			return nil
		}, "elements do not fit"},
		{"branch key beyond the page", func(t *testing.T, f file) []byte {
			ne.PutUint32(f.elem(l.b, 2)[4:], 1<<31)
			return nil
		}, "the key of element 2"},
		{"value beyond the overflow pages", func(t *testing.T, f file) []byte {
			if f.overflow(l.big) == 0 {
				t.Fatal("bucket big's page has no overflow pages")
			}
			ne.PutUint32(f.elem(l.big, 0)[12:], uint32((1+f.overflow(l.big))*uint32(f.ps)))
			return nil
		}, "end beyond the page"},
		{"overflow beyond the high-water mark", func(t *testing.T, f file) []byte {
			f.setOverflow(l.big, 1<<30)
			return nil
		}, "the last overflow page of page"},
		{"overflow over a page in use", func(t *testing.T, f file) []byte {
			// Page a/b covers the page reached before it, a's.
			if l.a < l.b {
				t.Skipf("a's page %d comes before a/b's %d", l.a, l.b)
			}
			f.setOverflow(l.b, int(l.a-l.b))
			return nil
		}, "of page {b}: page {a} is referenced twice"},
		{"inline bucket is a branch", func(t *testing.T, f file) []byte {
			v := f.value(t, l.root, "small")
			ne.PutUint16(v[bucketHdrSize+8:], branchPage)
			return nil
		}, "an inline bucket in page {root} has type 0x1"},
		{"inline bucket's elements beyond its value", func(t *testing.T, f file) []byte {
			v := f.value(t, l.a, "inl")
			ne.PutUint16(v[bucketHdrSize+10:], 40)
			return nil
		}, "an inline bucket in page {a}: 40 elements do not fit"},
		{"bucket value too short", func(t *testing.T, f file) []byte {
			for i := range uint64(f.count(l.root)) {
				e := f.elem(l.root, i)
				if ne.Uint32(e[0:]) == bucketLeaf && ne.Uint32(e[12:]) == bucketHdrSize {
					ne.PutUint32(e[12:], 8)
					return nil
				}
			}
			t.Fatal("no bucket of 16 bytes in the root page")
			return nil
		}, "has a value of 8 bytes"},
		{"freelist count beyond its page", func(t *testing.T, f file) []byte {
			for id := uint64(2); id < l.hwm; id++ {
				if f.flags(id) == freelistPage && ne.Uint64(f.page(id)) == id {
					f.setCount(id, 0xFFFF)
					ne.PutUint64(f.page(id)[pageHeaderSize:], 1<<40)
					return nil
				}
			}
			t.Fatal("no freelist page")
			return nil
		}, "holds 1099511627776 ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := file{bytes.Clone(goodBytes), l.pageSize}
			content := tc.damage(t, f)
			if content == nil {
				content = f.b
			}
			path := filepath.Join(t.TempDir(), "f.db")
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			db, aside, err := openBounded(t, path)
			if err != nil || db == nil || aside == nil {
				t.Fatalf("Open: %v, aside %+v; want the file moved aside and a fresh one", err, aside)
			}
			want := strings.NewReplacer("{root}", fmt.Sprint(l.root), "{b}", fmt.Sprint(l.b), "{a}", fmt.Sprint(l.a)).Replace(tc.want)
			if !errors.Is(aside.Cause, errDamaged) || !strings.Contains(aside.Cause.Error(), want) {
				t.Errorf("moved aside for %q; want the page check's %q", aside.Cause, want)
			}
			if b, err := os.ReadFile(aside.Path); err != nil || !bytes.Equal(b, content) {
				t.Errorf("the file aside is not the damaged file (%v)", err)
			}
		})
	}
}

// The page check runs under bbolt's lock: a file another process holds
// is an error and is left alone, even if it looks damaged (the other
// process may be writing it).
func TestCheckWaitsForTheLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.db")
	holder, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	garbage := bytes.Repeat([]byte("not a bbolt file "), 1000)
	if err := os.WriteFile(path, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	opens := 0
	db, aside, err := Open(path, Options{Bolt: bolt.Options{
		Timeout: 200 * time.Millisecond,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			opens++
			return os.OpenFile(name, flag, perm)
		},
	}})
	if db != nil {
		db.Close()
	}
	if !errors.Is(err, ErrLocked) || aside != nil || opens != 1 {
		t.Fatalf("Open of a locked file: %v, aside %+v, opened %d times; want ErrLocked, nothing moved, the caller's OpenFile used", err, aside, opens)
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, garbage) {
		t.Fatalf("the locked file changed (%v)", err)
	}
}
