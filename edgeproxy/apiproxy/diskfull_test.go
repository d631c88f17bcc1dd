package apiproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/testenv"
)

// mountTmpfs mounts a tmpfs of size bytes on a new directory and
// unmounts it when the test ends, failed or not. Where mounting is not
// permitted the test is skipped, except in CI.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(size)+",mode=0700", "tmpfs", dir).CombinedOutput()
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("cannot mount a tmpfs (not root?): %v %s", err, out)
		}
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	// Registered after TempDir's cleanup, so it runs before it.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file until the file system is full and returns its name.
func fill(t *testing.T, dir string) string {
	t.Helper()
	name := filepath.Join(dir, "filler")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			return name
		}
	}
}

// TestDiskFull queues status writes offline on a 2 MiB file system: when
// it is full the write is refused with a 503 saying so, and once there is
// room again writes are queued again, without a restart.
func TestDiskFull(t *testing.T) {
	testenv.RequireRoot(t)
	dir := mountTmpfs(t, 2<<20)
	f := newFakeAPIServer(t)
	offline := &switchable{}
	kp, _ := testenv.MustCA(t, "unit").NodeCert("n")
	e := startEdge(t, edgeSpec{net: hostNet{}, server: f.URL, node: "n", cert: kp.TLS, offline: offline, dataDir: dir,
		rootCAs: f.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs})
	e.waitHealthy(true, 10*time.Second)
	offline.set(true)

	// A pod status of 300 KiB: its record needs pages the file does not
	// have yet.
	body, _ := json.Marshal(map[string]any{"kind": "Pod", "apiVersion": "v1",
		"metadata": map[string]any{"name": "p", "namespace": "ns", "resourceVersion": "5"},
		"status":   map[string]any{"message": strings.Repeat("x", 300<<10)}})
	put := func() (int, metav1.Status) {
		t.Helper()
		req, _ := http.NewRequest("PUT", "http://"+e.Addr+"/api/v1/namespaces/ns/pods/p/status", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("User-Agent", kubeletUA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var st metav1.Status
		json.Unmarshal(b, &st)
		return resp.StatusCode, st
	}
	if code, st := put(); code != http.StatusOK {
		t.Fatalf("first write: %d %s", code, st.Message)
	}

	filler := fill(t, dir)
	code, st := put()
	if code != http.StatusServiceUnavailable || !strings.Contains(st.Message, "cannot be kept on disk") ||
		!strings.Contains(st.Message, "no space left on device") {
		t.Fatalf("write on a full disk: %d %q", code, st.Message)
	}
	if n := e.Proxy.queue.Len(); n != 1 {
		t.Fatalf("%d writes queued after the refusal, want 1", n)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if code, st := put(); code != http.StatusOK {
		t.Fatalf("write once there is room again: %d %s", code, st.Message)
	}
	if n, _ := e.Store.QueueUsage(); n != 2 || e.Proxy.queue.Len() != 2 {
		t.Errorf("queue holds %d writes (proxy counts %d), want 2", n, e.Proxy.queue.Len())
	}
	// The file is whole: it opens again with both writes.
	e = e.restart()
	if n := e.Proxy.queue.Len(); n != 2 || e.Store.MovedAside != "" {
		t.Errorf("after restart: %d queued, moved aside %q", n, e.Store.MovedAside)
	}
}
