package testenv

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// leakT records what CheckLeaks' cleanup says.
type leakT struct {
	cleanups []func()
	failure  string
}

func (*leakT) Helper()                     {}
func (l *leakT) Cleanup(f func())          { l.cleanups = append(l.cleanups, f) }
func (*leakT) Logf(string, ...any)         {}
func (l *leakT) Fatalf(f string, a ...any) { l.failure = fmt.Sprintf(f, a...) }

func (l *leakT) end() {
	for i := len(l.cleanups) - 1; i >= 0; i-- {
		l.cleanups[i]()
	}
}

func TestCheckLeaks(t *testing.T) {
	t.Run("a goroutine and a socket left", func(t *testing.T) {
		lt := &leakT{}
		checkLeaks(lt, 200*time.Millisecond)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		accepting := make(chan struct{})
		go func() { close(accepting); ln.Accept() }()
		<-accepting
		lt.end()
		if !strings.Contains(lt.failure, "1 goroutines and 1 file descriptors left") ||
			!strings.Contains(lt.failure, "socket:[") || !strings.Contains(lt.failure, "Accept") {
			t.Errorf("leak check said %q; want the accepting goroutine and its socket", lt.failure)
		}
		ln.Close()
	})
	t.Run("ended while waited for", func(t *testing.T) {
		lt := &leakT{}
		checkLeaks(lt, LeakWait)
		f, err := os.Open("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		go func() { <-release; f.Close() }()
		time.AfterFunc(100*time.Millisecond, func() { close(release) })
		lt.end()
		if lt.failure != "" {
			t.Errorf("leak check failed on what ended: %s", lt.failure)
		}
	})
	t.Run("what was there before is not counted", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go ln.Accept()
		lt := &leakT{}
		checkLeaks(lt, time.Second)
		lt.end()
		if lt.failure != "" {
			t.Errorf("leak check counted the baseline: %s", lt.failure)
		}
	})
}
