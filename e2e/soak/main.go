// Command soak is `make soak`: Tether under a long run of faults (issue
// 17). It builds the e2e world (a real kube-apiserver, tether-gateway on a
// cloud host, one edge site behind NAT with tether-edge as its node's
// apiserver proxy and a stand-in kubelet), then, at once:
//
//   - relays new-connection HTTPS GETs from a cloud client to the edge's
//     kubelet through the gateway and the tunnel (--connections);
//   - makes requests as the node's kubelet through tether-edge's apiserver
//     proxy (--requests, paced evenly over --duration so that every cut
//     and kill lands during them): reads of its pods, status patches of
//     them, each with a step of its own, and reads of its Node;
//   - cuts the site's uplink and heals it, every --cut-every;
//   - kills tether-edge with SIGKILL every --kill-every and starts it again.
//
// At the end the cloud is healed, the edge's queue of status writes
// drains, and the soak checks, printing a table: every status patch the
// proxy answered 200 reached the cloud (the pod's step upstream is at
// least the last acknowledged one: nothing lost), the queue's ledger that
// the last tether-edge reports in /status (kept in its cache file across
// the kills) balances with the queue drained: every queued write applied,
// coalesced, obsolete or rejected, and how many were resent (sent again
// after a kill between their send and their dequeue, or a send without an
// answer: possibly applied twice), the gateway's and the last
// tether-edge's goroutines, open files and RSS are within 10 % (or a
// small absolute slack) of their level after warm-up, and no log of any
// process has a panic. The last line is machine-readable:
//
//	soak: conns=<ok>/<tried> requests=<ok>/<tried> cuts=<n> kills=<n> kills_in_traffic=<n> lost_writes=<n> ledger=<ok|broken|missing> enqueued=<n> resent=<n> panics=<n> gw_goroutines=<warm>/<end> gw_fds=<warm>/<end> gw_rss_mib=<warm>/<end> edge_goroutines=<warm>/<end> edge_fds=<warm>/<end> edge_rss_mib=<warm>/<end> pass=<true|false>
//
// It needs root and uses only addresses inside the namespaces it creates.
// Failures of single requests during cuts and kills are expected and
// counted; the verdict is the end state.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

type options struct {
	binDir      string
	connections int
	requests    int
	duration    time.Duration
	cutEvery    time.Duration
	killEvery   time.Duration
	pods        int
	relayConc   int
	timeout     time.Duration
	verbose     bool
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "", "`dir` holding tether-gateway and tether-edge, as make build leaves them in bin; empty builds them from this tree into a temporary directory")
	flag.IntVar(&o.connections, "connections", 100000, "relayed `connections` to have answered (one HTTPS GET each; failed ones do not count), or as many as --duration allows")
	flag.IntVar(&o.requests, "requests", 10000, "apiserver proxy `requests` to have answered as the node's kubelet (failed ones do not count), paced evenly over --duration")
	flag.DurationVar(&o.duration, "duration", 10*time.Minute, "stop making connections and requests after this `duration`, whether or not the counts are reached")
	flag.DurationVar(&o.cutEvery, "cut-every", 20*time.Second, "cut the site's uplink, and heal it, every this `duration` (0: never)")
	flag.DurationVar(&o.killEvery, "kill-every", 2*time.Minute, "kill tether-edge with SIGKILL and start it again every this `duration` (0: never)")
	flag.IntVar(&o.pods, "pods", 20, "`pods` bound to the edge node whose status the kubelet patches")
	flag.IntVar(&o.relayConc, "relay-concurrency", 4, "concurrent relay `clients`")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up after this `duration` (world setup and checks included)")
	flag.BoolVar(&o.verbose, "v", false, "log the world's setup steps")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: soak [flags]\n\nRuns Tether through cuts of the edge's uplink and kills of tether-edge while it relays connections and serves the node's kubelet, then checks that nothing was lost or leaked (needs root).\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if o.connections < 0 || o.requests < 0 || o.duration <= 0 || o.pods < 1 || o.relayConc < 1 || o.cutEvery < 0 || o.killEvery < 0 {
		fmt.Fprintln(os.Stderr, "soak: counts, --duration, --pods and --relay-concurrency must be positive")
		os.Exit(2)
	}
	world.RunBench("soak", o.verbose, o.timeout, func(ctx context.Context, s *testenv.Session) error {
		r, err := run(ctx, s, o)
		if r != nil {
			r.print(os.Stdout)
		}
		if err != nil {
			return err
		}
		if !r.pass() {
			return fmt.Errorf("the soak failed its checks (see the table)")
		}
		return nil
	})
}
