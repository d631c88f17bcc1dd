package cli

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/api/resource"
)

// ParseMemoryLimit reads a memory limit written as a Kubernetes quantity
// ("24Mi", "64M", "100000000"); "" and "0" mean no limit (0).
func ParseMemoryLimit(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("memory limit %q: want a quantity such as 24Mi or 64M", s)
	}
	n, ok := q.AsInt64()
	if !ok || n < 0 {
		return 0, fmt.Errorf("memory limit %q: want a whole number of bytes, at least 0", s)
	}
	if n > 0 && n < 4<<20 {
		return 0, fmt.Errorf("memory limit %q: below 4Mi the Go runtime would collect garbage without pause", s)
	}
	return n, nil
}

// ApplyMemoryLimit sets the Go runtime's soft memory limit (see
// runtime/debug.SetMemoryLimit): the garbage collector runs more often as
// the process's own memory (heap, stacks; not the mapped binary or files)
// nears it, instead of letting the heap grow to twice what is live. It is
// soft: a process that needs more gets it, and the collector never takes
// more than about half the CPU. GOMEMLIMIT in the environment, the Go
// runtime's own setting, wins over s.
func ApplyMemoryLimit(s string, log *slog.Logger) error {
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		log.Info("memory limit from GOMEMLIMIT in the environment", "GOMEMLIMIT", env)
		return nil
	}
	n, err := ParseMemoryLimit(s)
	if err != nil {
		return err
	}
	if n == 0 {
		debug.SetMemoryLimit(math.MaxInt64)
		return nil
	}
	debug.SetMemoryLimit(n)
	log.Debug("Go runtime soft memory limit", "bytes", n)
	return nil
}
