package boltfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"syscall"
	"time"

	berrors "go.etcd.io/bbolt/errors"
)

// The page graph check. bbolt trusts the file's pages: a damaged branch
// page that points back up the tree makes its cursors and its own
// consistency check (tx.Check) loop for ever, and a damaged freelist
// page can make it allocate without bound. So before bbolt reads the
// file, checkPages reads its pages itself (ReadAt, a page or so at a
// time) and walks the tree from the root bucket of the meta page bbolt
// would choose, with a set of the pages seen and an explicit stack: every
// page once at most, a work bounded by the file's size.
//
// The layout is bbolt v1.5.0's (internal/common: page.go, meta.go,
// bucket.go; db.go for the choice of the meta page), in the machine's
// byte order as bbolt writes it:
//
//	page header (16)  id u64 | flags u16 | count u16 | overflow u32
//	meta (after it)   magic u32 | version u32 | pageSize u32 | flags u32 |
//	                  root bucket {root u64, sequence u64} | freelist u64 |
//	                  pgid (high-water mark) u64 | txid u64 | checksum u64
//	                  (FNV-64a of the 56 bytes before it)
//	branch element    pos u32 | ksize u32 | pgid u64
//	leaf element      flags u32 | pos u32 | ksize u32 | vsize u32
//	                  (pos counts from the element itself)
//	bucket value      {root u64, sequence u64}, then, when root is 0, the
//	                  bucket's own (inline) leaf page
//	freelist page     count ids u64; a count of 0xFFFF means the first
//	                  u64 holds the real count
const (
	pageHeaderSize = 16
	elementSize    = 16 // branch and leaf elements alike
	bucketHdrSize  = 16
	metaSize       = 64
	metaSumSize    = 56 // the bytes the checksum covers

	branchPage   = 0x01
	leafPage     = 0x02
	freelistPage = 0x10
	bucketLeaf   = 0x01

	boltMagic   = 0xED0CDAED
	boltVersion = 2
	noFreelist  = ^uint64(0)

	minPageSize = 512
	maxPageSize = 16 << 20 // bbolt looks no further for its second meta page
)

// errDamaged is wrapped by the errors of checkPages: what it found is
// the file's content, never the environment.
var errDamaged = errors.New("damaged page structure")

func damaged(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errDamaged, fmt.Sprintf(format, a...))
}

var ne = binary.NativeEndian

// pageStats counts what checkPages read, for tests.
type pageStats struct {
	pageSize  uint64
	hwm       uint64
	branches  int // branch pages
	leaves    int // leaf pages
	overflows int // overflow pages of branch and leaf pages
	inlines   int // inline buckets
	freelist  int // freelist pages, overflow included
}

// lockedOpener returns an OpenFile for bbolt that opens the file with
// open, takes bbolt's lock on it (exclusive unless shared, waiting up to
// timeout, 0 for ever, like bbolt) and runs checkPages on it before
// bbolt reads a byte. bbolt's own lock on the same descriptor then
// succeeds at once, so no other process can write the file between the
// check and bbolt's reading.
func lockedOpener(open func(string, int, os.FileMode) (*os.File, error), shared bool, timeout time.Duration, pageSize int) func(string, int, os.FileMode) (*os.File, error) {
	if open == nil {
		open = os.OpenFile
	}
	if pageSize == 0 {
		pageSize = os.Getpagesize()
	}
	return func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := open(name, flag, perm)
		if err != nil {
			return nil, err
		}
		if err = lock(f, shared, timeout); err == nil {
			_, err = checkPages(f, pageSize)
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
}

// lock is bbolt's flock: try, and retry every 50 ms until timeout.
func lock(f *os.File, shared bool, timeout time.Duration) error {
	how := syscall.LOCK_EX | syscall.LOCK_NB
	if shared {
		how = syscall.LOCK_SH | syscall.LOCK_NB
	}
	start := time.Now()
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EWOULDBLOCK {
			return err
		}
		if timeout != 0 && time.Since(start) > timeout-50*time.Millisecond {
			return berrors.ErrTimeout
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// meta is what checkPages uses of a meta page.
type meta struct {
	pageSize uint64
	root     uint64
	freelist uint64
	hwm      uint64
	txid     uint64
}

// readMeta reads the meta page at off; ok says it is valid (magic,
// version, checksum), as bbolt's Meta.Validate.
func readMeta(f *os.File, off int64) (m meta, ok bool, err error) {
	var b [pageHeaderSize + metaSize]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return m, false, fmt.Errorf("read the meta page at %d: %w", off, err)
		}
		return m, false, nil // short: not a meta page
	}
	p := b[pageHeaderSize:]
	h := fnv.New64a()
	h.Write(p[:metaSumSize])
	m = meta{
		pageSize: uint64(ne.Uint32(p[8:])),
		root:     ne.Uint64(p[16:]),
		freelist: ne.Uint64(p[32:]),
		hwm:      ne.Uint64(p[40:]),
		txid:     ne.Uint64(p[48:]),
	}
	ok = ne.Uint32(p[0:]) == boltMagic && ne.Uint32(p[4:]) == boltVersion && ne.Uint64(p[56:]) == h.Sum64()
	return m, ok, nil
}

// chooseMeta finds the page size as bbolt's getPageSize does (the first
// meta page, else the second one searched at 1 KiB << 0..14, else
// defaultPageSize) and returns the meta page bbolt's DB.meta would use:
// the valid one with the higher txid. bbolt addresses the pages with the
// page size it found, whatever the chosen meta page says, and so does
// checkPages.
func chooseMeta(f *os.File, size int64, defaultPageSize int) (meta, uint64, error) {
	var pageSize uint64
	if m, ok, err := readMeta(f, 0); err != nil {
		return meta{}, 0, err
	} else if ok {
		pageSize = m.pageSize
	} else {
		for i := range 15 {
			pos := int64(1024) << i
			if pos >= size-1024 {
				break
			}
			if m, ok, err := readMeta(f, pos); err != nil {
				return meta{}, 0, err
			} else if ok {
				pageSize = m.pageSize
				break
			}
		}
	}
	if pageSize == 0 {
		pageSize = uint64(defaultPageSize)
	}
	if pageSize < minPageSize || pageSize > maxPageSize {
		return meta{}, 0, damaged("page size %d, want %d to %d", pageSize, minPageSize, maxPageSize)
	}
	m0, ok0, err := readMeta(f, 0)
	if err != nil {
		return meta{}, 0, err
	}
	m1, ok1, err := readMeta(f, int64(pageSize))
	if err != nil {
		return meta{}, 0, err
	}
	if m1.txid > m0.txid {
		m0, ok0, m1, ok1 = m1, ok1, m0, ok0
	}
	switch {
	case ok0:
		return m0, pageSize, nil
	case ok1:
		return m1, pageSize, nil
	}
	return meta{}, 0, damaged("no valid meta page (for a page size of %d)", pageSize)
}

// checker walks the page graph of one file.
type checker struct {
	f        *os.File
	pageSize uint64
	hwm      uint64   // the meta page's high-water mark
	npages   uint64   // pages that exist: below the mark and in the file
	seen     []uint64 // bitmap of the pages reached
	stack    []uint64 // pages reached, to read
	inline   [][]byte // inline bucket pages, to read
	budget   uint64   // page headers and elements the file can still hold
	buf      []byte   // a page
	stats    pageStats
}

// checkPages checks the page graph of the bbolt file f (see the top of
// this file); an empty file (bbolt initialises it) passes. Its errors
// wrap errDamaged, but for those of reading the file.
func checkPages(f *os.File, defaultPageSize int) (pageStats, error) {
	fi, err := f.Stat()
	if err != nil {
		return pageStats{}, err
	}
	size := fi.Size()
	if size == 0 {
		return pageStats{}, nil
	}
	m, pageSize, err := chooseMeta(f, size, defaultPageSize)
	if err != nil {
		return pageStats{}, err
	}
	c := &checker{
		f:        f,
		pageSize: pageSize,
		hwm:      m.hwm,
		npages:   min(m.hwm, uint64(size)/pageSize),
		budget:   uint64(size) / elementSize,
		buf:      make([]byte, pageSize),
	}
	c.stats.pageSize, c.stats.hwm = pageSize, m.hwm
	if c.npages < 2 {
		return c.stats, damaged("%d bytes and a high-water mark of %d pages of %d bytes: no room for the two meta pages", size, m.hwm, pageSize)
	}
	c.seen = make([]uint64, (c.npages+63)/64)
	c.seen[0] |= 3 // the meta pages
	if m.freelist != noFreelist {
		if err := c.checkFreelist(m.freelist); err != nil {
			return c.stats, err
		}
	}
	if err := c.reach(m.root, from{what: "the meta page's root bucket"}); err != nil {
		return c.stats, err
	}
	for len(c.stack) > 0 {
		id := c.stack[len(c.stack)-1]
		c.stack = c.stack[:len(c.stack)-1]
		if err := c.visit(id); err != nil {
			return c.stats, err
		}
	}
	return c.stats, nil
}

// from says where a page reference was found; it is formatted only for
// an error.
type from struct {
	what string // "element", "the bucket of element" or a whole phrase
	elem uint64
	p    *page // nil: what is the whole phrase
}

func (r from) String() string {
	if r.p == nil {
		return r.what
	}
	return fmt.Sprintf("%s %d of %s", r.what, r.elem, r.p)
}

// mark records that page id is in use, once.
func (c *checker) mark(id uint64, by from) error {
	switch {
	case id >= c.hwm:
		return damaged("%s: page %d is beyond the high-water mark (%d pages)", by, id, c.hwm)
	case id >= c.npages:
		return damaged("%s: page %d is beyond the end of the file (%d pages of %d bytes)", by, id, c.npages, c.pageSize)
	case id < 2:
		return damaged("%s: page %d is a meta page", by, id)
	case c.seen[id/64]&(1<<(id%64)) != 0:
		return damaged("%s: page %d is referenced twice (a loop or a shared page)", by, id)
	}
	c.seen[id/64] |= 1 << (id % 64)
	return nil
}

// reach marks page id and queues it for reading.
func (c *checker) reach(id uint64, by from) error {
	if err := c.mark(id, by); err != nil {
		return err
	}
	c.stack = append(c.stack, id)
	return nil
}

// readHeader reads the first page (or what of it the file has) of the
// page at id into c.buf and checks the header's id and the overflow
// pages, which it marks. It returns the flags, the count and the whole
// page's length.
func (c *checker) readHeader(id uint64) (flags, count uint16, n uint64, err error) {
	if _, err := c.f.ReadAt(c.buf, int64(id*c.pageSize)); err != nil {
		return 0, 0, 0, fmt.Errorf("read page %d: %w", id, err)
	}
	if got := ne.Uint64(c.buf[0:]); got != id {
		return 0, 0, 0, damaged("page %d says it is page %d", id, got)
	}
	flags, count = ne.Uint16(c.buf[8:]), ne.Uint16(c.buf[10:])
	overflow := uint64(ne.Uint32(c.buf[12:]))
	if last := id + overflow; last >= c.npages {
		return 0, 0, 0, c.mark(last, from{what: fmt.Sprintf("the last overflow page of page %d", id)})
	}
	for o := id + 1; o <= id+overflow; o++ {
		if err := c.mark(o, from{what: "overflow page", elem: o - id, p: &page{id: id}}); err != nil {
			return 0, 0, 0, err
		}
	}
	return flags, count, (1 + overflow) * c.pageSize, nil
}

// checkFreelist checks that the freelist page is one and that its ids
// fit in it; the ids themselves are for tx.Check.
func (c *checker) checkFreelist(id uint64) error {
	if err := c.mark(id, from{what: "the meta page's freelist"}); err != nil {
		return err
	}
	flags, count, n, err := c.readHeader(id)
	if err != nil {
		return err
	}
	if flags != freelistPage {
		return damaged("the freelist page %d has type %#x", id, flags)
	}
	c.stats.freelist = int(n / c.pageSize)
	ids, first := uint64(count), uint64(0)
	if count == 0xFFFF {
		ids, first = ne.Uint64(c.buf[pageHeaderSize:]), 1
	}
	if room := (n-pageHeaderSize)/8 - first; ids > room {
		return damaged("the freelist page %d holds %d ids in room for %d", id, ids, room)
	}
	return nil
}

// take charges n page headers and elements to the budget: a file of
// size bytes holds at most size/16, so a damaged page whose elements
// overlap (bucket values nested in one another) cannot make the work
// grow beyond the file's size.
func (c *checker) take(n uint64, where fmt.Stringer) error {
	if n > c.budget {
		return damaged("%s: more elements than the file can hold", where)
	}
	c.budget -= n
	return nil
}

// visit reads the branch or leaf page at id and the inline buckets in it.
func (c *checker) visit(id uint64) error {
	flags, count, n, err := c.readHeader(id)
	if err != nil {
		return err
	}
	p := &page{c: c, id: id, n: n, head: c.buf}
	switch flags {
	case branchPage:
		c.stats.branches++
	case leafPage:
		c.stats.leaves++
	default:
		return damaged("%s has type %#x, want a branch or a leaf page", p, flags)
	}
	c.stats.overflows += int(n/c.pageSize) - 1
	if err := c.elements(p, flags, count); err != nil {
		return err
	}
	for len(c.inline) > 0 {
		b := c.inline[len(c.inline)-1]
		c.inline = c.inline[:len(c.inline)-1]
		c.stats.inlines++
		ip := &page{c: c, id: id, inline: true, n: uint64(len(b)), head: b}
		if len(b) < pageHeaderSize {
			return damaged("%s: %d bytes, too short for a page header", ip, len(b))
		}
		if flags := ne.Uint16(b[8:]); flags != leafPage {
			return damaged("%s has type %#x, want a leaf page", ip, flags)
		}
		if err := c.elements(ip, leafPage, ne.Uint16(b[10:])); err != nil {
			return err
		}
	}
	return nil
}

// elements checks that the count elements of page p, their keys and
// their values fit in it, queues the pages of a branch and of the
// buckets of a leaf, and the inline buckets' pages.
func (c *checker) elements(p *page, flags, count uint16) error {
	if flags == branchPage && count == 0 {
		return damaged("%s is a branch page without elements", p)
	}
	if end := pageHeaderSize + uint64(count)*elementSize; end > p.n {
		return damaged("%s: %d elements do not fit in %d bytes", p, count, p.n)
	}
	if err := c.take(1+uint64(count), p); err != nil {
		return err
	}
	elems, err := p.at(pageHeaderSize, uint64(count)*elementSize)
	if err != nil {
		return err
	}
	for i := range uint64(count) {
		e := elems[i*elementSize:]
		off := pageHeaderSize + i*elementSize
		if flags == branchPage {
			pos, ksize, child := uint64(ne.Uint32(e[0:])), uint64(ne.Uint32(e[4:])), ne.Uint64(e[8:])
			if off+pos+ksize > p.n {
				return damaged("%s: the key of element %d (%d bytes at %d) ends beyond the page's %d bytes", p, i, ksize, off+pos, p.n)
			}
			if err := c.reach(child, from{what: "element", elem: i, p: p}); err != nil {
				return err
			}
			continue
		}
		eflags, pos, ksize, vsize := ne.Uint32(e[0:]), uint64(ne.Uint32(e[4:])), uint64(ne.Uint32(e[8:])), uint64(ne.Uint32(e[12:]))
		start := off + pos + ksize
		if start+vsize > p.n {
			return damaged("%s: the key and value of element %d (%d+%d bytes at %d) end beyond the page's %d bytes", p, i, ksize, vsize, off+pos, p.n)
		}
		if eflags&bucketLeaf == 0 {
			continue
		}
		// A bucket: its header, then its inline page if its root is 0.
		// bbolt inlines buckets of up to a quarter page only.
		if vsize < bucketHdrSize || vsize > bucketHdrSize+c.pageSize {
			return damaged("%s: the bucket of element %d has a value of %d bytes", p, i, vsize)
		}
		v, err := p.at(start, vsize)
		if err != nil {
			return err
		}
		if root := ne.Uint64(v); root != 0 {
			if err := c.reach(root, from{what: "the bucket of element", elem: i, p: p}); err != nil {
				return err
			}
			continue
		}
		c.inline = append(c.inline, v[bucketHdrSize:])
	}
	return nil
}

// page is a branch or leaf page being checked: n bytes, of which head
// (the first page, or all of an inline page) is in memory.
type page struct {
	c      *checker
	id     uint64
	inline bool // an inline bucket's page in the page id
	n      uint64
	head   []byte
}

func (p *page) String() string {
	if p.inline {
		return fmt.Sprintf("an inline bucket in page %d", p.id)
	}
	return fmt.Sprintf("page %d", p.id)
}

// at returns the n bytes at off in the page, which the caller checked
// are inside it, reading them from the file if they are beyond head.
func (p *page) at(off, n uint64) ([]byte, error) {
	if off+n <= uint64(len(p.head)) {
		return p.head[off : off+n], nil
	}
	b := make([]byte, n)
	if _, err := p.c.f.ReadAt(b, int64(p.id*p.c.pageSize+off)); err != nil {
		return nil, fmt.Errorf("read page %d: %w", p.id, err)
	}
	return b, nil
}
