package cli

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// cgroupFS writes files (path → content) under a new directory standing
// for /sys/fs/cgroup, and /proc/self/cgroup's text beside it.
func cgroupFS(t *testing.T, self string, files map[string]string) (procCgroup, root string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "sys")
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	procCgroup = filepath.Join(dir, "cgroup")
	if err := os.WriteFile(procCgroup, []byte(self), 0o644); err != nil {
		t.Fatal(err)
	}
	return procCgroup, root
}

func TestCgroupMemoryMax(t *testing.T) {
	for _, tc := range []struct {
		name  string
		self  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{"v2 container", "0::/\n", map[string]string{"memory.max": "536870912\n"}, 512 << 20, true},
		{"v2 unlimited", "0::/\n", map[string]string{"memory.max": "max\n"}, 0, false},
		{"v2 unit", "0::/system.slice/tether-gateway.service\n", map[string]string{
			"system.slice/tether-gateway.service/memory.max": "1073741824\n",
			"system.slice/memory.max":                        "max\n",
		}, 1 << 30, true},
		{"v2 parent binds", "0::/kubepods/pod1/c1\n", map[string]string{
			"kubepods/pod1/c1/memory.max": "max\n",
			"kubepods/pod1/memory.max":    "268435456\n",
			"kubepods/memory.max":         "1073741824\n",
		}, 256 << 20, true},
		{"v2 not mounted here", "0::/elsewhere\n", nil, 0, false},
		{"v1", "4:memory:/docker/abc\n0::/\n", map[string]string{"memory/docker/abc/memory.limit_in_bytes": "104857600\n"}, 100 << 20, true},
		{"v1 unlimited", "4:cpu,memory:/x\n", map[string]string{"memory/x/memory.limit_in_bytes": "9223372036854771712\n"}, 0, false},
		{"none", "1:cpu:/\n", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc, root := cgroupFS(t, tc.self, tc.files)
			got, ok, err := cgroupMemoryMax(proc, root)
			if err != nil || got != tc.want || ok != tc.ok {
				t.Errorf("cgroupMemoryMax = %d, %v, %v; want %d, %v", got, ok, err, tc.want, tc.ok)
			}
		})
	}
	proc, root := cgroupFS(t, "0::/\n", map[string]string{"memory.max": "lots\n"})
	if _, _, err := cgroupMemoryMax(proc, root); err == nil {
		t.Error("no error for a memory.max that is not a number")
	}
}

func TestAutoMemoryLimit(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	proc, root := cgroupFS(t, "0::/\n", map[string]string{"memory.max": "536870912\n"})
	if got, want := autoMemoryLimit(proc, root, log), int64(483183820); got != want { // 90 % of 512Mi
		t.Errorf("auto under a 512Mi cgroup: %d, want %d", got, want)
	}
	proc, root = cgroupFS(t, "0::/\n", map[string]string{"memory.max": "max\n"})
	if got := autoMemoryLimit(proc, root, log); got != 0 {
		t.Errorf("auto without a cgroup limit: %d, want none", got)
	}
	if got := autoMemoryLimit(filepath.Join(t.TempDir(), "missing"), root, log); got != 0 {
		t.Errorf("auto with an unreadable cgroup: %d, want none", got)
	}
	if n, err := ParseMemoryLimit(AutoMemoryLimit); n != 0 || err != nil {
		t.Errorf("ParseMemoryLimit(auto) = %d, %v", n, err)
	}
}
