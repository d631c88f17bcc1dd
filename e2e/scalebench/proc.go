package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// procCPU is the CPU time process pid has used (utime + stime from
// /proc/<pid>/stat, in 10 ms ticks), or 0.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
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
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// procMem is a process's resident set now and at its peak (VmRSS and
// VmHWM of /proc/<pid>/status), in bytes; zero when unknown.
type procMem struct{ rss, hwm int64 }

func readMem(pid int) procMem {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMem{}
	}
	var m procMem
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = kb << 10
		case "VmHWM:":
			m.hwm = kb << 10
		}
	}
	return m
}

// realPID is the pid running binary: pid itself, or a child of it (a
// process started through `ip netns exec` may be either).
func realPID(ctx context.Context, pid int, binary string) (int, error) {
	want := filepath.Base(binary)
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, p := range append([]int{pid}, children(pid)...) {
			exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p))
			if err == nil && filepath.Base(exe) == want {
				return p, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("pid %d is not %s and has no child running it", pid, want)
		}
		time.Sleep(20 * time.Millisecond)
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

// udpCounters are the UDP counters of a network namespace (Udp: of
// /proc/net/snmp, which a process reads for its own namespace).
type udpCounters struct {
	in, out      int64 // InDatagrams, OutDatagrams
	rcvbufErrors int64 // RcvbufErrors: dropped for a full receive buffer
}

// udpDatagrams reads h's namespace's UDP counters.
func udpDatagrams(ctx context.Context, h *testenv.Host) (udpCounters, error) {
	var c udpCounters
	b, err := h.Command(ctx, "cat", "/proc/net/snmp").Output()
	if err != nil {
		return c, fmt.Errorf("read /proc/net/snmp in %s: %w", h, err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i := 1; i < len(f) && i < len(names); i++ {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			switch names[i] {
			case "InDatagrams":
				c.in = v
			case "OutDatagrams":
				c.out = v
			case "RcvbufErrors":
				c.rcvbufErrors = v
			}
		}
		return c, nil
	}
	return c, fmt.Errorf("no Udp counters in /proc/net/snmp of %s", h)
}

// raiseFileLimit raises this process's open-file limit (soft and, as root
// may, hard) to at least n: every simulated edge holds a UDP socket per
// gateway, and the processes this one starts inherit the limit.
func raiseFileLimit(n int) {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return
	}
	want := uint64(n)
	if l.Cur >= want && l.Max >= want {
		return
	}
	l.Max = max(l.Max, want)
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		note("cannot raise the open-file limit to %d: %v", n, err)
	}
}

// statusEdges is the part of the gateway's /status the bench reads.
type statusEdges struct {
	Ready bool `json:"ready"`
	Edges []struct {
		Node string `json:"node"`
	} `json:"edges"`
}

// registered is how many edges gw's /status lists, or an error while it
// does not answer.
func registered(ctx context.Context, gw *testenv.Host) (int, error) {
	var st statusEdges
	if err := getJSON(ctx, gw, world.GatewayAdmin(gw, "/status"), &st); err != nil {
		return 0, err
	}
	return len(st.Edges), nil
}

func getJSON(ctx context.Context, h *testenv.Host, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c := &http.Client{Transport: &http.Transport{DialContext: h.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// goroutines is the gateway's goroutine count from its profiling
// endpoint (the first line of /debug/pprof/goroutine?debug=1), or -1.
func goroutines(ctx context.Context, gw *testenv.Host) int {
	out, err := world.Get(ctx, gw, world.GatewayAdmin(gw, "/debug/pprof/goroutine?debug=1"))
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(out, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(line, "goroutine profile: total "))
	if err != nil {
		return -1
	}
	return n
}
