package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/tether-edge/tether/e2e/world"
)

// profileEnv names the directory where a profiling build of tether-gateway
// or tether-edge finds its control file and writes its profiles.
const profileEnv = "TETHER_BENCH_PROFILE_DIR"

// profileHook is added to package main of both programs with `go build
// -overlay` when --profile is given; the source tree never holds it. With
// $TETHER_BENCH_PROFILE_DIR set, SIGUSR1 starts a CPU profile named by the
// control file <dir>/<program>.ctl, and the next SIGUSR1 ends it: the
// profile appears as <dir>/<program>-<label>.pprof once complete.
const profileHook = `package main

import (
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
)

func init() {
	dir := os.Getenv("` + profileEnv + `")
	if dir == "" {
		return
	}
	prog := filepath.Base(os.Args[0])
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		var f *os.File
		var final string
		for range ch {
			if f != nil {
				pprof.StopCPUProfile()
				f.Close()
				os.Rename(f.Name(), final)
				f = nil
				continue
			}
			label, err := os.ReadFile(filepath.Join(dir, prog+".ctl"))
			if err != nil {
				continue
			}
			final = filepath.Join(dir, prog+"-"+strings.TrimSpace(string(label))+".pprof")
			if f, err = os.Create(final + ".tmp"); err != nil {
				continue
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				f.Close()
				f = nil
			}
		}
	}()
}
`

// profiler takes CPU profiles of this process and of the Tether programs
// for one measurement at a time.
type profiler struct {
	dir   string
	bins  world.Binaries // the profiling build
	procs []profiled     // the running processes of the profiling build
	self  *os.File
	label string
	// remote is whether the current profile includes procs.
	remote bool
}

type profiled struct {
	name string // file name prefix: gateway, edge
	proc *os.Process
}

func newProfiler(dir string) (*profiler, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The programs started later inherit it.
	os.Setenv(profileEnv, dir)
	return &profiler{dir: dir}, nil
}

// build builds tether-gateway and tether-edge with the profiling hook into
// the profile directory (where pprof also finds them).
func (p *profiler) build() (world.Binaries, error) {
	hook := filepath.Join(p.dir, "profile_hook.go.txt") // not .go: the directory may be inside a module
	if err := os.WriteFile(hook, []byte(profileHook), 0o644); err != nil {
		return world.Binaries{}, err
	}
	root, err := filepath.Abs(world.RepoRoot())
	if err != nil {
		return world.Binaries{}, err
	}
	overlay := map[string]map[string]string{"Replace": {
		filepath.Join(root, "cmd", "tether-gateway", "zz_bench_profile.go"): hook,
		filepath.Join(root, "cmd", "tether-edge", "zz_bench_profile.go"):    hook,
	}}
	ob, _ := json.Marshal(overlay)
	ovf := filepath.Join(p.dir, "overlay.json")
	if err := os.WriteFile(ovf, ob, 0o644); err != nil {
		return world.Binaries{}, err
	}
	cmd := exec.Command("go", "build", "-overlay", ovf, "-o", p.dir+"/", "./cmd/tether-gateway", "./cmd/tether-edge")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return world.Binaries{}, fmt.Errorf("build profiling binaries: %v\n%s", err, out)
	}
	p.bins = world.Binaries{Gateway: filepath.Join(p.dir, "tether-gateway"), Edge: filepath.Join(p.dir, "tether-edge")}
	return p.bins, nil
}

// start begins the profiles named label: this process's, and with remote
// also the gateway's and the edge's.
func (p *profiler) start(label string, remote bool) error {
	f, err := os.Create(filepath.Join(p.dir, "bench-"+label+".pprof"))
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	p.self, p.label, p.remote = f, label, remote
	if remote {
		for _, pr := range p.procs {
			if err := os.WriteFile(filepath.Join(p.dir, "tether-"+pr.name+".ctl"), []byte(label), 0o644); err != nil {
				return err
			}
			if err := pr.proc.Signal(syscall.SIGUSR1); err != nil {
				return fmt.Errorf("start profile of %s: %w", pr.name, err)
			}
		}
	}
	return nil
}

// stop ends the current profiles and waits until the programs wrote
// theirs.
func (p *profiler) stop() {
	pprof.StopCPUProfile()
	p.self.Close()
	if !p.remote {
		return
	}
	for _, pr := range p.procs {
		pr.proc.Signal(syscall.SIGUSR1)
	}
	for _, pr := range p.procs {
		final := filepath.Join(p.dir, fmt.Sprintf("tether-%s-%s.pprof", pr.name, p.label))
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(final); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
