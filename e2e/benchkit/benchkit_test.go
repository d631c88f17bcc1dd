package benchkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and a parenthesis; utime 150, stime 25.
	stat := "4242 (tether edge) x) S 1 4242 4242 0 -1 4194560 1029 0 0 0 150 25 0 0 20 0 9 0 123 1234567 890 18446744073709551615\n"
	if got, want := parseStatCPU([]byte(stat)), 1750*time.Millisecond; got != want {
		t.Errorf("parseStatCPU = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "4242 (short) S 1 2", "4242 (x) S 1 4242 4242 0 -1 4194560 1029 0 0 0 utime 25 0"} {
		if got := parseStatCPU([]byte(bad)); got != 0 {
			t.Errorf("parseStatCPU(%q) = %v, want 0", bad, got)
		}
	}
}

func TestParseStatus(t *testing.T) {
	status := "Name:\ttether-edge\nVmHWM:\t   30000 kB\nVmRSS:\t   20000 kB\nRssAnon:\t   15000 kB\nRssFile:\t    5000 kB\nThreads:\t9\n"
	want := Mem{RSS: 20000 << 10, HWM: 30000 << 10, Anon: 15000 << 10, File: 5000 << 10}
	if got := parseStatus(status); got != want {
		t.Errorf("parseStatus = %+v, want %+v", got, want)
	}
}

func TestSelf(t *testing.T) {
	// Burn some CPU so that at least a tick is counted.
	testenv.Eventually(t, "a CPU tick of this process counted", func() bool {
		for i := 0; i < 1e6; i++ {
			_ = fmt.Sprint(i)
		}
		return CPU(os.Getpid()) > 0
	})
	if CPU(-1) != 0 {
		t.Error("CPU of no process is not 0")
	}
	m, err := ReadMem(os.Getpid())
	if err != nil || m.RSS <= 0 || m.HWM < m.RSS || m.Anon+m.File > m.RSS+(1<<20) {
		t.Errorf("ReadMem = %+v, %v", m, err)
	}
	if _, err := ReadMem(-1); err == nil {
		t.Error("ReadMem of no process: no error")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := RealPID(context.Background(), os.Getpid(), exe); err != nil || pid != os.Getpid() {
		t.Errorf("RealPID(self) = %d, %v; want %d", pid, err, os.Getpid())
	}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := RealPID(short, os.Getpid(), "no-such-binary"); err == nil {
		t.Error("RealPID of a binary this process does not run: no error")
	}
}

func TestPct(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := Pct(d, c.p); got != c.want {
			t.Errorf("Pct(1..100 ms, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Pct(nil, 99); got != 0 {
		t.Errorf("Pct(nil) = %v", got)
	}
	if got := Pct(d[:1], 99); got != time.Millisecond {
		t.Errorf("Pct(one) = %v", got)
	}
}

func TestGetSaveURLAndGetJSON(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			fmt.Fprint(w, "ok")
		case "/empty":
		default:
			http.Error(w, "nope", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	var dials atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dialer.DialContext(ctx, network, addr)
	}
	c := NewConnClient(dial, roots, 10*time.Second)
	ctx := context.Background()
	for range 3 {
		if body, err := Get(ctx, c, srv.URL+"/healthz"); err != nil || string(body) != "ok" {
			t.Fatalf("Get /healthz = %q, %v", body, err)
		}
	}
	if n := dials.Load(); n != 3 {
		t.Errorf("3 GETs dialled %d connections, want 3 (one each)", n)
	}
	for _, p := range []string{"/empty", "/missing"} {
		if _, err := Get(ctx, c, srv.URL+p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("Get %s: error %v, want one naming the URL", p, err)
		}
	}

	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/profile" {
			http.Error(w, "no such profile", http.StatusNotFound)
			return
		}
		w.Write(bytes.Repeat([]byte("p"), 100000))
	}))
	defer plain.Close()
	path := filepath.Join(t.TempDir(), "x.pprof")
	if err := SaveURL(ctx, dialer.DialContext, plain.URL+"/profile", path, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || len(b) != 100000 {
		t.Errorf("saved %d bytes, %v; want 100000", len(b), err)
	}
	err := SaveURL(ctx, dialer.DialContext, plain.URL+"/other", path+"2", 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "no such profile") {
		t.Errorf("SaveURL of a 404: %v, want its body in the error", err)
	}
	if _, err := os.Stat(path + "2"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("SaveURL of a 404 left a file: %v", err)
	}

	status := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.Error(w, "  not here\n", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"ready":true,"edges":[{"node":"edge-1"},{"node":"edge-2"}]}`)
	}))
	defer status.Close()
	var st struct {
		Ready bool
		Edges []struct{ Node string }
	}
	if err := GetJSON(ctx, dialer.DialContext, status.URL+"/status", &st, 10*time.Second); err != nil || !st.Ready || len(st.Edges) != 2 || st.Edges[1].Node != "edge-2" {
		t.Errorf("GetJSON = %+v, %v", st, err)
	}
	err = GetJSON(ctx, dialer.DialContext, status.URL+"/other", &st, 10*time.Second)
	if want := "GET " + status.URL + "/other: 503 Service Unavailable: not here"; err == nil || err.Error() != want {
		t.Errorf("GetJSON of a 503: %v, want %q", err, want)
	}
}

var dialer net.Dialer

func TestParallel(t *testing.T) {
	ctx := context.Background()
	var seen [100]atomic.Int64
	if err := Parallel(ctx, 4, len(seen), func(k int) error { seen[k].Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	for k := range seen {
		if n := seen[k].Load(); n != 1 {
			t.Fatalf("item %d ran %d times", k, n)
		}
	}
	boom := errors.New("boom")
	var ran atomic.Int64
	err := Parallel(ctx, 2, 10000, func(k int) error {
		ran.Add(1)
		if k == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("Parallel = %v, want boom", err)
	}
	if n := ran.Load(); n == 10000 {
		t.Error("an error did not stop handing out work")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Parallel(cctx, 2, 10, func(int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Parallel with an ended context = %v", err)
	}
}

func TestProgressAndSleep(t *testing.T) {
	ctx := context.Background()
	calls := make(chan struct{}, 100)
	stop := Progress(ctx, time.Millisecond, func() { calls <- struct{}{} })
	select {
	case <-calls:
	case <-time.After(30 * time.Second):
		t.Fatal("Progress never called f")
	}
	stop()
	n := len(calls)
	if err := Sleep(ctx, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if len(calls) != n {
		t.Error("f called after stop returned")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Sleep(cctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep with an ended context = %v", err)
	}
}

func TestNoteAndTail(t *testing.T) {
	var b bytes.Buffer
	Note(&b, "somebench", false, "%d edges %s", 3, "up")
	if got := b.String(); got != "somebench: 3 edges up\n" {
		t.Errorf("Note = %q", got)
	}
	b.Reset()
	Note(&b, "somebench", true, "x")
	if !regexp.MustCompile(`^\d\d:\d\d:\d\d somebench: x\n$`).MatchString(b.String()) {
		t.Errorf("stamped Note = %q", b.String())
	}
	if got := Tail("abcdef", 10); got != "abcdef" {
		t.Errorf("Tail short = %q", got)
	}
	if got := Tail("abcdef", 2); got != "...ef" {
		t.Errorf("Tail = %q", got)
	}
}
