package cli

import (
	"log/slog"
	"math"
	"runtime/debug"
	"testing"
)

func TestParseMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "0": 0, "24Mi": 24 << 20, "64M": 64e6, "1Gi": 1 << 30, "8388608": 8 << 20} {
		if got, err := ParseMemoryLimit(in); err != nil || got != want {
			t.Errorf("ParseMemoryLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"lots", "-1Mi", "1Ki", "24MB", "1.5"} {
		if got, err := ParseMemoryLimit(in); err == nil {
			t.Errorf("ParseMemoryLimit(%q) = %d with no error", in, got)
		}
	}
}

func TestApplyMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	log := slog.New(slog.DiscardHandler)
	t.Setenv("GOMEMLIMIT", "")
	if err := ApplyMemoryLimit("24Mi", log); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != 24<<20 {
		t.Errorf("limit %d after 24Mi", got)
	}
	if err := ApplyMemoryLimit("0", log); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("limit %d after 0, want none", got)
	}
	if err := ApplyMemoryLimit("much", log); err == nil {
		t.Error("no error for a limit that is not a quantity")
	}
	// The environment's GOMEMLIMIT is the Go runtime's; it wins.
	t.Setenv("GOMEMLIMIT", "100MiB")
	debug.SetMemoryLimit(100 << 20)
	if err := ApplyMemoryLimit("24Mi", log); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != 100<<20 {
		t.Errorf("limit %d with GOMEMLIMIT=100MiB set", got)
	}
}
