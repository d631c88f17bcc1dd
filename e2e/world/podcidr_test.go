package world

import "testing"

// TestEdgePodCIDR: every edge of a world gets its own /24 inside
// EdgePodCIDRs, whatever LAN its site reuses.
func TestEdgePodCIDR(t *testing.T) {
	seen := map[string]int{}
	for i := range 255 {
		p := EdgePodCIDR(i)
		if p.Bits() != 24 || !EdgePodCIDRs.Contains(p.Addr()) || p != p.Masked() {
			t.Errorf("EdgePodCIDR(%d) = %s, want a /24 inside %s", i, p, EdgePodCIDRs)
		}
		if j, ok := seen[p.String()]; ok {
			t.Errorf("EdgePodCIDR(%d) = EdgePodCIDR(%d) = %s", i, j, p)
		}
		seen[p.String()] = i
	}
	if got := EdgePodCIDR(0).String(); got != "10.244.1.0/24" {
		t.Errorf("EdgePodCIDR(0) = %s, want 10.244.1.0/24", got)
	}
}
