package main

import (
	"time"

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
