package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestWriteImages: the tarball holds both images over one layer with
// busybox and its applets, and the same busybox gives the same bytes.
func TestWriteImages(t *testing.T) {
	if _, err := os.Stat(busyboxPath); err != nil {
		t.Skipf("no %s (busybox-static): %v", busyboxPath, err)
	}
	dir := t.TempDir()
	path, err := WriteImages(dir)
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteImages(dir); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(first, again) {
		t.Error("two builds differ")
	}

	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(first))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name], _ = io.ReadAll(tr)
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	var tags []string
	for _, m := range manifest {
		tags = append(tags, m.RepoTags...)
		if files[m.Config] == nil || len(m.Layers) != 1 || files[m.Layers[0]] == nil {
			t.Errorf("entry %+v names files the archive lacks", m)
		}
	}
	if strings.Join(tags, " ") != BusyboxImage+" "+PauseImage {
		t.Errorf("tags %v", tags)
	}

	links := map[string]string{}
	lr := tar.NewReader(bytes.NewReader(files[manifest[0].Layers[0]]))
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		links[h.Name] = h.Linkname
	}
	for _, applet := range []string{"sh", "tar", "cat", "sleep", "httpd"} {
		if links["bin/"+applet] != "busybox" {
			t.Errorf("bin/%s links to %q, want busybox", applet, links["bin/"+applet])
		}
	}
	if _, ok := links["bin/busybox"]; !ok {
		t.Error("no bin/busybox")
	}
}

// TestStartContainerd: containerd answers in a host's namespace with the
// images imported, runs a container with runc, and its cleanup leaves no
// process in its mount namespace.
func TestStartContainerd(t *testing.T) {
	RequireRoot(t)
	var c *Containerd
	var left string // the cgroup of a container the cleanup ends
	t.Run("run", func(t *testing.T) {
		h := NewHost(t, "ctrd")
		c = StartContainerd(t, h, ContainerdOptions{Dir: t.TempDir()})
		ctx := context.Background()
		out, err := c.ctr(ctx, "--namespace", "k8s.io", "images", "list", "--quiet")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, ref := range []string{BusyboxImage, PauseImage} {
			if !strings.Contains(out, ref) {
				t.Errorf("images %q lack %s", out, ref)
			}
		}
		// A one-level cgroup path, which runc removes with the container
		// (ctr's default, /<namespace>/<id>, would leave /k8s.io behind).
		cgroup := "/tether-test-probe-" + strconv.Itoa(os.Getpid())
		out, err = c.ctr(ctx, "--namespace", "k8s.io", "run", "--rm", "--cgroup", cgroup, BusyboxImage, "probe", "sh", "-c", "echo ran in $(cat /proc/1/comm)")
		if err != nil || strings.TrimSpace(out) != "ran in sh" {
			t.Errorf("ctr run: %v: %q", err, out)
		}
		if dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + cgroup); len(dirs) > 0 {
			t.Errorf("cgroups left after the container: %v", dirs)
		}

		// A container left running for the cleanup to end: its rootfs is
		// mounted in containerd's mount namespace, not in the host's.
		left = "/tether-test-left-" + strconv.Itoa(os.Getpid())
		if out, err := c.ctr(ctx, "--namespace", "k8s.io", "run", "--detach", "--cgroup", left, BusyboxImage, "left", "sleep", "600"); err != nil {
			t.Fatalf("ctr run --detach: %v: %s", err, out)
		}
		inside, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", c.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(inside), c.Dir) {
			t.Errorf("no mount under %s in containerd's namespace:\n%s", c.Dir, inside)
		}
		host, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(host), c.Dir) {
			t.Errorf("containerd's mounts under %s seen by the host:\n%s", c.Dir, host)
		}
	})
	if c == nil || c.mntNS == "" {
		t.Fatal("containerd never started")
	}
	if pids := processesInMountNS(c.mntNS); len(pids) > 0 {
		t.Errorf("processes %v left in containerd's mount namespace", pids)
	}
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + left); len(dirs) > 0 {
		t.Errorf("cgroups of the container left running remain: %v", dirs)
	}
}

func TestParseCgroupMounts(t *testing.T) {
	hybrid := `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 30 0:40 / /run/netns/x rw - nsfs nsfs rw
`
	got, err := parseCgroupMounts(strings.NewReader(hybrid))
	if err != nil {
		t.Fatal(err)
	}
	want := []cgroupMount{
		{"/sys/fs/cgroup/cpu", "cgroup", "cpu"},
		{"/sys/fs/cgroup/cpu,cpuacct", "cgroup", "cpu,cpuacct"},
		{"/sys/fs/cgroup/systemd", "cgroup", "xattr,name=systemd"},
		{"/sys/fs/cgroup/unified", "cgroup2", ""},
	}
	if !slices.Equal(got, want) {
		t.Errorf("hybrid: got %+v, want %+v", got, want)
	}

	named := "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n"
	if got, _ := parseCgroupMounts(strings.NewReader(named)); len(got) != 1 || got[0].opts != "none,name=systemd" {
		t.Errorf("named hierarchy: got %+v, want none,name=systemd", got)
	}

	v2 := "31 23 0:28 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	if got, _ := parseCgroupMounts(strings.NewReader(v2)); !slices.Equal(got, []cgroupMount{{"/sys/fs/cgroup", "cgroup2", ""}}) {
		t.Errorf("cgroup v2: got %+v", got)
	}

	if _, err := parseCgroupMounts(strings.NewReader("25 30 0:23 / /sys rw - sysfs sysfs rw\n")); err == nil {
		t.Error("no cgroup mounted: no error")
	}
}
