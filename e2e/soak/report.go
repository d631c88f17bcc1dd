package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// usage is what a process holds: goroutines, open files, resident memory.
type usage struct {
	goroutines, fds float64
	rssMiB          float64
}

// sample reads a process's usage from its /metrics (the Go and process
// collectors every Tether program registers).
func sample(ctx context.Context, h *testenv.Host, url string) (usage, error) {
	m, err := world.Get(ctx, h, url)
	if err != nil {
		return usage{}, fmt.Errorf("sample %s: %w", url, err)
	}
	return usage{
		goroutines: world.Metric(m, "go_goroutines"),
		fds:        world.Metric(m, "process_open_fds"),
		rssMiB:     world.Metric(m, "process_resident_memory_bytes") / (1 << 20),
	}, nil
}

// Slack beyond 10 %: a handful of goroutines and files belong to requests
// in flight when the sample is taken, and RSS moves by pages.
const (
	slackGoroutines = 10
	slackFDs        = 5
	slackRSSMiB     = 8
)

func within(warm, end, slack float64) bool { return end <= warm*1.1+slack }

func (u usage) within(warm usage) bool {
	return within(warm.goroutines, u.goroutines, slackGoroutines) && within(warm.fds, u.fds, slackFDs) &&
		within(warm.rssMiB, u.rssMiB, slackRSSMiB)
}

// settled samples until the usage is back within bounds of warm, for up
// to a minute (idle connections close, the Go runtime returns memory),
// and returns the last sample.
func settled(ctx context.Context, h *testenv.Host, url string, warm usage) (usage, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		u, err := sample(ctx, h, url)
		if err != nil || u.within(warm) || time.Now().After(deadline) {
			return u, err
		}
		if err := benchkit.Sleep(ctx, 2*time.Second); err != nil {
			return u, err
		}
	}
}

// report is what the soak measured.
type report struct {
	start                   time.Time
	soaked                  time.Duration
	pods                    int
	relayOK, relayTried     int64
	kubeletOK, kubeletTried int64
	cuts, kills             int
	killsInTraffic          int // kills within 5 s of a kubelet request
	ledger                  *statusapi.QueueLedger
	lost                    int
	lostDetail              []string
	panics                  int
	gwWarm, gwEnd           usage
	edgeWarm, edgeEnd       usage
}

func (r *report) pass() bool {
	return r.lost == 0 && r.panics == 0 && r.gwEnd.within(r.gwWarm) && r.edgeEnd.within(r.edgeWarm) &&
		r.relayOK > 0 && r.kubeletOK > 0 && r.ledgerOK()
}

// ledgerOK: with the queue drained, every status write tether-edge queued
// (across the kills: the ledger is in its cache file) is accounted for,
// applied, coalesced, obsolete or rejected, and none is left marked as
// being sent.
func (r *report) ledgerOK() bool {
	l := r.ledger
	return l != nil && l.Balanced && l.Queued == 0 && l.Unconfirmed == 0 &&
		l.Enqueued == l.Coalesced+l.Applied+l.Obsolete+l.Rejected
}

func (r *report) ledgerVerdict() string {
	switch {
	case r.ledger == nil:
		return "missing"
	case r.ledgerOK():
		return "ok"
	}
	return "broken"
}

func (r *report) print(out io.Writer) {
	fmt.Fprintf(out, "\nsoak: %v of faults (load average %s)\n\n", r.soaked.Round(time.Second), world.LoadAvg())
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tok\ttried\t")
	fmt.Fprintf(tw, "relayed connections\t%d\t%d\t\n", r.relayOK, r.relayTried)
	fmt.Fprintf(tw, "kubelet requests via tether-edge\t%d\t%d\t\n", r.kubeletOK, r.kubeletTried)
	tw.Flush()
	fmt.Fprintf(out, "\nuplink cuts %d, tether-edge kills (SIGKILL) %d (%d within 5 s of a kubelet request); status patches lost: %d of %d pods; panics in logs: %d\n",
		r.cuts, r.kills, r.killsInTraffic, r.lost, r.pods, r.panics)
	for _, d := range r.lostDetail {
		fmt.Fprintf(out, "  lost: %s\n", d)
	}
	if l := r.ledger; l != nil {
		fmt.Fprintf(out, "\ntether-edge's queue ledger (its cache file, across the kills), the queue drained: %s\n", r.ledgerVerdict())
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, row := range []struct {
			name string
			v    uint64
		}{{"enqueued", l.Enqueued}, {"coalesced (a later patch took its place)", l.Coalesced}, {"applied", l.Applied},
			{"obsolete", l.Obsolete}, {"rejected (4xx)", l.Rejected}, {"still queued", uint64(l.Queued)},
			{"resent (an earlier send may have applied it)", l.Resent}, {"marked as being sent", uint64(l.Unconfirmed)}} {
			fmt.Fprintf(tw, "%s\t%d\t\n", row.name, row.v)
		}
		tw.Flush()
		fmt.Fprintln(out, "(enqueued = coalesced + applied + obsolete + rejected + still queued; resent writes were applied at least once, possibly twice: a status merge patch that sets values is the same applied twice)")
	} else {
		fmt.Fprintln(out, "\ntether-edge's queue ledger: not read")
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tafter warm-up\tat the end\tbound\t\t")
	row := func(name string, warm, end, slack float64) {
		verdict := "ok"
		if !within(warm, end, slack) {
			verdict = "OVER"
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t\n", name, warm, end, warm*1.1+slack, verdict)
	}
	row("tether-gateway goroutines", r.gwWarm.goroutines, r.gwEnd.goroutines, slackGoroutines)
	row("tether-gateway open files", r.gwWarm.fds, r.gwEnd.fds, slackFDs)
	row("tether-gateway RSS MiB", r.gwWarm.rssMiB, r.gwEnd.rssMiB, slackRSSMiB)
	row("tether-edge goroutines", r.edgeWarm.goroutines, r.edgeEnd.goroutines, slackGoroutines)
	row("tether-edge open files", r.edgeWarm.fds, r.edgeEnd.fds, slackFDs)
	row("tether-edge RSS MiB", r.edgeWarm.rssMiB, r.edgeEnd.rssMiB, slackRSSMiB)
	tw.Flush()
	fmt.Fprintln(out, "\n(tether-edge at the end is the process started after the last kill; bounds are 110 % of the warm level plus a small slack)")
	var enqueued, resent uint64
	if r.ledger != nil {
		enqueued, resent = r.ledger.Enqueued, r.ledger.Resent
	}
	fmt.Fprintf(out, "soak: conns=%d/%d requests=%d/%d cuts=%d kills=%d kills_in_traffic=%d lost_writes=%d ledger=%s enqueued=%d resent=%d panics=%d "+
		"gw_goroutines=%.0f/%.0f gw_fds=%.0f/%.0f gw_rss_mib=%.1f/%.1f edge_goroutines=%.0f/%.0f edge_fds=%.0f/%.0f edge_rss_mib=%.1f/%.1f pass=%t\n",
		r.relayOK, r.relayTried, r.kubeletOK, r.kubeletTried, r.cuts, r.kills, r.killsInTraffic, r.lost, r.ledgerVerdict(), enqueued, resent, r.panics,
		r.gwWarm.goroutines, r.gwEnd.goroutines, r.gwWarm.fds, r.gwEnd.fds, r.gwWarm.rssMiB, r.gwEnd.rssMiB,
		r.edgeWarm.goroutines, r.edgeEnd.goroutines, r.edgeWarm.fds, r.edgeEnd.fds, r.edgeWarm.rssMiB, r.edgeEnd.rssMiB, r.pass())
}
