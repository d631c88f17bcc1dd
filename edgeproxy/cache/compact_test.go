package cache

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"
	testingclock "k8s.io/utils/clock/testing"
)

// dump is every bucket (with its sequence), key and value of the file.
func dump(t testing.TB, s *Store) string {
	t.Helper()
	var b strings.Builder
	var walk func(bk *bolt.Bucket, path string) error
	walk = func(bk *bolt.Bucket, path string) error {
		fmt.Fprintf(&b, "%s seq=%d\n", path, bk.Sequence())
		return bk.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(bk.Bucket(k), path+"/"+string(k))
			}
			fmt.Fprintf(&b, "%s/%q=%q\n", path, k, v)
			return nil
		})
	}
	must(t, s.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, bk *bolt.Bucket) error { return walk(bk, string(name)) })
	}))
	return b.String()
}

// churnedLedger is the queue's ledger after churned.
var churnedLedger = Ledger{Enqueued: 30, Applied: 10, Queued: 20, Unconfirmed: 1}

// churned fills a store with objects, tombstones, an evicted resource
// and queued writes, then removes most objects, leaving the file mostly
// free pages.
func churned(t testing.TB, s *Store) {
	t.Helper()
	must(t, s.ApplyList("kubelet", pods, bigList(t, "ns", "p", 3000, 3000, 1)))
	must(t, s.ApplyList("kube-proxy", epslices, bigList(t, "a", "s", 50, 500, 1)))
	for i := range 10 {
		must(t, s.Delete("kube-proxy", epslices, pod(t, "a", fmt.Sprint("s", i), 5000, "n", nil), true))
	}
	for i := range 30 {
		must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: fmt.Sprint("w", i), Body: fmt.Appendf(nil, `{"n":%d}`, i)}))
	}
	for i := range 10 { // a gap in the sequence: the next seq must still be after it
		must(t, s.Dequeue(uint64(i+1), OutcomeApplied))
	}
	_, err := s.MarkSending(15) // being sent: its mark is part of the ledger
	must(t, err)
	must(t, s.ApplyList("coredns", epslices, bigList(t, "a", "s", 50, 500, 1)))
	must(t, s.write(func(tx *bolt.Tx) error {
		s.dirty = true
		return evictResource(tx, candidate{component: "coredns", key: resourceKey(epslices)}, s.clock.Now())
	}))
	l := bigList(t, "ns", "p", 100, 3000, 1)
	l.RV = 9000
	must(t, s.ApplyList("kubelet", pods, l)) // the other 2900 go
	settle(t, s)
}

// Compaction gives the free pages back and keeps every bucket, sequence,
// key and value; writes go on after it, the queue's sequence too.
func TestCompactKeepsEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, _, logs := openBounded(t, path, Options{noCompact: true})
	churned(t, s)
	before := dump(t, s)
	fileBefore, used := s.Usage()
	must(t, s.Compact())
	settle(t, s)
	fileAfter, _ := s.Usage()
	if fileAfter >= fileBefore/2 {
		t.Errorf("compaction of a file of %d bytes (%d used) left %d", fileBefore, used, fileAfter)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != fileAfter {
		t.Errorf("the file at the path: %v, %v; want the compacted one, %d bytes", fi, err, fileAfter)
	}
	if after := dump(t, s); after != before {
		t.Errorf("compaction changed the content:\n%s", lineDiff(before, after))
	}
	wantLedger(t, "compacted", ledgerOf(t, s), churnedLedger)
	if _, err := os.Stat(path + compactSuffix); !os.IsNotExist(err) {
		t.Errorf("the copy is left behind: %v", err)
	}
	if counter(t, s.upkeep.compactions.WithLabelValues("ok")) != 1 || !strings.Contains(logs.String(), "cache compacted") {
		t.Errorf("compaction not counted or logged:\n%s", logs)
	}

	w := &QueuedWrite{Method: "PATCH", Name: "after"}
	must(t, s.Enqueue(w))
	if w.Seq != 31 {
		t.Errorf("first seq after compaction %d, want 31", w.Seq)
	}
	must(t, s.Put("kubelet", pods, pod(t, "ns", "new", 9001, "n", nil)))
	settle(t, s)
	want := dump(t, s)
	must(t, s.Close())
	s2, _, _ := openBounded(t, path, Options{})
	if got := dump(t, s2); got != want {
		t.Errorf("reopened compacted file differs:\n%s", lineDiff(want, got))
	}
	if s2.MovedAside != "" {
		t.Errorf("compacted file moved aside: %s", s2.MovedAside)
	}
}

// The writer compacts by itself when half the file or more is free.
func TestCompactWhenWorthIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, clk, _ := openBounded(t, path, Options{})
	churned(t, s) // compacts once the list that removed most is committed
	file, used := s.Usage()
	if n := counter(t, s.upkeep.compactions.WithLabelValues("ok")); n != 1 {
		t.Fatalf("%v compactions, want 1 (file %d bytes, %d used)", n, file, used)
	}
	// Not again for nothing, nor within compactEvery.
	clk.Step(compactEvery)
	must(t, s.Put("kubelet", pods, pod(t, "ns", "new", 9001, "n", nil)))
	settle(t, s)
	if n := counter(t, s.upkeep.compactions.WithLabelValues("ok")); n != 1 {
		t.Errorf("%v compactions of a compact file, want 1", n)
	}
}

const compactKillEnv = "TETHER_CACHE_COMPACT_KILL"

// TestCompactKillChild opens the file in $TETHER_CACHE_COMPACT_KILL
// (step:path), which is worth compacting, and kills itself (SIGKILL) at
// that step of the compaction Open starts; it does nothing unless started
// by TestCompactKilled.
func TestCompactKillChild(t *testing.T) {
	env := os.Getenv(compactKillEnv)
	if env == "" {
		t.Skip("run by TestCompactKilled")
	}
	at, path, _ := strings.Cut(env, ":")
	compactStep = func(step string) {
		if step == at {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	OpenWith(path, Options{Clock: testingclock.NewFakeClock(testEpoch)}) // the tombstones' time: none expire
	fmt.Println("compaction did not reach", at)
	os.Exit(3)
}

// A kill -9 at any step of a compaction leaves a file that opens as it
// was (not moved aside), holding every record, and the copy is removed.
func TestCompactKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	template := filepath.Join(t.TempDir(), FileName)
	s, _, _ := openBounded(t, template, Options{noCompact: true})
	churned(t, s)
	want := dump(t, s)
	must(t, s.Close())
	for _, at := range []string{"created", "copied", "synced", "renamed"} {
		t.Run(at, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			copyFile(t, template, path)
			cmd := exec.Command(os.Args[0], "-test.run=^TestCompactKillChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), compactKillEnv+"="+at+":"+path)
			out, err := cmd.CombinedOutput()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the child was not killed at %s: %v\n%s", at, err, out)
			}
			_, leftover := os.Stat(path + compactSuffix)
			s, _, _ := openBounded(t, path, Options{})
			if s.MovedAside != "" {
				t.Fatalf("killed at %s: file moved aside", at)
			}
			if got := dump(t, s); got != want {
				t.Errorf("killed at %s: the file differs:\n%s", at, lineDiff(want, got))
			}
			if _, err := os.Stat(path + compactSuffix); !os.IsNotExist(err) {
				t.Errorf("killed at %s: the copy is still there after open (%v)", at, err)
			}
			if at != "renamed" && leftover != nil {
				t.Errorf("killed at %s: no copy was left (%v): the kill came later than meant", at, leftover)
			}
			if n := len(queued(t, s)); n != 20 {
				t.Errorf("killed at %s: %d queued writes, want 20", at, n)
			}
			wantLedger(t, "killed at "+at, ledgerOf(t, s), churnedLedger)
		})
	}
}

// A copy that is not a bbolt file at all (a compaction killed as it
// created it) is removed at open; the file is untouched.
func TestCompactGarbageLeftover(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 1, "n", nil)))
	must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: "w"}))
	want := dump(t, s)
	must(t, s.Close())
	must(t, os.WriteFile(path+compactSuffix, []byte("half a copy"), 0o600))
	s = openT(t, path)
	if got := dump(t, s); got != want || s.MovedAside != "" {
		t.Errorf("after a leftover copy: moved aside %q, content:\n%s", s.MovedAside, lineDiff(want, got))
	}
	if _, err := os.Stat(path + compactSuffix); !os.IsNotExist(err) {
		t.Errorf("leftover copy still there: %v", err)
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	must(t, err)
	defer in.Close()
	out, err := os.Create(to)
	must(t, err)
	_, err = io.Copy(out, in)
	must(t, err)
	must(t, out.Close())
}

// lineDiff shows the first lines where two dumps differ.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out bytes.Buffer
	for i := 0; i < max(len(al), len(bl)) && out.Len() < 2000; i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			fmt.Fprintf(&out, "line %d:\n- %.200s\n+ %.200s\n", i, x, y)
		}
	}
	return out.String()
}
