package openyurt

import "testing"

func TestIsPoolKey(t *testing.T) {
	for keys, want := range map[string]bool{
		"openyurt.io/nodepool":                         true,
		"kubernetes.io/zone":                           true,
		"kubernetes.io/hostname, openyurt.io/nodepool": true,
		"kubernetes.io/hostname":                       false,
		"kubernetes.io/hostname,*":                     false,
		"":                                             false,
		" openyurt.io/nodepool ":                       true,
		"openyurt.io/nodepool-other,kubernetes.io/zones": false,
	} {
		if got := IsPoolKey(keys); got != want {
			t.Errorf("IsPoolKey(%q) = %v, want %v", keys, got, want)
		}
	}
}
