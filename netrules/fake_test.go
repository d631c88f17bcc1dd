package netrules

import (
	"context"
	"errors"
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
	if (None{}).Apply(ctx, Desired{}) != nil || (None{}).Backend() != KindNone {
		t.Error("None does something")
	}
	if _, err := New("ebpf", Options{}); err == nil {
		t.Error("New accepted an unknown backend")
	}
}
