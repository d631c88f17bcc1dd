package main

import (
	"net/netip"
	"strings"
	"testing"
)

// TestScrapeLayout: every pod gets an address of its own inside its edge's
// pod range, the ranges are distinct /24s inside podRanges, and pods
// spread over the whole fleet.
func TestScrapeLayout(t *testing.T) {
	if got := podRange(1).String(); got != "10.128.1.0/24" {
		t.Errorf("podRange(1) = %s, want 10.128.1.0/24", got)
	}
	last := podRange(maxPodEdges)
	if !podRanges.Contains(last.Addr()) || last == podRange(maxPodEdges-1) || last.Bits() != 24 {
		t.Errorf("podRange(%d) = %s: want a /24 of its own inside %s", maxPodEdges, last, podRanges)
	}
	for _, c := range []struct{ edges, pods, wantEdges int }{
		{10000, 1000, 1000},
		{1000, 1000, 1000},
		{3, 7, 3},
		{2, 2 * maxPodsPerEdge, 2},
	} {
		layout := scrapeLayout(c.edges, c.pods)
		if len(layout) != c.pods {
			t.Fatalf("scrapeLayout(%d, %d): %d pods", c.edges, c.pods, len(layout))
		}
		ips := map[netip.Addr]bool{}
		edges := map[int]bool{}
		for k, p := range layout {
			r := podRange(p.edge)
			if p.k != k || p.edge < 1 || p.edge > c.edges || !r.Contains(p.ip) || p.ip == r.Addr() || p.ip.As4()[3] == 255 || ips[p.ip] {
				t.Errorf("scrapeLayout(%d, %d)[%d] = %+v: want edge 1..%d, an address of its own in %s (not .0 or .255)", c.edges, c.pods, k, p, c.edges, r)
			}
			ips[p.ip], edges[p.edge] = true, true
		}
		if len(edges) != c.wantEdges {
			t.Errorf("scrapeLayout(%d, %d): pods on %d edges, want %d", c.edges, c.pods, len(edges), c.wantEdges)
		}
	}
	// Spread: the last of 1,000 pods over 10,000 edges is near the end.
	if l := scrapeLayout(10000, 1000); l[999].edge < 9990 {
		t.Errorf("pod 999 of 1,000 on 10,000 edges is on edge %d, want the fleet's last tenth", l[999].edge)
	}
}

// TestEdgePods: each edge's pod source holds its own range and exactly
// its pods, running, declaring scrapePort.
func TestEdgePods(t *testing.T) {
	srcs := edgePods(20, 30)
	n := 0
	for i, s := range srcs {
		ranges, ok := s.PodRanges()
		if !ok || len(ranges) != 1 || ranges[0] != podRange(i+1) {
			t.Errorf("edge %d: ranges %v, %v; want [%s]", i+1, ranges, ok, podRange(i+1))
		}
		for ip, pods := range s.byIP {
			n++
			got, synced := s.PodsByIP(ip)
			if !synced || len(got) != 1 || got[0] != pods[0] {
				t.Fatalf("edge %d: PodsByIP(%s) = %v, %v", i+1, ip, got, synced)
			}
			p := got[0]
			if p.Spec.NodeName != edgeName(i+1) || p.Status.PodIP != ip.String() || p.Status.Phase != "Running" ||
				len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Ports[0].ContainerPort != scrapePort {
				t.Errorf("edge %d: pod at %s: %+v", i+1, ip, p)
			}
		}
	}
	if n != 30 {
		t.Errorf("%d pods in the sources, want 30", n)
	}
	other := scrapeLayout(20, 30)[1] // on edge 2
	if got, _ := srcs[0].PodsByIP(other.ip); other.edge != 2 || len(got) != 0 {
		t.Errorf("edge 1 knows %v at %s, a pod of edge %d", got, other.ip, other.edge)
	}
}

// TestScrapeSummary: a phase that stopped before its window says -1, not
// NaN.
func TestScrapeSummary(t *testing.T) {
	got := scrapeSummary(options{edges: 10}, &scrapeResult{pods: 5, edges: 5})
	if strings.Contains(got, "NaN") || !strings.Contains(got, "scrape_p99_ms=-1.00") || !strings.Contains(got, "gateway_cpu_ms_per_scrape=-1.000") {
		t.Errorf("summary of an unmeasured phase: %s", got)
	}
}
