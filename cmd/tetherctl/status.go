package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/tether-edge/tether/internal/statusapi"
)

// gatewayStatus is one gateway's /status with the URL it came from; the
// JSON output is a list of them (the gateway's own fields inlined).
type gatewayStatus struct {
	URL string `json:"gateway"`
	statusapi.Gateway
}

// status prints the /status of every gateway; it fails if any gateway did
// not answer, after printing what the others said.
func status(ctx context.Context, o options, stdout, stderr io.Writer) int {
	client := &http.Client{Timeout: o.timeout}
	ok, code := fetchAll(o.gateways, stderr, func(gw string) (gatewayStatus, error) {
		r := gatewayStatus{URL: normalizeGateway(gw)}
		var err error
		r.Gateway, err = fetchStatus(ctx, client, r.URL)
		return r, err
	})
	if o.output == "json" {
		if ok == nil {
			ok = []gatewayStatus{}
		}
		return cmp.Or(writeJSON(stdout, stderr, ok), code)
	}
	if len(ok) > 0 {
		writeTable(stdout, ok, time.Now())
	}
	return code
}

// fetchAll runs fetch for every target at once. A failure is reported on
// stderr and makes the exit status exitError; the others' results come
// back in the targets' order.
func fetchAll[T any](targets []string, stderr io.Writer, fetch func(string) (T, error)) ([]T, int) {
	results := make([]T, len(targets))
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() { results[i], errs[i] = fetch(t) })
	}
	wg.Wait()
	var ok []T
	code := exitOK
	for i, err := range errs {
		if err != nil {
			fmt.Fprintln(stderr, "tetherctl:", err)
			code = exitError
			continue
		}
		ok = append(ok, results[i])
	}
	return ok, code
}

// normalizeGateway turns host:port into http://host:port.
func normalizeGateway(gw string) string {
	gw = strings.TrimRight(strings.TrimSpace(gw), "/")
	if !strings.Contains(gw, "://") {
		gw = "http://" + gw
	}
	return gw
}

// adminKind is a kind of admin endpoint: what errors call it and what they
// suggest checking when it is unreachable.
type adminKind struct{ name, hint string }

var (
	gatewayAdmin = adminKind{"gateway", "is tether-gateway running, and is its --admin-listen address reachable from here? Name another with --gateway"}
	edgeAdmin    = adminKind{"edge", "is tether-edge running, and is its --admin-listen address reachable from here? " +
		"It listens on " + defaultEdgeAdmin + " by default: run tetherctl on the edge node, or through an SSH tunnel"}
)

// fetchStatus GETs gw's /status. Its errors say which gateway failed and
// what to check.
func fetchStatus(ctx context.Context, client *http.Client, gw string) (statusapi.Gateway, error) {
	var st statusapi.Gateway
	body, err := get(ctx, client, gatewayAdmin, gw, "/status")
	if herr, ok := errors.AsType[*httpError](err); ok {
		return st, fmt.Errorf("%w (is this the admin address of a tether-gateway?)", herr)
	} else if err != nil {
		return st, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("gateway %s: /status is not a tether-gateway status: %w", gw, err)
	}
	if st.Replica == "" {
		return st, fmt.Errorf("gateway %s: /status has no replica name: not a tether-gateway status", gw)
	}
	return st, nil
}

// get GETs path on the admin endpoint at base and returns the body of a
// 200 answer. Its errors say which gateway or edge failed and what to
// check; another answer is an *httpError.
func get(ctx context.Context, client *http.Client, kind adminKind, base, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind.name, base, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		hint := kind.hint
		var nerr net.Error
		if errors.As(err, &nerr) && nerr.Timeout() {
			hint = "no answer within --timeout; is a firewall dropping the traffic?"
		}
		return nil, fmt.Errorf("%s %s unreachable: %v (%s)", kind.name, base, unwrapURLError(err), hint)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read %s: %w", kind.name, base, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &httpError{kind: kind.name, url: base, path: path, status: resp.Status, body: strings.TrimSpace(string(body))}
	}
	return body, nil
}

// httpError is an admin endpoint's answer other than 200.
type httpError struct{ kind, url, path, status, body string }

func (e *httpError) Error() string {
	return fmt.Sprintf("%s %s: GET %s: %s", e.kind, e.url, e.path, e.status)
}

// unwrapURLError drops net/http's `Get "url":` prefix, which repeats what
// the message already says.
func unwrapURLError(err error) error {
	if uerr, ok := errors.AsType[*url.Error](err); ok {
		return uerr.Err
	}
	return err
}

// edgeRow is one edge connection of one replica.
type edgeRow struct {
	replica string
	e       statusapi.ConnectedEdge
}

// writeTable prints a line per gateway, then one table of every edge
// connection, sorted by node and replica.
func writeTable(w io.Writer, gws []gatewayStatus, now time.Time) {
	var rows []edgeRow
	for _, g := range gws {
		ready := "ready"
		if !g.Ready {
			ready = "NOT READY: " + g.NotReady
		}
		fmt.Fprintf(w, "gateway %s: replica %s, version %s, mode %s, %s; %d of %d edge nodes connected\n",
			g.URL, g.Replica, g.Version, g.Mode, ready, len(g.Edges), g.EdgeNodes)
		for _, e := range g.Edges {
			rows = append(rows, edgeRow{g.Replica, e})
		}
	}
	slices.SortFunc(rows, func(a, b edgeRow) int {
		return cmp.Or(cmp.Compare(a.e.Node, b.e.Node), cmp.Compare(a.replica, b.replica))
	})
	fmt.Fprintln(w)
	if len(rows) == 0 {
		fmt.Fprintln(w, "no edges connected")
	} else {
		writeEdges(w, rows, now)
	}
	writeRefusals(w, gws)
}

// writeRefusals prints the addresses and pod ranges edge nodes claim that
// a gateway does not route to them, once per claim with the replicas that
// refuse it.
func writeRefusals(w io.Writer, gws []gatewayStatus) {
	addrs, pods := map[refusalKey][]string{}, map[refusalKey][]string{}
	for _, g := range gws {
		for _, r := range g.AddressRefusals {
			k := refusalKey{r.Addr.String(), r.Node, r.Reason, r.Holder}
			addrs[k] = append(addrs[k], g.Replica)
		}
		for _, r := range g.PodRangeRefusals {
			k := refusalKey{r.Prefix.String(), r.Node, r.Reason, r.With}
			pods[k] = append(pods[k], g.Replica)
		}
	}
	writeRefusalTable(w, addrs, "address claims not routed (a node claims an address that is not uniquely its own edge address)",
		"ADDRESS\tCLAIMED BY\tREASON\tROUTED TO\tREPLICAS", "none")
	writeRefusalTable(w, pods, "pod ranges not routed (a Node's spec.podCIDRs that is not uniquely its own inside --edge-pod-cidrs)",
		"RANGE\tNODE\tREASON\tOVERLAPS\tREPLICAS", "-")
}

type refusalKey struct{ what, node, reason, other string }

func writeRefusalTable(w io.Writer, replicas map[refusalKey][]string, title, header, noOther string) {
	if len(replicas) == 0 {
		return
	}
	keys := slices.SortedFunc(maps.Keys(replicas), func(a, b refusalKey) int {
		return cmp.Or(cmp.Compare(a.what, b.what), cmp.Compare(a.node, b.node), cmp.Compare(a.reason, b.reason))
	})
	fmt.Fprintf(w, "\n%d %s:\n", len(keys), title)
	tw := newTable(w, false, header, "")
	for _, k := range keys {
		other := k.other
		if other == "" {
			other = noOther
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.what, k.node, k.reason, other, strings.Join(replicas[k], ","))
	}
	tw.Flush()
}

// writeEdges prints the table of edge connections.
func writeEdges(w io.Writer, rows []edgeRow, now time.Time) {
	tw := newTable(w, false, "NODE\tPOOL\tREPLICA\tRTT\tSTREAMS\tBYTES UP\tBYTES DOWN\tCONNECTED SINCE", "")
	for _, r := range rows {
		e := r.e
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n",
			e.Node, orDash(e.Pool), r.replica, formatRTT(e.RTTMillis), e.Streams,
			formatBytes(e.BytesUp), formatBytes(e.BytesDown), formatSince(e.ConnectedSince, now))
	}
	tw.Flush()
}

// newTable returns a writer that aligns the tab-separated columns of
// tetherctl's tables, its header line written: the columns, and with wide
// the wide ones after them.
func newTable(w io.Writer, wide bool, columns, wideColumns string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if wide {
		columns += "\t" + wideColumns
	}
	fmt.Fprintln(tw, columns)
	return tw
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// formatRTT prints the smoothed RTT; 0 means not measured yet.
func formatRTT(ms float64) string {
	switch {
	case ms <= 0:
		return "-"
	case ms < 10:
		return fmt.Sprintf("%.2fms", ms)
	case ms < 1000:
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.2fs", ms/1000)
}

// formatBytes prints n in IEC units: 0 B, 512 B, 1.5 KiB, 3.2 GiB.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// formatSince prints the time in UTC and how long ago it was.
func formatSince(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s)", t.UTC().Format(time.RFC3339), age(t, now))
}

// age is how long before now t was, to the second (0 for a time in the
// future: clocks differ).
func age(t, now time.Time) time.Duration {
	return max(now.Sub(t).Round(time.Second), 0)
}
