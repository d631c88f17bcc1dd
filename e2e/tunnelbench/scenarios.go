package main

// The WAN part of the bench (issue 19): the same world with the site's
// uplink shaped as an edge link is (delay, loss, rate), Tether against
// Konnectivity in each scenario, then a link cut and a NAT rebinding.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// scenario is one state of the site's uplink, or one event on it.
type scenario struct {
	name, desc string
	link       link
	event      bool // cut or nat: not a link shape
}

var allScenarios = []scenario{
	{name: "clean", desc: "no shaping (the namespaces' veth links)"},
	{name: "rtt30", desc: "30 ms round trip: 15 ms each way on the site's uplink", link: link{Delay: 15 * time.Millisecond}},
	{name: "rtt80-loss1", desc: "80 ms round trip, 1 % random loss in each direction", link: link{Delay: 40 * time.Millisecond, Loss: 0.01}},
	{name: "rtt80-loss3", desc: "80 ms round trip, 3 % random loss in each direction", link: link{Delay: 40 * time.Millisecond, Loss: 0.03}},
	{name: "rate20-rtt80", desc: "20 Mbit/s in each direction, 80 ms round trip", link: link{Delay: 40 * time.Millisecond, Rate: 20_000_000}},
	{name: "cut", desc: "link cut and heal: the uplink down 30 s (heal time), then 3 s with a request in flight", event: true},
	{name: "nat", desc: "NAT rebinding: the site router's conntrack flushed and its masquerade port range changed during a download", event: true},
}

func scenarioNames() string {
	var n []string
	for _, s := range allScenarios {
		n = append(n, s.name)
	}
	return strings.Join(n, ",")
}

// parseScenarios picks the scenarios named in list, in their canonical
// order.
func parseScenarios(list string) ([]scenario, error) {
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.ContainsFunc(allScenarios, func(s scenario) bool { return s.name == n }) {
			return nil, fmt.Errorf("unknown scenario %q (known: %s)", n, scenarioNames())
		}
		want[n] = true
	}
	var out []scenario
	for _, s := range allScenarios {
		if want[s.name] {
			out = append(out, s)
		}
	}
	return out, nil
}

// figures are one mode's numbers in one scenario; NaN-free: absent ones
// are flagged by the has* fields.
type figures struct {
	hasHOL            bool
	holP50, holP99    float64 // ms, failed requests counted at their duration
	holN, holErr      int
	holBulk           float64 // MB/s of the bulk connection meanwhile
	hasBulk           bool
	bulk, cpuNsB      float64
	hasRate           bool
	seqRate, seqP99   float64
	concRate, concP99 float64
	seqErr, concErr   int
	firstErr          error
}

// scenResult is one scenario's outcome.
type scenResult struct {
	sc      scenario
	skipped string
	rttMs   float64 // the tunnel's smoothed RTT from the gateway's /status
	fig     map[string]*figures
}

func (r *scenResult) of(mode string) *figures {
	if r.fig[mode] == nil {
		r.fig[mode] = &figures{}
	}
	return r.fig[mode]
}

// wanBench runs the scenarios.
type wanBench struct {
	*bench
	w          *world.World
	gw         *testenv.Host
	edge       *world.Edge
	tun, konn  mode // konn.name is empty without Konnectivity
	path       mode // bare quic-go over the tunnel's path
	k          *konnectivity
	rate, bulk []mode
	d          time.Duration
}

// holWarm is how long the bulk connection runs before the head-of-line
// clients start.
const holWarm = time.Second

// hol measures head-of-line isolation through m: one connection reads
// base/bytes as fast as it can while o.holClients clients make new
// connection GETs for wb.d.
func (wb *wanBench) hol(ctx context.Context, m mode, f *figures) error {
	c := wb.clientOf(m)
	var prog atomic.Int64
	stop := make(chan time.Time)
	type out struct {
		r   bulkResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := c.download(ctx, m.url, 1<<50, 0, stop, &prog)
		done <- out{r, err}
	}()
	// Wait for the first bytes, then let the bulk connection fill the path.
	deadline := time.Now().Add(30 * time.Second)
	for prog.Load() == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case o := <-done:
			return fmt.Errorf("%s: head-of-line bulk connection: %v", m.name, o.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if prog.Load() == 0 {
		close(stop)
		<-done
		return fmt.Errorf("%s: head-of-line bulk connection: no byte within 30 s", m.name)
	}
	time.Sleep(holWarm)
	before := prog.Load()
	t0 := time.Now()
	r, failed := c.timed(ctx, m.url, wb.o.holClients, wb.d)
	during := prog.Load() - before
	el := time.Since(t0)
	close(stop)
	o := <-done
	if o.err != nil {
		return fmt.Errorf("%s: head-of-line bulk connection: %w", m.name, o.err)
	}
	all := slices.Concat(r.lat, failed)
	slices.Sort(all)
	p := rateResult{lat: all}
	f.hasHOL = true
	f.holP50, f.holP99 = ms(p.pct(50)), ms(p.pct(99))
	f.holN, f.holErr = len(all), r.errs
	f.holBulk = float64(during) / 1e6 / el.Seconds()
	if r.firstErr != nil && f.firstErr == nil {
		f.firstErr = r.firstErr
	}
	return ctx.Err()
}

// runShaped measures one shaped scenario: head-of-line isolation, bulk
// with CPU per byte, and new connections, all time-bounded.
func (wb *wanBench) runShaped(ctx context.Context, sr *scenResult, run int) error {
	// Head-of-line: Tether, then Konnectivity (reversed every other
	// scenario).
	hol := []mode{wb.tun}
	if wb.konn.name != "" {
		hol = append(hol, wb.konn)
	}
	if run%2 == 1 {
		slices.Reverse(hol)
	}
	for _, m := range hol {
		phase("%s: head-of-line, %s: one bulk connection and %d clients making new connections for %v", sr.sc.name, m.name, wb.o.holClients, wb.d)
		if err := wb.hol(ctx, m, sr.of(m.name)); err != nil {
			return err
		}
	}
	if sr.sc.name == "clean" {
		return nil // the rest comes from the full measurement
	}
	bulk := slices.Clone(wb.bulk)
	if run%2 == 1 {
		slices.Reverse(bulk)
	}
	for _, m := range bulk {
		phase("%s: bulk, %s: one connection for %v", sr.sc.name, m.name, wb.d)
		before := cpu(m.pids)
		r, err := wb.clientOf(m).bulkFor(ctx, m.url, wb.d)
		use := cpu(m.pids).sub(before)
		if err != nil {
			return fmt.Errorf("%s: bulk: %w", m.name, err)
		}
		f := sr.of(m.name)
		f.hasBulk = true
		f.bulk = r.mbps()
		f.cpuNsB = float64(use.tether) / float64(max(r.bytes, 1))
	}
	if wb.path.bare != nil {
		// quic-go alone over the same shaped path: what the link and
		// quic-go allow, without the relay and TCP.
		phase("%s: bulk, %s: one quic-go stream for %v", sr.sc.name, wb.path.name, wb.d)
		r, err := wb.path.bare.bulkFor(ctx, wb.d)
		if err != nil {
			return fmt.Errorf("%s: bulk: %w", wb.path.name, err)
		}
		f := sr.of(wb.path.name)
		f.hasBulk = true
		f.bulk = r.mbps()
	}
	// New connections, the modes taking turns: half of wb.d sequential,
	// half concurrent, per mode.
	per := wb.d / 2
	turn := max(500*time.Millisecond, (per / 3).Round(10*time.Millisecond))
	for _, k := range []struct {
		name    string
		clients int
	}{{"seq", 1}, {fmt.Sprintf("c%d", wb.o.conc), wb.o.conc}} {
		phase("%s: new connections %s, %v per mode in turns of %v", sr.sc.name, k.name, per, turn)
		acc := map[string]*rateResult{}
		for _, m := range wb.rate {
			acc[m.name] = &rateResult{}
		}
		for done := time.Duration(0); done < per; done += turn {
			for _, m := range wb.rate {
				r, _ := wb.clientOf(m).timed(ctx, m.url, k.clients, turn)
				acc[m.name].add(r)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		for _, m := range wb.rate {
			a := acc[m.name]
			slices.Sort(a.lat)
			f := sr.of(m.name)
			f.hasRate = true
			if k.clients == 1 {
				f.seqRate, f.seqP99, f.seqErr = a.rate(), ms(a.pct(99)), a.errs
			} else {
				f.concRate, f.concP99, f.concErr = a.rate(), ms(a.pct(99)), a.errs
			}
			if a.firstErr != nil && f.firstErr == nil {
				f.firstErr = a.firstErr
			}
		}
	}
	return nil
}

// fromMeasure fills the clean scenario's bulk and new-connection figures
// from the full measurement's medians.
func fromMeasure(sr *scenResult, o options, modes []mode, res map[string][]result) {
	cols, cpuCols := columns(o), cpuColumns(o)
	for _, m := range modes {
		rs := res[m.name]
		if len(rs) == 0 {
			continue
		}
		f := sr.of(m.name)
		f.hasBulk = true
		f.bulk = median(rs, cols[6].f)
		if m.pids != nil {
			f.cpuNsB = median(rs, cpuCols[4].f)
		} else {
			f.cpuNsB = median(rs, cpuCols[5].f) // bare quic-go: both ends in this process
		}
		if !m.bulkOnly {
			f.hasRate = true
			f.seqRate, f.seqP99 = median(rs, cols[0].f), median(rs, cols[2].f)
			f.concRate, f.concP99 = median(rs, cols[3].f), median(rs, cols[5].f)
			for _, r := range rs {
				f.seqErr += r.seq.errs
				f.concErr += r.conc.errs
			}
		}
	}
}

// tunnelStatus is the tested edge's entry in the gateway's /status, if
// the edge is connected.
func (wb *wanBench) tunnelStatus(ctx context.Context) (statusapi.ConnectedEdge, bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := world.Get(ctx, wb.gw, world.GatewayAdmin(wb.gw, "/status"))
	if err != nil {
		return statusapi.ConnectedEdge{}, false
	}
	var st statusapi.Gateway
	if json.Unmarshal([]byte(out), &st) != nil {
		return statusapi.ConnectedEdge{}, false
	}
	for _, e := range st.Edges {
		if e.Node == wb.edge.Name {
			return e, true
		}
	}
	return statusapi.ConnectedEdge{}, false
}

// diagnose says what the tunnel and the shaped path look like, for an
// error message.
func (wb *wanBench) diagnose(ctx context.Context) string {
	var b strings.Builder
	if st, ok := wb.tunnelStatus(ctx); ok {
		fmt.Fprintf(&b, "gateway /status: edge %s connected since %s from %s, RTT %.1f ms, %d streams\n",
			st.Node, st.ConnectedSince.Format(time.RFC3339), st.Remote, st.RTTMillis, st.Streams)
	} else {
		fmt.Fprintf(&b, "gateway /status: edge %s not connected\n", wb.edge.Name)
	}
	// A TCP handshake across the shaped uplink, to the gateway's admin port.
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t0 := time.Now()
	c, err := wb.edge.Host.DialContext(dctx, "tcp", fmt.Sprintf("%s:%d", wb.gw.Addr, world.AdminPort))
	if err != nil {
		fmt.Fprintf(&b, "TCP connect from %s to %s: %v\n", wb.edge.Name, wb.gw.Label, err)
	} else {
		c.Close()
		fmt.Fprintf(&b, "TCP connect from %s to %s: %.1f ms\n", wb.edge.Name, wb.gw.Label, ms(time.Since(t0)))
	}
	return b.String()
}

// waitWorking waits until a request through every rate mode succeeds.
func (wb *wanBench) waitWorking(ctx context.Context, timeout time.Duration) error {
	for _, m := range wb.rate {
		if _, err := wb.working(ctx, m, timeout); err != nil {
			return err
		}
	}
	return nil
}

// working retries a request through m until one succeeds and returns
// how long that took.
func (wb *wanBench) working(ctx context.Context, m mode, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		err := wb.clientOf(m).get(rctx, m.url+"/healthz")
		rcancel()
		if err == nil {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%s: no request succeeded within %v: %v", m.name, timeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// afterEvent waits until every rate mode works again after a cut or a
// rebinding. The tunnel and direct must; Konnectivity, if it does not,
// is left out of what follows, and the returned note says so.
func (wb *wanBench) afterEvent(ctx context.Context) (map[string]string, error) {
	notes := map[string]string{}
	for _, m := range slices.Clone(wb.rate) {
		wait := healWait
		if m.name == konnMode {
			wait = konnWait
		}
		d, err := wb.working(ctx, m, wait)
		switch {
		case err == nil:
			notes[m.name] = fmt.Sprintf("working %.2f s later", d.Seconds())
		case m.name == konnMode && ctx.Err() == nil:
			notes[m.name] = fmt.Sprintf("not working again within %v (%v); left out of what follows", wait, err)
			if wb.k != nil {
				notes[m.name] += "\n" + indent(wb.k.logTails(4), "      ")
			}
			wb.dropKonnectivity()
		default:
			return nil, err
		}
	}
	return notes, nil
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}

func (wb *wanBench) dropKonnectivity() {
	not := func(m mode) bool { return m.name == konnMode }
	wb.rate = slices.DeleteFunc(wb.rate, not)
	wb.bulk = slices.DeleteFunc(wb.bulk, not)
	wb.konn = mode{}
}

// cutResult is the outcome of the link cut scenario.
type cutResult struct {
	long       time.Duration
	first      map[string]time.Duration // heal to first successful request; <0: none
	registered time.Duration            // heal to the tunnel registered again; <0: never
	dropped    bool                     // the gateway dropped the edge during the cut
	short      map[string]string        // mode: what the 3 s cut did to a request in flight
	shortDur   time.Duration
	after      map[string]string // mode: working again after the 30 s cut?
}

// Bounds of the cut scenario.
const (
	longCut      = 30 * time.Second
	shortCut     = 3 * time.Second
	healWait     = 60 * time.Second // how long after the heal we wait for things to work
	konnWait     = 30 * time.Second // the same for Konnectivity, which is then left out
	probeEvery   = 250 * time.Millisecond
	probeTimeout = 10 * time.Second
)

// runCut cuts the site's uplink for 30 s and measures, from the heal, the
// first successful new-connection request through each mode and the
// tunnel's registration at the gateway; then cuts it for 3 s while a
// request is in flight on an open connection.
func (wb *wanBench) runCut(ctx context.Context) (*cutResult, error) {
	cr := &cutResult{long: longCut, shortDur: shortCut, first: map[string]time.Duration{}, short: map[string]string{}, registered: -1}
	modes := []mode{wb.tun}
	if wb.konn.name != "" {
		modes = append(modes, wb.konn)
	}
	before, ok := wb.tunnelStatus(ctx)
	if !ok {
		return nil, fmt.Errorf("cut: the edge is not connected to the gateway before the cut")
	}
	site := wb.edge.Site

	// Probes start with the cut, as clients keep trying during an
	// outage: a request every 250 ms through each mode, each given 10 s.
	var heal atomic.Pointer[time.Time]
	pctx, pcancel := context.WithTimeout(ctx, longCut+healWait)
	defer pcancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range modes {
		cr.first[m.name] = -1
		wg.Add(1)
		go func() {
			defer wg.Done()
			var inflight sync.WaitGroup
			defer inflight.Wait()
			got := make(chan struct{})
			var once sync.Once
			mctx, mcancel := context.WithCancel(pctx)
			defer mcancel()
			tick := time.NewTicker(probeEvery)
			defer tick.Stop()
			for {
				select {
				case <-pctx.Done():
					return
				case <-got:
					mcancel()
					return
				case <-tick.C:
				}
				inflight.Add(1)
				go func() {
					defer inflight.Done()
					rctx, cancel := context.WithTimeout(mctx, probeTimeout)
					defer cancel()
					err := wb.clientOf(m).get(rctx, m.url+"/healthz")
					h := heal.Load()
					if err != nil || h == nil {
						return
					}
					d := time.Since(*h)
					mu.Lock()
					if cr.first[m.name] < 0 || d < cr.first[m.name] {
						cr.first[m.name] = d
					}
					mu.Unlock()
					once.Do(func() { close(got) })
				}()
			}
		}()
	}
	// The gateway's view, every 100 ms.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for pctx.Err() == nil {
			st, ok := wb.tunnelStatus(pctx)
			h := heal.Load()
			switch {
			case !ok:
				mu.Lock()
				cr.dropped = true
				mu.Unlock()
			case h != nil && (cr.dropped || !st.ConnectedSince.Equal(before.ConnectedSince)):
				mu.Lock()
				cr.dropped = true
				cr.registered = time.Since(*h)
				mu.Unlock()
				return
			case h != nil:
				return // never dropped
			}
			select {
			case <-pctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	phase("cut: the site's uplink is down for %v", longCut)
	site.Cut()
	select {
	case <-ctx.Done():
		site.Heal()
		return nil, ctx.Err()
	case <-time.After(longCut):
	}
	now := time.Now()
	heal.Store(&now)
	site.Heal()
	phase("cut: healed; waiting (up to %v) for requests and the tunnel", healWait)
	wg.Wait()
	if wb.konn.name != "" && cr.first[konnMode] < 0 {
		// It had the whole probing window after the heal already.
		cr.after = map[string]string{konnMode: fmt.Sprintf("no request succeeded within %v of the heal; left out of what follows\n%s",
			healWait, indent(wb.k.logTails(4), "      "))}
		wb.dropKonnectivity()
	}
	after, err := wb.afterEvent(ctx)
	if err != nil {
		return nil, fmt.Errorf("cut: after the heal: %w", err)
	}
	for m, a := range after {
		if cr.after == nil {
			cr.after = map[string]string{}
		}
		cr.after[m] = a
	}
	modes = slices.DeleteFunc(modes, func(m mode) bool { return m.name == konnMode && wb.konn.name == "" })

	// A request in flight on an open connection across a 3 s cut.
	phase("cut: %v with a request in flight on an open connection", shortCut)
	before, _ = wb.tunnelStatus(ctx)
	type inflight struct {
		client *http.Client
		done   chan error
		at     time.Time // when it was answered
	}
	fl := map[string]*inflight{}
	for _, m := range modes {
		c := wb.clientOf(m)
		hc := &http.Client{Transport: &http.Transport{DialContext: c.dial, TLSClientConfig: c.tlsConfig, MaxConnsPerHost: 1}}
		defer hc.CloseIdleConnections()
		if err := getOn(ctx, hc, m.url+"/healthz", nil); err != nil {
			return nil, fmt.Errorf("cut: %s: open a connection: %w", m.name, err)
		}
		fl[m.name] = &inflight{client: hc, done: make(chan error, 1)}
	}
	site.Cut()
	for _, m := range modes {
		f := fl[m.name]
		go func() {
			rctx, cancel := context.WithTimeout(ctx, shortCut+healWait)
			defer cancel()
			reused := false
			err := getOn(rctx, f.client, m.url+"/bytes?n=65536", &reused)
			if err == nil && !reused {
				err = fmt.Errorf("answered on a new connection: the open one was lost")
			}
			f.at = time.Now()
			f.done <- err
		}()
	}
	select {
	case <-ctx.Done():
		site.Heal()
		return nil, ctx.Err()
	case <-time.After(shortCut):
	}
	healed := time.Now()
	site.Heal()
	for _, m := range modes {
		if err := <-fl[m.name].done; err != nil {
			cr.short[m.name] = "lost: " + err.Error()
		} else {
			cr.short[m.name] = fmt.Sprintf("survived (answered %.2f s after the heal)", fl[m.name].at.Sub(healed).Seconds())
		}
	}
	if after, ok := wb.tunnelStatus(ctx); ok && after.ConnectedSince.Equal(before.ConnectedSince) {
		cr.short[wb.tun.name] += "; same QUIC connection"
	} else {
		cr.short[wb.tun.name] += "; the tunnel reconnected"
	}
	return cr, nil
}

// getOn GETs url with hc, reads the body, and reports whether the
// connection was reused.
func getOn(ctx context.Context, hc *http.Client, url string, reused *bool) error {
	if reused != nil {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { *reused = i.Reused }})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := drain(resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// natResult is the outcome of the NAT rebinding scenario.
type natResult struct {
	verdict            string // survived or reconnected
	why                string
	remoteBefore       string
	remoteAfter        string
	downloads          map[string]string
	mapping            string // the site router's NAT mapping of the tunnel afterwards
	after              map[string]string
	reregistered       time.Duration
	bytes, rate        int64
	rebindAfter        time.Duration
	newPortLo, newPort int
}

// Bounds of the NAT scenario.
const (
	natBytes = 64 << 20
	natRate  = 16 << 20 // bytes/s the client reads: the download lasts about 4 s
	natAfter = time.Second
	// Below Linux's ephemeral ports (32768-60999): masquerade keeps a
	// source port that is already in its range, which would change nothing.
	natPortLo  = 20000
	natPortHi  = 29999
	natTimeout = 60 * time.Second
)

// runNAT downloads through each mode while the site router forgets its
// NAT mappings (conntrack flushed) and masquerades from another port
// range, so the edge's packets reach the gateway from a new source port.
func (wb *wanBench) runNAT(ctx context.Context) (*natResult, error) {
	nr := &natResult{downloads: map[string]string{}, bytes: natBytes, rate: natRate, rebindAfter: natAfter, newPortLo: natPortLo, newPort: natPortHi}
	modes := []mode{wb.tun}
	if wb.konn.name != "" {
		modes = append(modes, wb.konn)
	}
	before, ok := wb.tunnelStatus(ctx)
	if !ok {
		return nil, fmt.Errorf("nat: the edge is not connected to the gateway")
	}
	nr.remoteBefore = before.Remote
	router := wb.edge.Site.Router()
	phase("nat: %d MiB downloads at %d MiB/s; after %v the site router's conntrack is flushed and it masquerades from ports %d-%d",
		natBytes>>20, natRate>>20, natAfter, natPortLo, natPortHi)
	errs := map[string]chan error{}
	for _, m := range modes {
		ch := make(chan error, 1)
		errs[m.name] = ch
		go func() {
			var prog atomic.Int64
			dctx, cancel := context.WithTimeout(ctx, natTimeout)
			defer cancel()
			_, err := wb.clientOf(m).download(dctx, m.url, natBytes, natRate, nil, &prog)
			ch <- err
		}()
	}
	time.Sleep(natAfter)
	if err := masquerade(ctx, router, fmt.Sprintf("%d-%d", natPortLo, natPortHi)); err != nil {
		return nil, err
	}
	rebound := time.Now()
	if out, err := router.Command(ctx, "conntrack", "-F").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nat: conntrack -F on the site router: %v: %s", err, out)
	}
	for _, m := range modes {
		if err := <-errs[m.name]; err != nil {
			nr.downloads[m.name] = "failed: " + err.Error()
		} else {
			nr.downloads[m.name] = "completed"
		}
	}
	nr.mapping = tunnelMapping(ctx, router)
	after, ok := wb.tunnelStatus(ctx)
	same := ok && after.ConnectedSince.Equal(before.ConnectedSince)
	nr.remoteAfter = after.Remote
	switch {
	case nr.downloads[wb.tun.name] == "completed" && same:
		nr.verdict = "survived"
		nr.why = "same QUIC connection, no reconnect"
	default:
		nr.verdict = "reconnected"
		nr.why = "tunnel download " + nr.downloads[wb.tun.name]
		// How long until the edge is registered again.
		deadline := time.Now().Add(natTimeout)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if st, ok := wb.tunnelStatus(ctx); ok && !st.ConnectedSince.Equal(before.ConnectedSince) {
				nr.reregistered = time.Since(rebound)
				nr.remoteAfter = st.Remote
				nr.why += fmt.Sprintf("; a new QUIC connection from %s registered %.1f s after the rebinding", st.Remote, nr.reregistered.Seconds())
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := masquerade(ctx, router, ""); err != nil {
		return nil, err
	}
	var err error
	nr.after, err = wb.afterEvent(ctx)
	return nr, err
}

// tunnelMapping is the public address the site router's conntrack maps
// the tunnel's UDP flow to, as "addr:port", or what went wrong.
func tunnelMapping(ctx context.Context, router *testenv.Host) string {
	out, err := router.Command(ctx, "conntrack", "-L", "-p", "udp", "--orig-port-dst", fmt.Sprint(world.TunnelPort)).Output()
	if err != nil {
		return fmt.Sprintf("unknown (conntrack -L: %v)", err)
	}
	var maps []string
	for _, line := range strings.Split(string(out), "\n") {
		// udp 17 119 src=LAN dst=GW sport=S dport=10262 src=GW dst=PUBLIC sport=10262 dport=PUBLICPORT ...
		var dst, dport []string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "dst="); ok {
				dst = append(dst, v)
			}
			if v, ok := strings.CutPrefix(f, "dport="); ok {
				dport = append(dport, v)
			}
		}
		if len(dst) == 2 && len(dport) == 2 {
			maps = append(maps, dst[1]+":"+dport[1])
		}
	}
	if len(maps) == 0 {
		return "none"
	}
	return strings.Join(maps, ", ")
}

// masquerade replaces the site router's masquerade rule (siteRules in
// internal/testenv) with one that maps TCP and UDP source ports into
// ports ("lo-hi"), or, with ports empty, puts the original back.
func masquerade(ctx context.Context, router *testenv.Host, ports string) error {
	rules := "flush chain ip tt_site postrouting\n"
	if ports != "" {
		rules += "add rule ip tt_site postrouting oifname \"wan0\" meta l4proto { tcp, udp } masquerade to :" + ports + "\n"
	}
	rules += "add rule ip tt_site postrouting oifname \"wan0\" masquerade\n"
	cmd := router.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nat: nft on the site router: %v: %s", err, out)
	}
	return nil
}

// phase says what the bench is doing now.
func phase(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
