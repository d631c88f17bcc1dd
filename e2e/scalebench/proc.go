package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// gatewayRSS is g's resident set now, or 0 when unknown.
func gatewayRSS(g *gwProc) int64 {
	m, _ := benchkit.ReadMem(g.pid)
	return m.RSS
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
	if err := benchkit.GetJSON(ctx, gw.DialContext, world.GatewayAdmin(gw, "/status"), &st, 20*time.Second); err != nil {
		return 0, err
	}
	return len(st.Edges), nil
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

// probesAnswered is how many liveness probes gw has answered
// (tether_gateway_tunnel_edge_streams_total{result="probe"}), or -1.
func probesAnswered(ctx context.Context, gw *testenv.Host) float64 {
	out, err := world.Get(ctx, gw, world.GatewayAdmin(gw, "/metrics"))
	if err != nil {
		return -1
	}
	return world.Metric(out, `tether_gateway_tunnel_edge_streams_total{result="probe"}`)
}
