package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-edge/tether/internal/statusapi"
)

// defaultEdgeAdmin is tether-edge's admin address (docs/design.md, "Ports
// and names": edge admin HTTP 127.0.0.1:10267); --edge fills in its port
// and host.
const defaultEdgeAdmin = "127.0.0.1:10267"

// edgePool is the pool part of one edge's /status with the URL it came
// from; the JSON output of `tetherctl pools --edge` is a list of them.
type edgePool struct {
	Edge string `json:"edge"`
	Node string `json:"node"`
	// Pool is the pool part of the edge's /status; nil when the edge runs
	// no node pool (no apiserver proxy, --pool-listen empty, its Node in
	// no pool, or its Node not read yet).
	Pool *statusapi.Pool `json:"pool"`
}

// edgePools prints the pool part of every edge's /status; it fails if any
// edge did not answer, after printing what the others said.
func edgePools(ctx context.Context, o options, stdout, stderr io.Writer) int {
	client := &http.Client{Timeout: o.timeout}
	ok, code := fetchAll(o.edges, stderr, func(e string) (edgePool, error) {
		return fetchEdgePool(ctx, client, normalizeEdge(e))
	})
	slices.SortStableFunc(ok, func(a, b edgePool) int { return cmp.Compare(a.Node, b.Node) })
	if o.output == "json" {
		if ok == nil {
			ok = []edgePool{}
		}
		return cmp.Or(writeJSON(stdout, stderr, ok), code)
	}
	if len(ok) > 0 {
		writeEdgePoolsTable(stdout, ok, time.Now(), o.output == "wide")
	}
	return code
}

// normalizeEdge turns an --edge item into the admin endpoint's URL: a
// missing scheme is http, a missing port 10267, a missing host loopback
// (":10267", "127.0.0.1", "http://10.0.1.5" all work).
func normalizeEdge(e string) string {
	e = strings.TrimRight(strings.TrimSpace(e), "/")
	if !strings.Contains(e, "://") {
		e = "http://" + e
	}
	u, err := url.Parse(e)
	if err != nil {
		return e // the request says what is wrong with it
	}
	host, port := u.Hostname(), u.Port()
	defHost, defPort, _ := net.SplitHostPort(defaultEdgeAdmin)
	if host == "" {
		host = defHost
	}
	if port == "" {
		port = defPort
	}
	u.Host = net.JoinHostPort(host, port)
	return u.String()
}

// fetchEdgePool GETs the edge's /status and keeps its node and pool.
func fetchEdgePool(ctx context.Context, client *http.Client, edge string) (edgePool, error) {
	ep := edgePool{Edge: edge}
	body, err := get(ctx, client, edgeAdmin, edge, "/status")
	if herr, ok := errors.AsType[*httpError](err); ok {
		return ep, fmt.Errorf("%w (is this the admin address of a tether-edge?)", herr)
	} else if err != nil {
		return ep, err
	}
	var st statusapi.Edge
	if err := json.Unmarshal(body, &st); err != nil {
		return ep, fmt.Errorf("edge %s: /status is not a tether-edge status: %w", edge, err)
	}
	if st.Node == "" {
		return ep, fmt.Errorf("edge %s: /status has no node name: not a tether-edge status", edge)
	}
	ep.Node, ep.Pool = st.Node, st.Pool
	return ep, nil
}

// writeEdgePoolsTable prints a line per edge. wide adds the follower's
// connection, resyncs and last error and prints the whole digest.
func writeEdgePoolsTable(w io.Writer, eps []edgePool, now time.Time, wide bool) {
	tw := newTable(w, wide, "NODE\tPOOL\tROLE\tLEADER\tEPOCH\tREV\tOBJECTS\tLAST SYNC\tFRESH\tLAG\tDIGEST", "CONNECTED\tRESYNCS\tLAST ERROR")
	for _, ep := range eps {
		p := ep.Pool
		if p == nil {
			// No pool on this edge: its node, and dashes.
			fmt.Fprintf(tw, "%s\t-\toff\t-\t-\t-\t-\t-\t-\t-\t-", ep.Node)
			if wide {
				fmt.Fprint(tw, "\t-\t-\t-")
			}
			fmt.Fprintln(tw)
			continue
		}
		fresh := "no"
		if p.Fresh {
			fresh = "yes"
		}
		lag := "-"
		if r := p.Replication; r != nil {
			lag = strconv.FormatUint(r.Lag, 10)
			if !r.Connected {
				lag += " (disconnected)"
			}
		}
		digest := p.Digest
		if !wide && len(digest) > 12 {
			digest = digest[:12]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s", ep.Node, orDash(p.Pool), p.Role, orDash(p.Leader),
			orDash(p.Epoch), p.Rev, p.Objects, formatAge(p.SyncedAt, now), fresh, lag, orDash(digest))
		if wide {
			connected, resyncs, lastErr := "-", "-", "-"
			if r := p.Replication; r != nil {
				connected, resyncs, lastErr = strconv.FormatBool(r.Connected), strconv.FormatUint(r.Resyncs, 10), orDash(r.LastError)
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s", connected, resyncs, lastErr)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}
