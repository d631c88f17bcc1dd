package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A real container runtime for tests: Debian's containerd (1.6, CRI v1)
// with runc and the CNI plugins of containernetworking-plugins, running
// inside a Host's network namespace with every file under one directory.
//
// Isolation. containerd runs in a mount namespace of its own (the one
// `ip netns exec` makes), where it finds:
//   - the cgroup hierarchies mounted again on /sys/fs/cgroup (`ip netns
//     exec` mounts a fresh /sys without them, and runc needs them);
//   - empty tmpfs on /run, /var/lib and /var/log, so that the paths that
//     containerd, its shims, the CNI plugins and the kubelet do not let
//     one configure (/run/containerd/s for the shims' sockets,
//     /var/run/netns for pod namespaces, /var/lib/cni, /var/log/pods and
//     /var/log/containers) stay private;
//   - the kernel settings the kubelet insists on (vm.overcommit_memory=1,
//     kernel.panic=10, ...) as read-only files bound over /proc/sys, so
//     that a kubelet reads its desired values and never writes the host's.
//
// Every mount it and its shims make (rootfs overlays, pod namespaces) is
// in that namespace and vanishes with its last process: the host sees
// none. Processes started with (*Containerd).Start share it. runc keeps
// its state in RuncRoot, also for runtimes without a Root option. The
// cleanup kills and deletes the containers with runc (which removes
// their cgroups), kills every process left in the namespace, checks none
// remains, and removes the /k8s.io cgroups it made.

// ContainerdOptions configure StartContainerd.
type ContainerdOptions struct {
	// Dir holds containerd's root and state, its socket, runc's state and
	// the CNI configuration; it must exist.
	Dir string
	// PodCIDR is the range the CNI bridge gives pods (host-local IPAM,
	// with a default route through the bridge, as a cluster's CNI gives);
	// default 10.88.0.0/24.
	PodCIDR netip.Prefix
}

// Containerd is a running containerd.
type Containerd struct {
	Host *Host
	// Socket is the CRI endpoint, a unix socket path.
	Socket string
	// Dir is ContainerdOptions.Dir; RuncRoot is runc's state directory.
	Dir, RuncRoot string
	cmd           *exec.Cmd
	// mntNS names containerd's mount namespace ("mnt:[<inode>]").
	mntNS string
	// newCgroups are the cgroups named after containerd's CRI namespace
	// that did not exist before it started (see criCgroups).
	newCgroups []string
	opts       ContainerdOptions
}

const (
	// containerdReadyTimeout bounds containerd's start (about a second
	// here, more on a loaded machine).
	containerdReadyTimeout = 60 * time.Second
	// cniBinDir is where Debian's containernetworking-plugins installs.
	cniBinDir = "/usr/lib/cni"
)

// kubeletSysctls are the kernel settings a kubelet without
// protectKernelDefaults writes when they differ (setupKernelTunables in
// pkg/kubelet/cm): they are global, not per network namespace.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// StartContainerd starts containerd in h and waits until it answers. The
// images of WriteImages are imported, PauseImage being the sandbox image.
func StartContainerd(t T, h *Host, opts ContainerdOptions) *Containerd {
	t.Helper()
	if !opts.PodCIDR.IsValid() {
		opts.PodCIDR = netip.MustParsePrefix("10.88.0.0/24")
	}
	for _, prog := range []string{"containerd", "ctr", "runc", "nsenter", filepath.Join(cniBinDir, "bridge")} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Fatalf("containerd in %s: %v (make deps installs containerd, runc and containernetworking-plugins)", h, err)
		}
	}
	c := &Containerd{
		Host:     h,
		Dir:      opts.Dir,
		Socket:   filepath.Join(opts.Dir, "containerd.sock"),
		RuncRoot: filepath.Join(opts.Dir, "runc"),
		opts:     opts,
	}
	script, err := c.writeFiles(opts)
	if err != nil {
		t.Fatalf("containerd in %s: %v", h, err)
	}
	for _, dir := range criCgroups() {
		if statErr(dir) != nil {
			c.newCgroups = append(c.newCgroups, dir)
		}
	}
	c.cmd = h.Start(t, "sh", "-c", script)
	// Registered after Start's own cleanup, so it runs first, while
	// containerd still holds the mount namespace.
	t.Cleanup(func() { c.cleanup(t) })

	EventuallyWithin(t, containerdReadyTimeout, "containerd to answer in "+h.String(), func() bool {
		if h.Exited(c.cmd) {
			return true
		}
		_, err := c.ctr(context.Background(), "version")
		return err == nil
	})
	if h.Exited(c.cmd) {
		t.Fatalf("containerd in %s exited:\n%s", h, tail(h.Log(c.cmd), logTail))
	}
	if c.mntNS, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", c.cmd.Process.Pid)); err != nil {
		t.Fatalf("containerd's mount namespace: %v", err)
	}
	if own, _ := os.Readlink("/proc/self/ns/mnt"); own == c.mntNS {
		t.Fatalf("containerd runs in the test's own mount namespace %s", own)
	}

	images, err := WriteImages(opts.Dir)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if out, err := c.ctr(context.Background(), "--namespace", "k8s.io", "images", "import", images); err != nil {
		t.Fatalf("import images into containerd in %s: %v\n%s", h, err, out)
	}
	return c
}

// Start starts a process in containerd's mount and network namespaces
// (see Host.Start): a kubelet must see the mounts containerd makes.
func (c *Containerd) Start(t T, name string, args ...string) *exec.Cmd {
	t.Helper()
	return c.Host.Start(t, "nsenter", append([]string{"--target", strconv.Itoa(c.cmd.Process.Pid), "--mount", "--", name}, args...)...)
}

// ctr runs ctr against this containerd inside its namespaces.
func (c *Containerd) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	args = append([]string{"--target", strconv.Itoa(c.cmd.Process.Pid), "--mount", "--", "ctr", "--address", c.Socket}, args...)
	out, err := c.Host.Command(ctx, "nsenter", args...).CombinedOutput()
	return string(out), err
}

// A runcContainer is a container of runc's, with runc's state directory
// (RuncRoot/<containerd namespace>).
type runcContainer struct{ root, id string }

// containers lists the containers runc runs for containerd (pod
// sandboxes included), in every containerd namespace.
func (c *Containerd) containers() ([]runcContainer, error) {
	roots, err := os.ReadDir(c.RuncRoot)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var list []runcContainer
	for _, r := range roots {
		root := filepath.Join(c.RuncRoot, r.Name())
		out, err := exec.Command("runc", "--root", root, "list", "--quiet").Output()
		if err != nil {
			return nil, fmt.Errorf("runc --root %s list: %w", root, err)
		}
		for _, id := range strings.Fields(string(out)) {
			list = append(list, runcContainer{root, id})
		}
	}
	return list, nil
}

func statErr(path string) error {
	_, err := os.Stat(path)
	return err
}

// writeFiles writes containerd's and the CNI's configuration and returns
// the shell script that prepares the mount namespace and execs containerd.
func (c *Containerd) writeFiles(opts ContainerdOptions) (string, error) {
	cniDir := filepath.Join(c.Dir, "cni")
	sysctlDir := filepath.Join(c.Dir, "sysctl")
	for _, d := range []string{cniDir, sysctlDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "tether-test",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}
  }]
}
`, opts.PodCIDR.Masked(), filepath.Join(c.Dir, "cni-ipam"))
	if err := os.WriteFile(filepath.Join(cniDir, "10-tether-test.conflist"), []byte(cni), 0o644); err != nil {
		return "", err
	}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # The test runs without CAP_SYS_RESOURCE: no oom_score_adj below
  # containerd's own (the kubelet asks -998 for sandboxes).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, filepath.Join(c.Dir, "root"), filepath.Join(c.Dir, "state"), c.Socket, filepath.Join(c.Dir, "opt"),
		PauseImage, c.RuncRoot, cniBinDir, cniDir)
	configFile := filepath.Join(c.Dir, "containerd.toml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		return "", err
	}

	mounts, err := cgroupMounts()
	if err != nil {
		return "", err
	}
	var sh strings.Builder
	sh.WriteString("set -e\n")
	if mounts[0].dir != "/sys/fs/cgroup" {
		sh.WriteString("mount -t tmpfs -o mode=755 tether-cgroup /sys/fs/cgroup\n")
	}
	for _, m := range mounts {
		fmt.Fprintf(&sh, "mkdir -p %s\n", m.dir)
		if m.fstype == "cgroup2" {
			fmt.Fprintf(&sh, "mount -t cgroup2 cgroup2 %s\n", m.dir)
		} else {
			fmt.Fprintf(&sh, "mount -t cgroup -o %s cgroup %s\n", m.opts, m.dir)
		}
	}
	for _, d := range []string{"/run", "/var/lib", "/var/log"} {
		fmt.Fprintf(&sh, "mount -t tmpfs -o mode=755 tether-private %s\n", d)
	}
	// runc's default state directory, for containers of runtimes without
	// a Root option (ctr run): the cleanup finds them all in RuncRoot.
	fmt.Fprintf(&sh, "mkdir -p /run/containerd %s\nln -s %s /run/containerd/runc\n", c.RuncRoot, c.RuncRoot)
	for key, value := range kubeletSysctls {
		path := "/proc/sys/" + key
		if statErr(path) != nil {
			continue
		}
		file := filepath.Join(sysctlDir, strings.ReplaceAll(key, "/", "."))
		if err := os.WriteFile(file, []byte(value+"\n"), 0o444); err != nil {
			return "", err
		}
		fmt.Fprintf(&sh, "mount --bind %s %s\nmount -o remount,bind,ro %s\n", file, path, path)
	}
	fmt.Fprintf(&sh, "exec containerd --config %s\n", configFile)
	return sh.String(), nil
}

// criCgroups are the cgroups /k8s.io in every hierarchy: containerd's CRI
// puts a container whose pod has no cgroup parent (a kubelet without QoS
// cgroups) in /<namespace>/<id>, and runc removes <id> but not the parent.
func criCgroups() []string {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil
	}
	var dirs []string
	for _, m := range mounts {
		dirs = append(dirs, filepath.Join(m.dir, "k8s.io"))
	}
	return dirs
}

type cgroupMount struct{ dir, fstype, opts string }

// cgroupMounts lists the cgroup hierarchies mounted under /sys/fs/cgroup
// in the test's mount namespace (see parseCgroupMounts).
func cgroupMounts() ([]cgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseCgroupMounts(f)
}

// parseCgroupMounts reads the cgroup hierarchies under /sys/fs/cgroup
// from a mountinfo file, with the options that mount them again (the
// controllers, or none,name=<name> for a named hierarchy). A host of
// cgroup v2 only has the unified hierarchy on /sys/fs/cgroup itself.
func parseCgroupMounts(r io.Reader) ([]cgroupMount, error) {
	var mounts []cgroupMount
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		dir, fstype := fields[4], tail[0]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		if dir == "/sys/fs/cgroup" && fstype == "cgroup2" {
			return []cgroupMount{{dir: dir, fstype: fstype}}, nil
		}
		if !strings.HasPrefix(dir, "/sys/fs/cgroup/") {
			continue
		}
		var opts []string
		for _, o := range strings.Split(tail[2], ",") {
			if o != "rw" && o != "ro" {
				opts = append(opts, o)
			}
		}
		if len(opts) == 1 && strings.HasPrefix(opts[0], "name=") {
			opts = append([]string{"none"}, opts...)
		}
		mounts = append(mounts, cgroupMount{dir: dir, fstype: fstype, opts: strings.Join(opts, ",")})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(mounts) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	return mounts, nil
}

// PowerOff ends containerd as a power cut ends a node: every process in
// its mount namespace (containerd, its shims, a kubelet started by
// Start) gets SIGKILL, then every container is killed and deleted with
// runc. What a reboot wipes goes: its state directory and runc's (a
// node keeps them on the tmpfs /run) and the namespace's own /run. What
// a disk keeps stays: the root directory with the images, snapshots and
// containerd's metadata, the CNI's IP leases, and everything outside Dir
// (a kubelet's root directory). Unlike a node's disk, the namespace's
// /var/lib and /var/log go too (tmpfs here): the pods' logs in
// /var/log/pods and the CNI's cache in /var/lib/cni. Boot starts it
// again.
func (c *Containerd) PowerOff() error {
	var errs []error
	if c.mntNS != "" {
		errs = append(errs, killMountNS(c.mntNS))
	}
	errs = append(errs, c.deleteContainers())
	for _, dir := range []string{filepath.Join(c.Dir, "state"), c.RuncRoot} {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("power off containerd in %s: %w", c.Host, err)
	}
	return nil
}

// Boot starts containerd again on the files PowerOff left, with the
// options it was first started with: the node rebooted. The old
// Containerd must not be used any more.
func (c *Containerd) Boot(t T) *Containerd {
	t.Helper()
	return StartContainerd(t, c.Host, c.opts)
}

// deleteContainers kills and deletes runc's containers (from the test's
// own mount namespace, where the same cgroup paths are mounted); runc
// removes their cgroups.
func (c *Containerd) deleteContainers() error {
	var errs []error
	list, err := c.containers()
	if err != nil {
		errs = append(errs, err)
	}
	for _, ct := range list {
		_ = exec.Command("runc", "--root", ct.root, "kill", ct.id, "KILL").Run()
		if out, err := exec.Command("runc", "--root", ct.root, "delete", "--force", ct.id).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("runc delete %s: %w: %s", ct.id, err, out))
		}
	}
	return errors.Join(errs...)
}

// cleanup kills and deletes runc's containers (from the test's own mount
// namespace, where the same cgroup paths are mounted), then kills every
// process left in containerd's mount namespace (containerd, its shims,
// anything started by Start), so that the namespace and its mounts go.
func (c *Containerd) cleanup(t T) {
	errs := []error{c.deleteContainers()}
	if c.mntNS != "" {
		errs = append(errs, killMountNS(c.mntNS))
	}
	for _, dir := range c.newCgroups {
		// Empty once the containers are deleted; another runtime's
		// container still in it keeps it (rmdir fails, harmlessly).
		_ = os.Remove(dir)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("containerd cleanup in %s: %v", c.Host, err)
	}
}

// killMountNS kills every process in mount namespace ns until none is
// left or procStopGrace has passed.
func killMountNS(ns string) error {
	var left []int
	for deadline := time.Now().Add(procStopGrace); ; time.Sleep(50 * time.Millisecond) {
		left = processesInMountNS(ns)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("processes %v still in mount namespace %s", left, ns)
	}
	return nil
}

// processesInMountNS lists the processes whose mount namespace is ns.
func processesInMountNS(ns string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && link == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}
