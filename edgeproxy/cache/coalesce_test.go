package cache

import (
	"errors"
	"path/filepath"
	"testing"
)

// TestReplaceQueued: a write put in place of a queued one takes a new
// seq at the end, frees the old one's room, survives a reopen, and is
// simply queued when the old one is gone; the bounds still hold.
func TestReplaceQueued(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: "a", Body: []byte(`{"n":1}`), Base: []byte(`{}`)}))
	must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: "b", Body: []byte(`{}`)}))
	first := queued(t, s)[0]
	_, bytesBefore := s.QueueUsage()

	w := &QueuedWrite{Method: "PATCH", Name: "a", Body: []byte(`{"n":2}`), Base: []byte(`{}`)}
	replaced, err := s.ReplaceQueued(first.Seq, w)
	must(t, err)
	if !replaced {
		t.Fatal("the queued write was not replaced")
	}
	q := queued(t, s)
	if len(q) != 2 || q[0].Name != "b" || q[1].Name != "a" || string(q[1].Body) != `{"n":2}` || q[1].Seq != w.Seq || w.Seq <= first.Seq {
		t.Fatalf("queue after the replacement: %+v", q)
	}
	if n, b := s.QueueUsage(); n != 2 || b != bytesBefore {
		t.Errorf("usage %d writes, %d bytes; want 2 and %d (a body of the same size)", n, b, bytesBefore)
	}
	if got, err := s.QueuedWrite(w.Seq); err != nil || got == nil || string(got.Base) != `{}` {
		t.Errorf("QueuedWrite(%d) = %+v, %v", w.Seq, got, err)
	}
	if got, err := s.QueuedWrite(first.Seq); err != nil || got != nil {
		t.Errorf("the replaced write is still there: %+v, %v", got, err)
	}

	// The old write is gone (replayed meanwhile): the new one is queued.
	again := &QueuedWrite{Method: "PATCH", Name: "a", Body: []byte(`{"n":3}`)}
	if replaced, err := s.ReplaceQueued(first.Seq, again); err != nil || replaced {
		t.Fatalf("replacing a write no longer queued: %v, %v", replaced, err)
	}
	if n := s.QueueLen(); n != 3 {
		t.Fatalf("%d queued, want 3", n)
	}

	// At the count bound a replacement still fits (it frees its room),
	// a write that replaces nothing does not.
	s.SetQueueLimits(3, 0)
	must(t, func() error {
		_, err := s.ReplaceQueued(again.Seq, &QueuedWrite{Method: "PATCH", Name: "a", Body: []byte(`{"n":4}`)})
		return err
	}())
	if _, err := s.ReplaceQueued(12345, &QueuedWrite{Method: "PATCH", Name: "c", Body: []byte(`{}`)}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("a fourth write at a bound of 3: %v, want ErrQueueFull", err)
	}

	must(t, s.Close())
	s = openT(t, path)
	if q := queued(t, s); len(q) != 3 || s.QueueLen() != 3 || string(q[2].Body) != `{"n":4}` {
		t.Fatalf("after reopening: %+v (QueueLen %d)", q, s.QueueLen())
	}
}
