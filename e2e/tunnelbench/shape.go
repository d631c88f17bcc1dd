package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// link is what a scenario asks of the site's uplink, in each direction.
type link struct {
	Delay, Jitter time.Duration
	Loss          float64 // fraction of packets dropped, 0.01 = 1 %
	Rate          int64   // bits per second; 0: unlimited
}

// shape applies l to both directions of site's uplink with testenv's WAN
// emulator; the zero link clears it.
func shape(site *testenv.Site, l link) error {
	return site.Shape(testenv.Link{Delay: l.Delay, Jitter: l.Jitter, Loss: l.Loss, Rate: l.Rate})
}

// setTCPCongestionControl sets net.ipv4.tcp_congestion_control on the
// gateway and edge hosts to name (empty leaves it) and returns the one in
// force on the first edge host. Konnectivity's traffic crosses the WAN as
// TCP between those hosts, so its bulk throughput under loss depends on
// this choice far more than on Konnectivity itself: a loss-based
// controller (cubic, reno) backs off at every random loss as quic-go's
// Reno does, a model-based one (bbr) does not. New namespaces inherit
// the setting of the machine's own, which need not be Linux's default.
func setTCPCongestionControl(name string, gateways []*testenv.Host, edges []*world.Edge) (string, error) {
	hosts := slices.Clone(gateways)
	for _, e := range edges {
		hosts = append(hosts, e.Host)
	}
	if name != "" {
		for _, h := range hosts {
			if err := h.Sysctl("net.ipv4.tcp_congestion_control", name); err != nil {
				// A namespace may only choose a controller in the
				// machine-wide net.ipv4.tcp_allowed_congestion_control,
				// which the bench does not change.
				return "", fmt.Errorf("--tcp-cc %s on %s (a namespace may choose only what net.ipv4.tcp_allowed_congestion_control lists): %w", name, h.Label, err)
			}
		}
	}
	out, err := hosts[len(hosts)-1].Command(context.Background(), "sysctl", "-n", "net.ipv4.tcp_congestion_control").Output()
	if err != nil {
		return "", fmt.Errorf("read the TCP congestion control: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
