package cache

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
)

func ledgerOf(t testing.TB, s *Store) Ledger {
	t.Helper()
	l, err := s.Ledger()
	must(t, err)
	return l
}

func wantLedger(t testing.TB, what string, got, want Ledger) {
	t.Helper()
	if got != want {
		t.Errorf("%s: ledger\n  %v\nwant\n  %v", what, got, want)
	}
	if !got.Balanced() {
		t.Errorf("%s: ledger does not balance: %v", what, got)
	}
}

func patchOf(name string) *QueuedWrite {
	return &QueuedWrite{Method: "PATCH", Path: "/api/v1/namespaces/ns/pods/" + name + "/status", Version: "v1", Resource: "pods",
		Namespace: "ns", Name: name, Body: []byte(`{"status":{}}`)}
}

// Every event is counted with the change it counts, and the counts
// balance: enqueued = coalesced + applied + obsolete + rejected + queued.
// A write marked as being sent counts as resent when it is sent again; a
// replacement takes over its mark; a dequeue removes it. The ledger
// survives a reopen.
func TestLedgerCounts(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	wantLedger(t, "new file", ledgerOf(t, s), Ledger{})
	var w [5]*QueuedWrite
	for i := range w {
		w[i] = patchOf(fmt.Sprint("p", i))
		must(t, s.Enqueue(w[i]))
	}
	wantLedger(t, "5 enqueued", ledgerOf(t, s), Ledger{Enqueued: 5, Queued: 5})

	// p0 is sent, and the send may have reached the cloud; then sent
	// again: resent.
	if resent, err := s.MarkSending(w[0].Seq); err != nil || resent {
		t.Fatalf("first mark: resent %v, %v", resent, err)
	}
	wantLedger(t, "p0 marked", ledgerOf(t, s), Ledger{Enqueued: 5, Queued: 5, Unconfirmed: 1})
	if resent, err := s.MarkSending(w[0].Seq); err != nil || !resent {
		t.Fatalf("second mark: resent %v, %v; want resent", resent, err)
	}
	must(t, s.Dequeue(w[0].Seq, OutcomeApplied))
	wantLedger(t, "p0 applied", ledgerOf(t, s), Ledger{Enqueued: 5, Applied: 1, Resent: 1, Queued: 4})

	// p1 marked, then coalesced: the write in its place carries the mark.
	_, err := s.MarkSending(w[1].Seq)
	must(t, err)
	nw := patchOf("p1")
	if replaced, err := s.ReplaceQueued(w[1].Seq, nw); err != nil || !replaced {
		t.Fatalf("replace: %v, %v", replaced, err)
	}
	wantLedger(t, "p1 coalesced", ledgerOf(t, s), Ledger{Enqueued: 6, Coalesced: 1, Applied: 1, Resent: 1, Queued: 4, Unconfirmed: 1})
	if resent, err := s.MarkSending(nw.Seq); err != nil || !resent {
		t.Errorf("the write in place of a marked one: resent %v, %v; want resent", resent, err)
	}
	// A 429: the mark goes, the next send is a first one.
	must(t, s.Unmark(nw.Seq))
	if resent, err := s.MarkSending(nw.Seq); err != nil || resent {
		t.Errorf("after Unmark: resent %v, %v", resent, err)
	}
	must(t, s.Dequeue(nw.Seq, OutcomeApplied))
	must(t, s.Dequeue(w[2].Seq, OutcomeRejected))
	must(t, s.Dequeue(w[3].Seq, OutcomeObsolete))
	must(t, s.Dequeue(w[3].Seq, OutcomeObsolete)) // no longer queued: not counted twice
	want := Ledger{Enqueued: 6, Coalesced: 1, Applied: 2, Obsolete: 1, Rejected: 1, Resent: 2, Queued: 1}
	wantLedger(t, "dequeued", ledgerOf(t, s), want)
	if _, err := s.MarkSending(w[3].Seq); err == nil {
		t.Error("a write no longer queued was marked")
	}
	if err := s.Dequeue(w[4].Seq, 0); err == nil {
		t.Error("a dequeue without an outcome passed")
	}

	reg := prometheus.NewRegistry()
	must(t, s.Register(reg))
	for event, v := range map[string]uint64{"enqueued": 6, "coalesced": 1, "applied": 2, "obsolete": 1, "rejected": 1, "resent": 2} {
		if got := gatheredValue(t, reg, "tether_edge_apiserver_queue_ledger_total", "event", event); got != float64(v) {
			t.Errorf("ledger metric %s = %v, want %d", event, got, v)
		}
	}

	must(t, s.Close())
	s = openT(t, path)
	wantLedger(t, "reopened", ledgerOf(t, s), want)
}

func gatheredValue(t testing.TB, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

const ledgerKillEnv = "TETHER_CACHE_LEDGER_KILL"

// TestLedgerKillChild queues three writes in the file named by
// $TETHER_CACHE_LEDGER_KILL, marks the second as being sent (the replay
// is about to send it, or has: the cloud may have applied it), says so,
// and waits to be killed; it does nothing unless started by
// TestLedgerKilledBetweenSendAndDequeue.
func TestLedgerKillChild(t *testing.T) {
	path := os.Getenv(ledgerKillEnv)
	if path == "" {
		t.Skip("run by TestLedgerKilledBetweenSendAndDequeue")
	}
	s, err := Open(path, nil)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	for i := range 3 {
		if err := s.Enqueue(patchOf(fmt.Sprint("p", i))); err != nil {
			fmt.Println("enqueue:", err)
			os.Exit(3)
		}
	}
	if _, err := s.MarkSending(2); err != nil {
		fmt.Println("mark:", err)
		os.Exit(3)
	}
	fmt.Println("marked")
	time.Sleep(time.Hour) // killed long before
	os.Exit(3)
}

// A process killed (SIGKILL) after marking a write as being sent and
// before dequeuing it: the next process finds the mark, its send of the
// write counts as resent, and the ledger balances.
func TestLedgerKilledBetweenSendAndDequeue(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	path := filepath.Join(t.TempDir(), FileName)
	cmd := exec.Command(os.Args[0], "-test.run=^TestLedgerKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), ledgerKillEnv+"="+path)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "marked" {
		t.Fatalf("child: %q", lines.Text())
	}
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()

	s, _, logs := openBounded(t, path, Options{})
	wantLedger(t, "after the kill", ledgerOf(t, s), Ledger{Enqueued: 3, Queued: 3, Unconfirmed: 1})
	if !strings.Contains(logs.String(), "their next send counts as resent") {
		t.Errorf("the open does not say that a write was being sent:\n%s", logs)
	}
	if resent, err := s.MarkSending(1); err != nil || resent {
		t.Errorf("p0's first send: resent %v, %v", resent, err)
	}
	if resent, err := s.MarkSending(2); err != nil || !resent {
		t.Errorf("p1's send after the kill: resent %v, %v; want resent", resent, err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		must(t, s.Dequeue(seq, OutcomeApplied))
	}
	wantLedger(t, "replayed", ledgerOf(t, s), Ledger{Enqueued: 3, Applied: 3, Resent: 1})
}

// A file of an older build (no ledger) gets one at open, its queued
// writes counted as enqueued; marks of writes no longer queued go.
func TestLedgerOfOlderFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	for i := range 2 {
		must(t, s.Enqueue(patchOf(fmt.Sprint("p", i))))
	}
	must(t, s.Close())
	db, err := bolt.Open(path, 0o600, nil)
	must(t, err)
	must(t, db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketLedger) }))
	must(t, db.Close())
	s = openT(t, path)
	wantLedger(t, "older file", ledgerOf(t, s), Ledger{Enqueued: 2, Queued: 2})
	must(t, s.Close())

	// A stale mark (a seq not queued) is removed at open.
	db, err = bolt.Open(path, 0o600, nil)
	must(t, err)
	must(t, db.Update(func(tx *bolt.Tx) error { return sendingBucket(tx).Put(seqKey(99), make([]byte, 8)) }))
	must(t, db.Close())
	s = openT(t, path)
	wantLedger(t, "stale mark", ledgerOf(t, s), Ledger{Enqueued: 2, Queued: 2})
}

// A schema version change carries the ledger with the queue (the marks
// of carried writes too); a file of another version without a ledger
// counts its carried writes as enqueued.
func TestLedgerCarriedAcrossSchemaChange(t *testing.T) {
	w := QueuedWrite{Method: "PATCH", Path: "/api/v1/nodes/n/status", Version: "v1", Resource: "nodes", Name: "n"}
	for _, withLedger := range []bool{true, false} {
		t.Run(fmt.Sprint("ledger ", withLedger), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			oldFile(t, path, "0", map[uint64][]byte{5: queuedJSON(t, w), 9: queuedJSON(t, w)})
			want := Ledger{Enqueued: 2, Queued: 2}
			if withLedger {
				db, err := bolt.Open(path, 0o600, nil)
				must(t, err)
				must(t, db.Update(func(tx *bolt.Tx) error {
					lb, err := tx.CreateBucket(bucketLedger)
					if err != nil {
						return err
					}
					for k, v := range map[string]uint64{"enqueued": 12, "applied": 6, "coalesced": 3, "rejected": 1, "resent": 4} {
						if err := lb.Put([]byte(k), binary.BigEndian.AppendUint64(nil, v)); err != nil {
							return err
						}
					}
					sb, err := lb.CreateBucket(bucketSending)
					if err != nil {
						return err
					}
					sb.Put(seqKey(9), make([]byte, 8))
					return sb.Put(seqKey(7), make([]byte, 8)) // not queued: not carried
				}))
				must(t, db.Close())
				want = Ledger{Enqueued: 12, Applied: 6, Coalesced: 3, Rejected: 1, Resent: 4, Queued: 2, Unconfirmed: 1}
			}
			s := openT(t, path)
			if s.MovedAside == "" {
				t.Fatal("the old file was not moved aside")
			}
			wantLedger(t, "carried", ledgerOf(t, s), want)
			if withLedger {
				if resent, err := s.MarkSending(9); err != nil || !resent {
					t.Errorf("a carried mark: resent %v, %v", resent, err)
				}
			}
		})
	}
}
