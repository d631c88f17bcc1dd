package cli

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/api/resource"
)

// AutoMemoryLimit is the memory limit that follows the process's cgroup:
// AutoMemoryFraction of its memory limit (a container's
// resources.limits.memory, a unit's MemoryMax=), or none when it has none.
const AutoMemoryLimit = "auto"

// AutoMemoryFraction of the cgroup's limit leaves room for what the Go
// runtime does not count (the mapped binary, files, the kernel's socket
// buffers) below the point where the kernel kills the process.
const AutoMemoryFraction = 0.9

// ParseMemoryLimit reads a memory limit written as a Kubernetes quantity
// ("24Mi", "64M", "100000000"); "" and "0" mean no limit (0). AutoMemoryLimit
// is valid too and also reads as 0 here: ApplyMemoryLimit resolves it.
func ParseMemoryLimit(s string) (int64, error) {
	if s == "" || s == AutoMemoryLimit {
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
	if s == AutoMemoryLimit {
		n = autoMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup", log)
	}
	if n == 0 {
		debug.SetMemoryLimit(math.MaxInt64)
		return nil
	}
	debug.SetMemoryLimit(n)
	log.Debug("Go runtime soft memory limit", "bytes", n)
	return nil
}

// autoMemoryLimit is AutoMemoryFraction of the cgroup's memory limit, or 0
// (none) without one; a cgroup that cannot be read is logged and no limit.
func autoMemoryLimit(procCgroup, root string, log *slog.Logger) int64 {
	limit, ok, err := cgroupMemoryMax(procCgroup, root)
	switch {
	case err != nil:
		log.Warn("memory limit auto: cannot read the cgroup's memory limit; none set", "err", err)
		return 0
	case !ok:
		log.Info("memory limit auto: the cgroup has no memory limit; none set")
		return 0
	}
	n := max(int64(float64(limit)*AutoMemoryFraction), 4<<20)
	log.Info("memory limit auto: a share of the cgroup's memory limit", "cgroup_bytes", limit, "share", AutoMemoryFraction, "bytes", n)
	return n
}
