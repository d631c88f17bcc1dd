package main

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/gateway/tunnelserver"
)

// The gateway's health across the phases (issue 18: "no error, refusal
// or goroutine growth in the gateway beyond what the phases cause").
// After each phase the bench reads replica 0's goroutines, the counters
// of everything it refuses or fails (troubleSeries) from /metrics, and the
// WARN and ERROR lines of its log, and reports what the phase added. A
// restarted gateway (the storm) starts its counters and log anew.

// troubleSeries are the gateway's counters of refusals and failures:
// the metric, the label that says why (summed over the others, such as
// node), and the values of that label that are not trouble.
var troubleSeries = []struct {
	metric, label string
	fine          []string
}{
	{"tether_gateway_tunnel_connections_total", "result", []string{"registered"}},
	{"tether_gateway_tunnel_evictions_total", "reason", nil},
	{"tether_gateway_tunnel_udp_drops_total", "", nil},
	{"tether_gateway_tunnel_handshakes_shed_total", "", nil},
	{"tether_gateway_tunnel_retries_total", "", nil},
	{"tether_gateway_tunnel_handshakes_abandoned_total", "", nil},
	{"tether_gateway_tunnel_receive_window_refusals_total", "", nil},
	{"tether_gateway_tunnel_edge_streams_total", "result", []string{"served", "probe"}},
	{"tether_gateway_edge_refusals_total", "reason", nil},
	{"tether_gateway_proxy_refusals_total", "reason", nil},
	{"tether_gateway_accept_errors_total", "listener", nil},
	{"tether_gateway_netrules_applies_total", "result", []string{"ok"}},
	{"tether_gateway_dns_tcp_refusals_total", "reason", nil},
	{"tether_gateway_delegated_heartbeats_total", "result", []string{"ok"}},
	{"tether_gateway_delegated_heartbeat_taint_changes_total", "result", []string{"ok"}},
	{"tether_gateway_election_writes_total", "result", []string{"ok"}},
}

// phaseCauses is the trouble a phase causes by design, by phase: the
// keys of troubles (short metric name, then the reason in braces) and of
// log lines (logKey) it may add. A cold start or a restart storm
// saturates the gateway with handshakes: it refuses those that waited too
// long for a place (handshakes_shed, and its log line), edges give up on
// some that held one (handshakes_abandoned; fewer than were answered, so
// any retries would be a flood wrongly seen), the kernel may drop
// datagrams (udp_drops), and edges whose tunnel came up meanwhile may give
// up a liveness probe (edge_streams{aborted}); the churn phase's probes
// connect to nodes that have no tunnel and close without a byte.
var phaseCauses = map[string][]string{
	"cold":  saturated,
	"storm": saturated,
	"churn": {"proxy_refusals{no_tunnel}", "proxy_refusals{peek_timeout}", "proxy_refusals{no_route}"},
}

var saturated = []string{"udp_drops", "edge_streams{aborted}", "handshakes_shed", "handshakes_abandoned", logKey(tunnelserver.ShedMessage)}

// logKey is how a WARN or ERROR message is shown.
func logKey(msg string) string { return fmt.Sprintf("log %q", msg) }

// troubleKey is how a series is shown: the metric without its prefix and
// _total, and the reason.
func troubleKey(metric, reason string) string {
	k := strings.TrimSuffix(strings.TrimPrefix(metric, "tether_gateway_"), "_total")
	k = strings.TrimPrefix(k, "tunnel_")
	if reason != "" {
		k += "{" + reason + "}"
	}
	return k
}

var seriesLine = regexp.MustCompile(`^([a-z_]+)(?:\{([^}]*)\})? (\S+)$`)
var labelPair = regexp.MustCompile(`([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"`)

// troubles sums the trouble counters of a /metrics exposition by key.
func troubles(exposition string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(exposition, "\n") {
		m := seriesLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, ts := range troubleSeries {
			if m[1] != ts.metric {
				continue
			}
			reason := ""
			if ts.label != "" {
				for _, lp := range labelPair.FindAllStringSubmatch(m[2], -1) {
					if lp[1] == ts.label {
						reason = lp[2]
					}
				}
				if slices.Contains(ts.fine, reason) {
					break
				}
			}
			v, err := strconv.ParseFloat(m[3], 64)
			if err == nil && v > 0 {
				out[troubleKey(ts.metric, reason)] += v
			}
		}
	}
	return out
}

// healthMark is replica 0 after a phase.
type healthMark struct {
	phase      string
	pid        int
	edges      int // registered
	goroutines int
	troubles   map[string]float64 // cumulative, since the process started
	logLines   int                // of the process's log read so far
	// What the phase added: troubles, and WARN/ERROR log lines by message.
	added    map[string]float64
	logAdded map[string]int
}

// overhead is the goroutines beyond the three each tunnel has (quic-go's
// run loop and send queue, the gateway's stream acceptor), or -1.
func (m healthMark) overhead() int {
	if m.goroutines < 0 || m.edges < 0 {
		return -1
	}
	return m.goroutines - 3*m.edges
}

// unexpected is what the phase added beyond what it causes by design.
func (m healthMark) unexpected() []string {
	return m.describe(func(k string) bool { return !slices.Contains(phaseCauses[m.phase], k) })
}

// describe lists the troubles and the WARN or ERROR messages the phase
// added for which keep is true.
func (m healthMark) describe(keep func(key string) bool) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m.added)) {
		if keep(k) {
			out = append(out, fmt.Sprintf("%s +%.0f", k, m.added[k]))
		}
	}
	for _, msg := range slices.Sorted(maps.Keys(m.logAdded)) {
		if keep(logKey(msg)) {
			out = append(out, fmt.Sprintf("%s ×%d", logKey(msg), m.logAdded[msg]))
		}
	}
	return out
}

// markHealth records replica 0's health after phase (nothing when it is
// not running).
func (b *bench) markHealth(ctx context.Context, phase string, res *results) {
	g := b.gws[0]
	if g == nil {
		return
	}
	m := healthMark{phase: phase, pid: g.pid, edges: -1, goroutines: goroutines(ctx, g.host)}
	if n, err := registered(ctx, g.host); err == nil {
		m.edges = n
	}
	var prev *healthMark
	if k := len(res.health); k > 0 && res.health[k-1].pid == g.pid {
		prev = &res.health[k-1]
	}
	if out, err := world.Get(ctx, g.host, world.GatewayAdmin(g.host, "/metrics")); err == nil {
		m.troubles = troubles(out)
	}
	m.added = map[string]float64{}
	for k, v := range m.troubles {
		if prev != nil {
			v -= prev.troubles[k]
		}
		if v > 0 {
			m.added[k] = v
		}
	}
	lines := strings.Split(g.host.Log(g.cmd), "\n")
	from := 0
	if prev != nil {
		from = min(prev.logLines, len(lines))
	}
	m.logLines = len(lines)
	m.logAdded = logIssues(lines[from:])
	res.health = append(res.health, m)
}

var logMsg = regexp.MustCompile(`msg=("(?:[^"\\]|\\.)*"|\S+)`)

// logIssues counts the WARN and ERROR lines of a gateway's text log by
// message.
func logIssues(lines []string) map[string]int {
	out := map[string]int{}
	for _, l := range lines {
		if !strings.Contains(l, "level=WARN") && !strings.Contains(l, "level=ERROR") {
			continue
		}
		msg := l
		if m := logMsg.FindStringSubmatch(l); m != nil {
			msg = strings.Trim(m[1], `"`)
		}
		out[msg]++
	}
	return out
}

// printHealth prints the marks and judges the target.
func printHealth(r *results) {
	if len(r.health) == 0 {
		return
	}
	fmt.Printf("gateway health after each phase (replica 0; refusals, failures and WARN/ERROR log lines the phase added):\n")
	fmt.Printf("  %-12s %7s %11s %9s  %s\n", "phase", "edges", "goroutines", "beyond 3/edge", "added")
	var bad []string
	base := -1
	for _, m := range r.health {
		added := m.describe(func(string) bool { return true })
		if len(added) == 0 {
			added = []string{"nothing"}
		}
		fmt.Printf("  %-12s %7d %11d %13d  %s\n", m.phase, m.edges, m.goroutines, m.overhead(), strings.Join(added, ", "))
		if u := m.unexpected(); len(u) > 0 {
			bad = append(bad, m.phase+": "+strings.Join(u, ", "))
		}
		// Goroutines beyond the tunnels' own: the first mark with every
		// edge connected sets the level later marks must stay near.
		if o := m.overhead(); o >= 0 && m.edges >= r.edges {
			if base < 0 {
				base = o
			} else if o > base+base/10+50 {
				bad = append(bad, fmt.Sprintf("%s: %d goroutines beyond 3 per edge, %d after the first full phase", m.phase, o, base))
			}
		}
	}
	verdict := "met"
	if len(bad) > 0 {
		verdict = "missed: " + strings.Join(bad, "; ")
	}
	fmt.Printf("  no refusal, error or goroutine growth beyond what the phases cause: %s\n", verdict)
}
