package cache

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const crashEnv = "TETHER_CACHE_CRASH_WRITER"

// TestCrashWriterChild is the writer that TestKillDuringWrites kills; it
// does nothing unless started by it.
func TestCrashWriterChild(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("run by TestKillDuringWrites")
	}
	s, err := Open(path, nil)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	out := bufio.NewWriter(os.Stdout)
	for round := 1; ; round++ {
		base := uint64(round * 1000)
		l := List{Kind: "Pod", APIVersion: "v1", RV: base + 999, Complete: true}
		for i := range 300 {
			l.Items = append(l.Items, pod(t, "ns", fmt.Sprint("p", i), base+uint64(i), "n", map[string]string{"round": strconv.Itoa(round)}))
		}
		s.ApplyList("kubelet", pods, l)
		for i := range 20 {
			s.Put("kube-proxy", pods, pod(t, "ns", fmt.Sprint("q", i), base+uint64(i), "n", nil))
		}
		if err := s.Enqueue(&QueuedWrite{Method: "PATCH", Name: "round", Body: []byte(strconv.Itoa(round))}); err != nil {
			fmt.Println("enqueue:", err)
			os.Exit(3)
		}
		// Enqueue returned: this round's writes are on disk.
		fmt.Fprintf(out, "committed %d\n", round)
		out.Flush()
	}
}

// TestKillDuringWrites SIGKILLs a process in the middle of heavy writes,
// several times on the same file, and checks each time that the store
// opens without being moved aside, serves, and lost nothing it had
// committed.
func TestKillDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	path := filepath.Join(t.TempDir(), FileName)
	for kill := range 5 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashWriterChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnv+"="+path)
		stdout, err := cmd.StdoutPipe()
		must(t, err)
		cmd.Stderr = os.Stderr
		must(t, cmd.Start())
		lines := bufio.NewScanner(stdout)
		committed := 0
		for committed < 3 && lines.Scan() {
			line := lines.Text()
			n, err := strconv.Atoi(strings.TrimPrefix(line, "committed "))
			if err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("child: %s", line)
			}
			committed = n
		}
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		must(t, cmd.Process.Signal(syscall.SIGKILL))
		// What it printed after our read counts too.
		for lines.Scan() {
			if n, err := strconv.Atoi(strings.TrimPrefix(lines.Text(), "committed ")); err == nil {
				committed = n
			}
		}
		cmd.Wait()

		s, err := Open(path, nil)
		if err != nil {
			t.Fatalf("kill %d: open after kill -9: %v", kill, err)
		}
		if s.MovedAside != "" {
			t.Fatalf("kill %d: file moved aside after kill -9", kill)
		}
		q := queued(t, s)
		rounds := 0
		for i, w := range q {
			if i > 0 && w.Seq <= q[i-1].Seq {
				t.Errorf("kill %d: queue out of order: %d after %d", kill, w.Seq, q[i-1].Seq)
			}
			if string(w.Body) == strconv.Itoa(committed) {
				rounds++
			}
		}
		if rounds == 0 {
			t.Errorf("kill %d: round %d was committed but is not in the queue", kill, committed)
		}
		items, info, found, err := s.List("kubelet", pods, Scope{})
		if err != nil || !found || len(items) != 300 {
			t.Errorf("kill %d: list after kill -9: %d items, found %v, %v", kill, len(items), found, err)
		}
		if info.MaxRV < uint64(committed*1000+999) {
			t.Errorf("kill %d: MaxRV %d older than committed round %d", kill, info.MaxRV, committed)
		}
		for _, o := range items {
			if o.RV < uint64(committed*1000) {
				t.Errorf("kill %d: %s at %d older than committed round %d", kill, o.Name, o.RV, committed)
				break
			}
		}
		t.Logf("kill %d: after round %d committed; queue %d, cache %v", kill, committed, len(q), s.Stats())
		must(t, s.Close())
	}
}
