package world

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tether-edge/tether/e2e/benchplot"
	"github.com/tether-edge/tether/internal/testenv"
)

// RunBench is the main of a bench command (tunnelbench, poolbench): it
// needs root, logs the world's steps when verbose, runs f in a
// testenv.Session whose context ends at SIGINT, SIGTERM or after timeout,
// cleans everything up, and exits 1 with f's error, 2 without root.
func RunBench(name string, verbose bool, timeout time.Duration, f func(ctx context.Context, s *testenv.Session) error) {
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "%s: needs root (it creates network namespaces)\n", name)
		os.Exit(2)
	}
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	s := &testenv.Session{Log: log}
	if err := s.Run(func() error { return f(ctx, s) }); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (--timeout %v)", err, timeout)
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// RunBenchOut is RunBench for a bench that writes its text and plots into
// an output directory (benchplot.Open with outDir, "" for the dated
// default): f gets the open Out, closed when f returns.
func RunBenchOut(name string, verbose bool, timeout time.Duration, outDir string,
	f func(ctx context.Context, s *testenv.Session, out *benchplot.Out) error) {
	RunBench(name, verbose, timeout, func(ctx context.Context, s *testenv.Session) error {
		out, err := benchplot.Open(name, outDir)
		if err != nil {
			return err
		}
		defer out.Close()
		return f(ctx, s, out)
	})
}

// BenchBinaries returns the programs a bench measures: those in dir
// (need names the ones that must be there), or, with dir empty, a fresh
// build of this tree into a directory removed at s's cleanup, so that a
// bench never measures stale binaries by accident.
func BenchBinaries(s testenv.T, dir string, note func(string, ...any), need ...string) (Binaries, error) {
	if dir != "" {
		b := Binaries{Gateway: filepath.Join(dir, "tether-gateway"), Edge: filepath.Join(dir, "tether-edge"), Ctl: filepath.Join(dir, "tetherctl")}
		for _, name := range need {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return Binaries{}, fmt.Errorf("--bin-dir: %w", err)
			}
		}
		return b, nil
	}
	tmp, err := os.MkdirTemp("", "tether-bench-bin-")
	if err != nil {
		return Binaries{}, err
	}
	s.Cleanup(func() { os.RemoveAll(tmp) })
	note("building tether-gateway, tether-edge and tetherctl")
	return BuildBinaries(tmp)
}

// LoadAvg is the machine's 1, 5 and 15 minute load averages, for the
// benches' reports.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
