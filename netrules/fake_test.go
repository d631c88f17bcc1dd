package netrules

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

func TestFake(t *testing.T) {
	var f Fake
	ctx := context.Background()
	if _, ok := f.Desired(); ok {
		t.Error("Desired before Apply")
	}
	if err := f.Apply(ctx, Desired{}); err == nil {
		t.Error("invalid Desired accepted")
	}
	if err := f.Apply(ctx, goldenDesired); err != nil {
		t.Fatal(err)
	}
	if d, ok := f.Desired(); !ok || d.ProxyPort != goldenDesired.ProxyPort {
		t.Errorf("Desired = %+v, %v", d, ok)
	}
	for dst, want := range map[string]bool{
		"10.20.0.5:10250":         true,  // edge address, proxied port
		"[::ffff:10.20.1.1]:8080": true,  // the same, IPv4-mapped
		"10.20.0.5:9100":          false, // edge address, other port
		"10.244.1.9:9100":         true,  // pod range, any port
		"10.244.2.200:443":        true,
		"[fd00:244:0:3::7]:443":   true,
		"10.244.3.0:443":          false, // just outside every range
		"[fd00:244:0:2::]:443":    false,
	} {
		port, ok := f.Trace(netip.MustParseAddrPort(dst))
		if ok != want || (ok && port != goldenDesired.ProxyPort) {
			t.Errorf("Trace(%s) = %d, %v; want redirected %v", dst, port, ok, want)
		}
	}
	boom := errors.New("boom")
	f.SetErr(boom)
	if err := f.Apply(ctx, goldenDesired); !errors.Is(err, boom) {
		t.Errorf("Apply with SetErr: %v", err)
	}
	f.SetErr(nil)
	if err := f.Cleanup(ctx); err != nil || !f.CleanedUp() || f.Applies() != 3 {
		t.Errorf("Cleanup: %v, cleaned %v, applies %d", err, f.CleanedUp(), f.Applies())
	}
	if _, ok := f.Desired(); ok {
		t.Error("Desired after Cleanup")
	}
	if _, ok := f.Trace(netip.MustParseAddrPort("10.244.1.9:9100")); ok {
		t.Error("Trace redirects after Cleanup")
	}
	if (None{}).Apply(ctx, Desired{}) != nil || (None{}).Backend() != KindNone {
		t.Error("None does something")
	}
	if _, err := New("ebpf", Options{}); err == nil {
		t.Error("New accepted an unknown backend")
	}
}
