package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LeakWait is how long CheckLeaks waits for what a test started to end:
// goroutines and connections wind down after Close returns (a peer's
// close to read, a read loop to see it), slower on a loaded machine.
const LeakWait = 30 * time.Second

// CheckLeaks records the goroutines and open file descriptors of the
// test process and registers a cleanup that, once the test's other
// cleanups have run (it is registered first, so it runs last), waits up
// to LeakWait for every goroutine and descriptor opened since to be gone.
// It fails the test naming what is left: the goroutines' stacks and the
// descriptors' targets.
//
// The comparison is exact, by goroutine id and by descriptor number and
// target: something new cannot hide behind something old that ended.
// The one allowance is the runtime's network poller, whose descriptors
// (an epoll instance and its wake-up eventfd) are opened once per
// process on first use and never closed: CheckLeaks makes the runtime
// open them before it takes the baseline.
//
// Call it first in a test that does not run in parallel with others
// (t.Parallel), which would start goroutines of their own meanwhile.
func CheckLeaks(t T) {
	t.Helper()
	checkLeaks(t, LeakWait)
}

func checkLeaks(t T, wait time.Duration) {
	t.Helper()
	startNetpoll(t)
	base := takeLeakSnapshot(t)
	t.Cleanup(func() {
		t.Helper()
		var left leakSnapshot
		for deadline := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
			left = takeLeakSnapshot(t).since(base)
			if left.empty() || time.Now().After(deadline) {
				break
			}
		}
		if !left.empty() {
			t.Fatalf("%v after the test ended:\n%s", wait, left)
		}
	})
}

// startNetpoll makes the runtime open its network poller's descriptors,
// which live as long as the process.
func startNetpoll(t T) {
	t.Helper()
	r, w, err := os.Pipe() // pipes are polled: this initializes the poller
	if err != nil {
		t.Fatalf("leak check: %v", err)
	}
	r.Close()
	w.Close()
}

// leakSnapshot is the goroutines (id → stack) and open descriptors
// (number → target) of the process.
type leakSnapshot struct {
	goroutines map[int]string
	fds        map[int]string
}

func takeLeakSnapshot(t T) leakSnapshot {
	t.Helper()
	s := leakSnapshot{goroutines: goroutines(), fds: map[int]string{}}
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatalf("leak check: %v", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		t.Fatalf("leak check: %v", err)
	}
	self := int(d.Fd())
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd == self {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc/self/fd", name))
		if err != nil {
			continue // closed meanwhile
		}
		s.fds[fd] = target
	}
	return s
}

// goroutines returns the stack of every goroutine but the caller's, by
// id.
func goroutines() map[int]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[int]string{}
	for i, g := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 {
			continue // the caller's own, listed first
		}
		// "goroutine 42 [chan receive]:"
		f := strings.Fields(string(g))
		if len(f) < 2 || f[0] != "goroutine" {
			continue
		}
		if id, err := strconv.Atoi(f[1]); err == nil {
			out[id] = string(g)
		}
	}
	return out
}

// since is what s has that base had not.
func (s leakSnapshot) since(base leakSnapshot) leakSnapshot {
	out := leakSnapshot{goroutines: map[int]string{}, fds: map[int]string{}}
	for id, stack := range s.goroutines {
		if _, ok := base.goroutines[id]; !ok {
			out.goroutines[id] = stack
		}
	}
	for fd, target := range s.fds {
		if base.fds[fd] != target {
			out.fds[fd] = target
		}
	}
	return out
}

func (s leakSnapshot) empty() bool { return len(s.goroutines) == 0 && len(s.fds) == 0 }

func (s leakSnapshot) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d goroutines and %d file descriptors left", len(s.goroutines), len(s.fds))
	fds := make([]int, 0, len(s.fds))
	for fd := range s.fds {
		fds = append(fds, fd)
	}
	slices.Sort(fds)
	for _, fd := range fds {
		fmt.Fprintf(&b, "\nfd %d: %s", fd, s.fds[fd])
	}
	ids := make([]int, 0, len(s.goroutines))
	for id := range s.goroutines {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	const most = 20
	for i, id := range ids {
		if i == most {
			fmt.Fprintf(&b, "\n\n(%d more)", len(ids)-most)
			break
		}
		fmt.Fprintf(&b, "\n\n%s", s.goroutines[id])
	}
	return b.String()
}
