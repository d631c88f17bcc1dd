package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// traffic is bytes in both directions across the site's uplink: down is
// cloud → site.
type traffic struct{ down, up int64 }

func (t traffic) sub(u traffic) traffic { return traffic{t.down - u.down, t.up - u.up} }

// sub is after − before, by node.
func sub(after, before map[string]traffic) map[string]traffic {
	d := make(map[string]traffic, len(after))
	for name, t := range after {
		d[name] = t.sub(before[name])
	}
	return d
}

// uplink reads the site router's uplink counters.
type uplink struct{ router *testenv.Host }

// read returns wan0's byte counters (link layer: Ethernet headers
// included); rx on wan0 is what came from the cloud.
func (u uplink) read(ctx context.Context) (traffic, error) {
	out, err := u.router.Command(ctx, "cat", "/sys/class/net/wan0/statistics/rx_bytes", "/sys/class/net/wan0/statistics/tx_bytes").Output()
	if err != nil {
		return traffic{}, fmt.Errorf("read wan0 counters in %s: %w", u.router, err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return traffic{}, fmt.Errorf("read wan0 counters in %s: %q", u.router, out)
	}
	rx, err1 := strconv.ParseInt(f[0], 10, 64)
	tx, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return traffic{}, fmt.Errorf("read wan0 counters in %s: %q", u.router, out)
	}
	return traffic{down: rx, up: tx}, nil
}

// edgeCounters counts the bytes the site router forwards between its
// uplink and each edge (IP packets, counted in an nftables table of the
// bench's own in the router's namespace), to tell which node's traffic
// the uplink carried.
type edgeCounters struct {
	router *testenv.Host
	names  []string
}

const counterTable = "tether_poolbench"

func newEdgeCounters(ctx context.Context, router *testenv.Host, edges []*world.Edge) (*edgeCounters, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", counterTable)
	for _, e := range edges {
		fmt.Fprintf(&b, "\tcounter down-%s {}\n\tcounter up-%s {}\n", e.Name, e.Name)
	}
	b.WriteString("\tchain forward {\n\t\ttype filter hook forward priority filter - 5; policy accept;\n")
	for _, e := range edges {
		fmt.Fprintf(&b, "\t\tiifname \"wan0\" ip daddr %s counter name \"down-%s\"\n", e.Host.Addr, e.Name)
		fmt.Fprintf(&b, "\t\toifname \"wan0\" ip saddr %s counter name \"up-%s\"\n", e.Host.Addr, e.Name)
	}
	b.WriteString("\t}\n}\n")
	cmd := router.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("per-node counters in %s: %w: %s", router, err, out)
	}
	c := &edgeCounters{router: router}
	for _, e := range edges {
		c.names = append(c.names, e.Name)
	}
	return c, nil
}

// read returns the bytes forwarded so far, by node name.
func (c *edgeCounters) read(ctx context.Context) (map[string]traffic, error) {
	out, err := c.router.Command(ctx, "nft", "-j", "list", "counters", "table", "inet", counterTable).Output()
	if err != nil {
		return nil, fmt.Errorf("read per-node counters in %s: %w", c.router, err)
	}
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Name  string `json:"name"`
				Bytes int64  `json:"bytes"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("read per-node counters in %s: %w", c.router, err)
	}
	res := map[string]traffic{}
	for _, o := range doc.Nftables {
		if o.Counter == nil {
			continue
		}
		dir, node, ok := strings.Cut(o.Counter.Name, "-")
		if !ok {
			continue
		}
		t := res[node]
		switch dir {
		case "down":
			t.down = o.Counter.Bytes
		case "up":
			t.up = o.Counter.Bytes
		}
		res[node] = t
	}
	return res, nil
}

// procMem is a tether-edge's memory: what /proc says (benchkit.Mem) and,
// from its /metrics, the Go heap in use and all the memory the Go runtime
// obtained from the OS.
type procMem struct {
	benchkit.Mem
	heap, goSys int64
}

func readMem(pid int) (procMem, error) {
	m, err := benchkit.ReadMem(pid)
	return procMem{Mem: m}, err
}

// edgeMetrics is what the bench reads from an edge's /metrics.
type edgeMetrics struct {
	// proxyDown: bytes of response bodies the apiserver proxy relayed
	// from the cloud (tether_edge_apiserver_bytes_total{direction="down"}).
	proxyDown float64
	// replicated: bytes a follower received from the leader over the
	// pool listener (tether_edge_pool_bytes_received_total).
	replicated float64
	// heapInuse and goSys: the Go runtime's heap in use and all the
	// memory it obtained from the OS (go_memstats_*).
	heapInuse, goSys float64
	// goroutines is go_goroutines; streams the pool's replication
	// streams the node serves (tether_edge_pool_streams_serving).
	goroutines, streams float64
	// ended counts the replication streams the node ended, by reason
	// (tether_edge_pool_streams_ended_total).
	ended map[string]float64
	// served counts kube-proxy's requests by how the proxy served them
	// (upstream, pool, ...).
	served map[string]float64
}

func readMetrics(ctx context.Context, e *world.Edge) (edgeMetrics, error) {
	body, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
	if err != nil {
		return edgeMetrics{}, fmt.Errorf("metrics of %s: %w", e.Name, err)
	}
	m := edgeMetrics{
		proxyDown:  world.Metric(body, `tether_edge_apiserver_bytes_total{direction="down"}`),
		replicated: world.Metric(body, "tether_edge_pool_bytes_received_total"),
		heapInuse:  world.Metric(body, "go_memstats_heap_inuse_bytes"),
		goSys:      world.Metric(body, "go_memstats_sys_bytes"),
		goroutines: world.Metric(body, "go_goroutines"),
		streams:    world.Metric(body, "tether_edge_pool_streams_serving"),
		served:     map[string]float64{},
		ended:      map[string]float64{},
	}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, `tether_edge_pool_streams_ended_total{reason="`); ok {
			reason, _, _ := strings.Cut(rest, `"`)
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			m.ended[reason] = v
			continue
		}
		if !strings.HasPrefix(line, "tether_edge_apiserver_requests_total{") || !strings.Contains(line, `component="kube-proxy"`) {
			continue
		}
		_, rest, _ := strings.Cut(line, `served="`)
		served, _, _ := strings.Cut(rest, `"`)
		v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		m.served[served] += v
	}
	return m, nil
}
