package podcache

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestIdentitiesApart: an entry is served only to its identity and its
// exact key, and survives a reopen.
func TestIdentitiesApart(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	c, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := Entry{Key: "GET /api/v1/namespaces/a/configmaps", ContentType: "application/json", Body: []byte(`{"items":[]}`), Stored: time.Now()}
	if err := c.Put("alice", e); err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct{ id, key string }{{"bob", e.Key}, {"alice", e.Key + "?limit=1"}, {"", e.Key}} {
		if got, err := c.Get(q.id, q.key); err != nil || got != nil {
			t.Errorf("Get(%q, %q) = %v, %v: want nothing", q.id, q.key, got, err)
		}
	}
	c.Close()
	if c, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.Get("alice", e.Key)
	if err != nil || got == nil || !bytes.Equal(got.Body, e.Body) || got.ContentType != e.ContentType {
		t.Fatalf("after reopen: %v, %v", got, err)
	}
}

// TestBounds: past the per-identity bound the identity's oldest entries
// go; past the total bound the oldest of any identity; an entry larger
// than a bound is refused.
func TestBounds(t *testing.T) {
	c, err := Open(filepath.Join(t.TempDir(), FileName), Options{MaxBytesPerIdentity: 4000, MaxBytes: 10000})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := []byte(strings.Repeat("x", 700)) // about 1 KB encoded
	start := time.Now()
	put := func(id string, i int) {
		t.Helper()
		if err := c.Put(id, Entry{Key: fmt.Sprint(i), Body: body, Stored: start.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 8 {
		put("a", i)
	}
	if got, _ := c.Get("a", "0"); got != nil {
		t.Error("the oldest entry of a stays past the identity's bound")
	}
	if got, _ := c.Get("a", "7"); got == nil {
		t.Error("the newest entry of a went")
	}
	if s := c.Size()["a"]; s[1] > 4000 {
		t.Errorf("a holds %d bytes, bound 4000", s[1])
	}
	for i := 10; i < 18; i++ {
		put("b", i)
		put("c", i+10)
	}
	var total int64
	for _, s := range c.Size() {
		total += s[1]
	}
	if total > 10000 {
		t.Errorf("the cache holds %d bytes, bound 10000", total)
	}
	if got, _ := c.Get("a", "4"); got != nil {
		t.Error("a's oldest entry stays past the total bound")
	}
	if got, _ := c.Get("c", "27"); got == nil {
		t.Error("the newest entry went")
	}
	if err := c.Put("a", Entry{Key: "big", Body: bytes.Repeat([]byte("y"), 5000)}); err != ErrTooLarge {
		t.Errorf("an entry past the bound: %v, want ErrTooLarge", err)
	}
}
