package cache

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// queued reads the whole queue (tests only: the proxy streams it).
func queued(t testing.TB, s *Store) []QueuedWrite {
	t.Helper()
	var out []QueuedWrite
	for w, err := range s.QueuedWrites(0) {
		must(t, err)
		out = append(out, w)
	}
	return out
}

func TestQueueBoundedByCount(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	s.SetQueueLimits(3, 0)
	for i := range 3 {
		must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: fmt.Sprint("w", i), Body: []byte("{}")}))
	}
	w := &QueuedWrite{Method: "PATCH", Name: "w3", Body: []byte("{}")}
	err := s.Enqueue(w)
	var full *QueueFullError
	if !errors.Is(err, ErrQueueFull) || !errors.As(err, &full) || full.Writes != 3 || full.MaxWrites != 3 || w.Seq != 0 {
		t.Fatalf("fourth write: %v (%+v), seq %d; want the queue full at 3 writes", err, full, w.Seq)
	}
	if n := len(queued(t, s)); n != 3 || s.QueueLen() != 3 {
		t.Fatalf("%d queued (QueueLen %d), want 3", n, s.QueueLen())
	}
	// A dequeued write makes room; the refused one never entered.
	must(t, s.Dequeue(queued(t, s)[0].Seq, OutcomeApplied))
	must(t, s.Enqueue(w))
	var got []string
	for _, q := range queued(t, s) {
		got = append(got, q.Name)
	}
	if strings.Join(got, ",") != "w1,w2,w3" {
		t.Errorf("queue: %v", got)
	}
}

func TestQueueBoundedByBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	body := []byte(strings.Repeat("x", 3000))
	must(t, s.Enqueue(&QueuedWrite{Method: "PUT", Name: "first", Body: body}))
	_, one := s.QueueUsage()
	if one < 3000 {
		t.Fatalf("a record of a 3000-byte body counted %d bytes", one)
	}
	s.SetQueueLimits(0, 2*one+one/2) // room for two such records, not three
	must(t, s.Enqueue(&QueuedWrite{Method: "PUT", Name: "second", Body: body}))
	err := s.Enqueue(&QueuedWrite{Method: "PUT", Name: "third", Body: body})
	var full *QueueFullError
	if !errors.As(err, &full) || full.Writes != 2 || full.Bytes > full.MaxBytes || full.Size < 3000 {
		t.Fatalf("third write: %v (%+v); want the queue full by bytes", err, full)
	}
	// A small write still fits; usage is counted again from the file on
	// reopen, and the bound checked against it.
	must(t, s.Enqueue(&QueuedWrite{Method: "PUT", Name: "small", Body: []byte("{}")}))
	writes, bytes := s.QueueUsage()
	must(t, s.Close())
	s = openT(t, path)
	if w, b := s.QueueUsage(); w != writes || b != bytes || w != 3 {
		t.Errorf("after reopen: %d writes, %d bytes; before: %d, %d", w, b, writes, bytes)
	}
	s.SetQueueLimits(0, 2*one+one/2)
	if err := s.Enqueue(&QueuedWrite{Method: "PUT", Name: "again", Body: body}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("after reopen, a write past the bound: %v", err)
	}
	for _, q := range queued(t, s) {
		must(t, s.Dequeue(q.Seq, OutcomeApplied))
	}
	if w, b := s.QueueUsage(); w != 0 || b != 0 {
		t.Errorf("empty queue counts %d writes, %d bytes", w, b)
	}
}

// Writers racing for the last places never take more than the bound:
// the check is made in the writer's transaction.
func TestQueueBoundConcurrent(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	const limit = 50
	s.SetQueueLimits(limit, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	for i := range 200 {
		wg.Go(func() {
			err := s.Enqueue(&QueuedWrite{Method: "PATCH", Name: fmt.Sprint("w", i), Body: []byte("{}")})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, ErrQueueFull):
				refused++
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ok != limit || refused != 200-limit || len(queued(t, s)) != limit {
		t.Errorf("%d queued, %d refused, %d in the file; want %d queued", ok, refused, len(queued(t, s)), limit)
	}
}

// QueuedWrites reads one write at a time: dequeuing and queueing while
// iterating is seen as it happens.
func TestQueuedWritesStreams(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	for i := range 4 {
		must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: fmt.Sprint("w", i), Body: []byte("{}")}))
	}
	var seen []string
	for w, err := range s.QueuedWrites(0) {
		must(t, err)
		seen = append(seen, w.Name)
		switch w.Name {
		case "w0":
			must(t, s.Dequeue(w.Seq, OutcomeApplied))
			must(t, s.Dequeue(w.Seq+2, OutcomeApplied)) // w2
		case "w3":
			must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: "w4"}))
		}
	}
	if strings.Join(seen, ",") != "w0,w1,w3,w4" {
		t.Errorf("seen %v", seen)
	}
	first := queued(t, s)[0].Seq
	for w, err := range s.QueuedWrites(first) {
		must(t, err)
		if w.Seq <= first {
			t.Errorf("write %d yielded after %d", w.Seq, first)
		}
	}
}
