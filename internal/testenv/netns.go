package testenv

// Hosts in network namespaces.
//
// A Host is one named network namespace (as `ip netns add` makes it, a bind
// mount under /run/netns). Setup uses the ip command; Go code enters the
// namespace with vishvananda/netns on a locked OS thread.
//
// Names are "tt<pid>x<n>-<label>": the PID of the test process that made
// the namespace, a per-process counter and a short label for people reading
// `ip netns list`. A cleanup registered by the creator deletes the namespace
// (after killing what runs in it); namespaces whose PID no longer exists,
// left behind by a killed test process, are swept by the next NewHost or
// NewTopology. The sweep trusts PIDs, so all test processes sharing
// /run/netns must share one PID namespace.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

const (
	// namePrefix starts the name of every namespace testenv makes.
	namePrefix = "tt"
	// cmdTimeout bounds every setup command (ip, nft, tc, sysctl).
	cmdTimeout = 30 * time.Second
	// procStopGrace is how long a started process has between SIGTERM and
	// SIGKILL.
	procStopGrace = 3 * time.Second
	// logTail is how much of each process log a failed test prints.
	logTail = 4 << 10
)

// nsNameRE matches the names testenv gives namespaces; group 1 is the PID.
var nsNameRE = regexp.MustCompile(`^` + namePrefix + `([0-9]+)x[0-9]+(-[a-z0-9-]*)?$`)

// nsCounter numbers the namespaces of this process.
var nsCounter atomic.Uint64

// Host is one network namespace: a machine of the test network. Its
// methods run commands and open sockets inside it. A Host made by NewHost
// has only loopback; one made by NewTopology is attached to a LAN.
type Host struct {
	// Name is the namespace's name, as `ip netns list` shows it and as
	// `ip netns exec` and `ip -n` take it.
	Name string
	// Label is the short name the test gave the host ("gw", "edge1").
	Label string
	// Addr is the host's address on its LAN (eth0; for a router, its LAN
	// side). Invalid for a host made by NewHost, which has only loopback.
	Addr netip.Addr

	t      T
	logDir string

	mu    sync.Mutex
	procs []*proc
	nlogs int
}

// proc is a process started by (*Host).Start.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when Wait returned
	err  error         // Wait's result, set before done is closed
	stop sync.Once
}

// NewHost makes a network namespace with loopback up and nothing else (no
// forwarding, no route_localnet: set them with Sysctl). The namespace and
// everything started in it are removed when t's cleanups run.
func NewHost(t T, label string) *Host {
	t.Helper()
	SkipShort(t)
	sweepStale(t)
	h, err := newHost(t, label)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return h
}

// newHost makes the namespace and registers its cleanup.
func newHost(t T, label string) (*Host, error) {
	name := fmt.Sprintf("%s%dx%d", namePrefix, os.Getpid(), nsCounter.Add(1))
	if l := sanitizeLabel(label); l != "" {
		name += "-" + l
	}
	if out, err := runIP(context.Background(), "netns", "add", name); err != nil {
		return nil, fmt.Errorf("create netns for %q: %w: %s", label, err, out)
	}
	h := &Host{Name: name, Label: label, t: t}
	t.Cleanup(h.close)
	if out, err := runIP(context.Background(), "-n", name, "link", "set", "lo", "up"); err != nil {
		return nil, fmt.Errorf("netns %s: loopback up: %w: %s", name, err, out)
	}
	return h, nil
}

// sanitizeLabel keeps a label readable in a namespace name: lower-case
// letters, digits and dashes, at most 20 characters.
func sanitizeLabel(label string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(label) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
		if b.Len() == 20 {
			break
		}
	}
	return b.String()
}

// String returns the label and the namespace name.
func (h *Host) String() string { return fmt.Sprintf("%s (netns %s)", h.Label, h.Name) }

// Command returns a command that runs name inside the namespace, through
// `ip netns exec` (which also gives it a private /sys of the namespace and
// the namespace's /etc/netns/<name> files, if any). ctx kills it as in
// exec.CommandContext.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
}

// Run runs a command inside the namespace and returns its combined output;
// it fails t, showing that output, if the command fails or takes longer
// than 30 seconds.
func (h *Host) Run(t T, name string, args ...string) string {
	t.Helper()
	out, err := h.run(name, args...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return out
}

// run is Run returning the error, with the command and its output in it.
func (h *Host) run(name string, args ...string) (string, error) {
	return h.runInput(nil, name, args...)
}

// runInput runs a command with stdin read from in.
func (h *Host) runInput(in []byte, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := h.Command(ctx, name, args...)
	if in != nil {
		cmd.Stdin = bytes.NewReader(in)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %s %s: %w\n%s", h, name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Sysctl sets a kernel parameter of the namespace, such as
// Sysctl("net.ipv4.ip_forward", "1") or
// Sysctl("net.ipv4.conf.all.route_localnet", "1").
func (h *Host) Sysctl(key, value string) error {
	_, err := h.run("sysctl", "-q", "-w", key+"="+value)
	return err
}

// Do runs fn on an OS thread switched into the namespace, then switches the
// thread back. Sockets fn creates belong to the namespace for their whole
// life, wherever they are used afterwards; goroutines fn starts do not run
// in the namespace, and fn must not block for long (it holds a thread).
func (h *Host) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(h.Name)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open netns %s: %w", h.Name, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", h.Name, err)
	}
	defer func() {
		// A thread that cannot go back stays locked, so the runtime
		// ends it when this goroutine exits instead of reusing it.
		if err := netns.Set(orig); err != nil {
			h.t.Logf("testenv: leave netns %s: %v (thread discarded)", h.Name, err)
			return
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// DialContext connects to addr from inside the namespace. The host part of
// addr must be an IP address or "localhost": resolving names would query
// the resolver of the test process's own namespace.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	addr, err := literalAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, h, err)
	}
	var c net.Conn
	err = h.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, h, err)
	}
	return c, nil
}

// Listen opens a stream listener (see net.Listen) inside the namespace.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	addr, err := literalAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, h, err)
	}
	var l net.Listener
	err = h.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, h, err)
	}
	return l, nil
}

// ListenPacket opens a packet socket (see net.ListenPacket) inside the
// namespace, for UDP servers and QUIC.
func (h *Host) ListenPacket(network, addr string) (net.PacketConn, error) {
	addr, err := literalAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, h, err)
	}
	var c net.PacketConn
	err = h.Do(func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, h, err)
	}
	return c, nil
}

// literalAddr checks that addr's host is empty, an IP address or
// "localhost" (turned into 127.0.0.1), so that net never starts resolver
// goroutines, which would run outside the namespace.
func literalAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, err
	}
	switch {
	case host == "":
	case host == "localhost":
		return net.JoinHostPort("127.0.0.1", port), nil
	default:
		if _, err := netip.ParseAddr(host); err != nil {
			return addr, fmt.Errorf("host %q is not an IP address (names are not resolved inside a namespace)", host)
		}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return addr, fmt.Errorf("port %q is not a number", port)
	}
	return addr, nil
}

// Start starts a long-running process inside the namespace, in its own
// process group, with stdout and stderr written to a log file (see Log).
// When t's cleanups run (and at the latest when the host is removed) the
// group gets SIGTERM, then SIGKILL after 3 seconds; if t failed, the end
// of the log is printed. Testenv waits for the process: do not call
// cmd.Wait, use (*Host).Wait; to end it early use (*Host).Stop.
func (h *Host) Start(t T, name string, args ...string) *exec.Cmd {
	t.Helper()
	p, err := h.start(name, args...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		h.stopProc(p)
		if f, ok := t.(interface{ Failed() bool }); ok && f.Failed() {
			t.Logf("testenv: log of %v in %s (%s):\n%s", p.cmd.Args[4:], h, p.log, tail(h.Log(p.cmd), logTail))
		}
	})
	return p.cmd
}

func (h *Host) start(name string, args ...string) (*proc, error) {
	dir, err := h.logDirectory()
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.nlogs++
	n := h.nlogs
	h.mu.Unlock()
	path := filepath.Join(dir, fmt.Sprintf("%d-%s.log", n, sanitizeLabel(filepath.Base(name))))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", name, h, err)
	}
	defer f.Close()
	cmd := h.Command(context.Background(), name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", name, h, err)
	}
	p := &proc{cmd: cmd, log: path, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	return p, nil
}

// logDirectory makes, once, the directory for the host's process logs.
func (h *Host) logDirectory() (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.logDir != "" {
		return h.logDir, nil
	}
	dir, err := os.MkdirTemp("", "testenv-"+h.Name+"-")
	if err != nil {
		return "", fmt.Errorf("log directory for %s: %w", h, err)
	}
	h.logDir = dir
	return dir, nil
}

// proc finds the record of a process started by Start.
func (h *Host) proc(cmd *exec.Cmd) *proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.procs {
		if p.cmd == cmd {
			return p
		}
	}
	return nil
}

// Log returns what a process started by Start has written so far, for
// failure messages. It returns "" for a command Start did not start.
func (h *Host) Log(cmd *exec.Cmd) string {
	p := h.proc(cmd)
	if p == nil {
		return ""
	}
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	return string(b)
}

// LogPath returns the file a process started by Start writes to.
func (h *Host) LogPath(cmd *exec.Cmd) string {
	if p := h.proc(cmd); p != nil {
		return p.log
	}
	return ""
}

// Wait waits until a process started by Start exits or ctx ends, and
// returns what cmd.Wait returned.
func (h *Host) Wait(ctx context.Context, cmd *exec.Cmd) error {
	p := h.proc(cmd)
	if p == nil {
		return fmt.Errorf("wait for %s in %s: not started by Start", cmd.Path, h)
	}
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("wait for %s in %s: %w", cmd.Args, h, ctx.Err())
	}
}

// Exited reports whether a process started by Start has exited.
func (h *Host) Exited(cmd *exec.Cmd) bool {
	p := h.proc(cmd)
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends a process started by Start as cleanup would (SIGTERM to its
// group, SIGKILL after 3 seconds) and waits for it. It returns what
// cmd.Wait returned; stopping a stopped process is a no-op.
func (h *Host) Stop(cmd *exec.Cmd) error {
	p := h.proc(cmd)
	if p == nil {
		return fmt.Errorf("stop %s in %s: not started by Start", cmd.Path, h)
	}
	h.stopProc(p)
	select {
	case <-p.done:
		return p.err
	default:
		return fmt.Errorf("stop %v in %s: pid %d did not exit", cmd.Args[4:], h, cmd.Process.Pid)
	}
}

// stopProc signals p's process group and waits, bounded, for p to exit.
func (h *Host) stopProc(p *proc) {
	p.stop.Do(func() {
		pgid := p.cmd.Process.Pid
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(procStopGrace):
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				select {
				case <-p.done:
				case <-time.After(procStopGrace):
					h.t.Logf("testenv: %s: pid %d did not exit after SIGKILL", h, pgid)
				}
			}
		}
		// Children that outlived the leader are still in its group.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
}

// close is the host's cleanup: stop its processes (normally already done
// by the cleanups Start registered), kill anything else left in the
// namespace, delete it and its process logs.
func (h *Host) close() {
	h.mu.Lock()
	procs, logDir := h.procs, h.logDir
	h.mu.Unlock()
	for _, p := range procs {
		h.stopProc(p)
	}
	if err := deleteNetns(h.Name); err != nil {
		h.t.Logf("testenv: %v", err)
	}
	if logDir != "" {
		os.RemoveAll(logDir)
	}
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// deleteNetns kills every process inside the namespace, then deletes it.
// A process can still join between the last look and the delete (an
// `ip netns exec` that opened the namespace just before), so the
// processes in the namespace, found by its inode, are killed once more
// after the delete: the namespace lives on, unnamed, while any remain.
func deleteNetns(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(netnsDir, name), &st); err != nil {
		// Gone already, or unreadable: del says which.
		st = syscall.Stat_t{}
	}
	// A few rounds, in case a dying process spawns another.
	for range 3 {
		if killNetns(st) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out, err := runIP(ctx, "netns", "del", name); err != nil {
		return fmt.Errorf("delete netns %s: %w: %s", name, err, out)
	}
	killNetns(st)
	return nil
}

// killNetns sends SIGKILL to every process whose network namespace is ns
// (a zero ns: none), found as `ip netns pids` finds them, and returns how
// many it found. The test process itself is never one of them.
func killNetns(ns syscall.Stat_t) int {
	if ns.Ino == 0 {
		return 0
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil || st.Ino != ns.Ino || st.Dev != ns.Dev {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		n++
	}
	return n
}

// runIP runs the ip command in the test process's namespace. Callers only
// use it for commands that touch namespaces testenv made: `ip -n NAME ...`
// and `ip netns add|del|pids NAME`.
func runIP(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// netnsDir is where `ip netns` keeps its named namespaces.
const netnsDir = "/run/netns"

// sweepStale deletes namespaces made by testenv in test processes that no
// longer exist (a test binary killed before its cleanups ran).
func sweepStale(t T) {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			t.Logf("testenv: sweep stale namespaces: %v", err)
		}
		return
	}
	for _, e := range entries {
		m := nsNameRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid <= 0 || pidAlive(pid) {
			continue
		}
		if err := deleteNetns(e.Name()); err != nil {
			// Another process may be sweeping the same namespace.
			if _, statErr := os.Stat(filepath.Join(netnsDir, e.Name())); statErr == nil {
				t.Logf("testenv: sweep stale namespace: %v", err)
			}
			continue
		}
		t.Logf("testenv: swept namespace %s left by dead process %d", e.Name(), pid)
	}
}

// pidAlive reports whether a process with that PID exists.
func pidAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
