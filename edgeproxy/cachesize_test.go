package edgeproxy

import (
	"strings"
	"testing"

	"github.com/tether-edge/tether/edgeproxy/cache"
)

// --cache-max-size: the default is the cache's, quantities parse, and a
// bound too small for a full queue, or not a size, is refused saying so.
func TestCacheMaxSize(t *testing.T) {
	cfg := DefaultConfig()
	if n, err := cfg.cacheMaxSize(); err != nil || n != cache.DefaultMaxSize {
		t.Errorf("default --cache-max-size = %d, %v; want %d", n, err, cache.DefaultMaxSize)
	}
	for in, want := range map[string]int64{"0": 0, "": 0, "1Gi": 1 << 30, "64Mi": 64 << 20, "100M": 100e6} {
		cfg.CacheMaxSize = in
		if n, err := cfg.cacheMaxSize(); err != nil || n != want {
			t.Errorf("--cache-max-size %q = %d, %v; want %d", in, n, err, want)
		}
	}
	for in, msg := range map[string]string{"10Mi": "at least 64Mi", "big": "want a quantity", "-1Gi": "at least 0", "1.5": "whole number"} {
		cfg := DefaultConfig()
		cfg.ServerAddr, cfg.Cert, cfg.Key, cfg.CacheMaxSize = []string{"https://10.0.0.1:6443"}, "/c", "/k", in
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--cache-max-size") || !strings.Contains(err.Error(), msg) {
			t.Errorf("--cache-max-size %q: %v; want an error saying %q", in, err, msg)
		}
	}
}
