package benchkit

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CPU is the CPU time (user and system) process pid has used so far, from
// utime and stime of /proc/<pid>/stat (in USER_HZ ticks of 10 ms), or 0
// when the process is gone or the file cannot be read.
func CPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime and stime from the text of /proc/<pid>/stat.
func parseStatCPU(b []byte) time.Duration {
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis (utime and stime are fields 14 and 15).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// Mem is a process's resident memory now and at its peak, in bytes, and
// what is resident now split into anonymous memory (the Go heap and
// stacks) and file pages (the binary, memory-mapped files).
type Mem struct {
	RSS, HWM   int64 // VmRSS, VmHWM
	Anon, File int64 // RssAnon, RssFile
}

// ReadMem reads VmRSS, VmHWM, RssAnon and RssFile from /proc/<pid>/status.
func ReadMem(pid int) (Mem, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Mem{}, err
	}
	m := parseStatus(string(b))
	if m.RSS == 0 {
		return m, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return m, nil
}

func parseStatus(s string) Mem {
	var m Mem
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			m.RSS = n << 10
		case "VmHWM":
			m.HWM = n << 10
		case "RssAnon":
			m.Anon = n << 10
		case "RssFile":
			m.File = n << 10
		}
	}
	return m
}

// Written is write_bytes of /proc/<pid>/io: the bytes process pid had
// written to storage (before the page cache merges them), or 0.
func Written(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// RealPID is the pid of the process running binary that was started as
// pid: pid itself once `ip netns exec` has exec'd the program in place
// (it does, outside batch mode), else a child running the binary. It
// waits up to 5 s for the exec.
func RealPID(ctx context.Context, pid int, binary string) (int, error) {
	want := filepath.Base(binary)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		for _, p := range append([]int{pid}, children(pid)...) {
			exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p))
			if err == nil && filepath.Base(exe) == want {
				return p, nil
			}
		}
		if err := Sleep(ctx, 20*time.Millisecond); err != nil {
			return 0, fmt.Errorf("pid %d is not %s and has no child running it", pid, want)
		}
	}
}

func children(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}
