package main

import (
	"errors"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
)

// link is what a scenario asks of the site's uplink, in each direction.
type link struct {
	Delay, Jitter time.Duration
	Loss          float64 // fraction of packets dropped, 0.01 = 1 %
	Rate          int64   // bits per second; 0: unlimited
}

var errNoShaper = errors.New("the WAN emulator (testenv.Site.Shape) is not in this tree yet")

// shape applies l to both directions of site's uplink; the zero link
// clears it.
func shape(site *testenv.Site, l link) error {
	if l == (link{}) {
		return nil
	}
	return errNoShaper
}
