// Package cli is what the Tether commands share around their own flags:
// config file and flag parsing, --version and --help, the logger, signal
// handling and exit codes. Each cmd/ main binds its flags to its config
// and hands the rest to Main.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"

	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/internal/logging"
	"github.com/tether-edge/tether/internal/memtrim"
	"github.com/tether-edge/tether/internal/version"
)

// Exit codes of the commands.
const (
	ExitOK     = 0
	ExitFailed = 1 // the program ran and failed
	ExitConfig = 2 // bad flags or configuration; nothing was started
)

// Program describes a command for Main.
type Program struct {
	Name string
	// Intro is the text of --help between the usage line and the flags.
	Intro string
	// Flags are bound to Config's fields; Main adds --version. Main logs
	// at the level and in the format of the flags named log-level and
	// log-format, and, if there is a flag named memory-limit, applies it
	// (ApplyMemoryLimit) and, while the program runs, gives the heap a
	// quiet process grew back to the kernel (internal/memtrim): after a
	// burst (a big list, a resync, thousands of handshakes) the next
	// collection may be many minutes away.
	Flags  *flag.FlagSet
	Config config.Validator
	// Run runs the program until ctx ends (SIGINT, SIGTERM).
	Run func(ctx context.Context, log *slog.Logger) error
}

// NewFlagSet returns a command's flag set with --config, the flag that
// names its YAML file; file is the one the packages pass.
func NewFlagSet(name, file string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.String(config.FlagName, "", "read settings from this YAML `file` first (keys are these flag names; unknown keys are an error); flags on the command line override it. The packages pass "+file)
	return fs
}

// Main parses args into the program's config, then runs it, and returns
// the exit code.
func Main(p Program, args []string) int {
	showVersion := p.Flags.Bool("version", false, "print the version and exit")
	p.Flags.Usage = func() { Usage(p.Flags, p.Name, p.Intro) }

	err := config.Parse(p.Flags, args, p.Config)
	if *showVersion {
		fmt.Println(p.Name, version.Version)
		return ExitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", p.Name, err)
		return ExitConfig
	}
	log, err := logging.New(flagValue(p.Flags, "log-level"), flagValue(p.Flags, "log-format"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", p.Name, err)
		return ExitConfig
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f := p.Flags.Lookup("memory-limit"); f != nil {
		if err := ApplyMemoryLimit(f.Value.String(), log); err != nil {
			log.Error(p.Name+" failed", "err", err)
			return ExitConfig
		}
		go memtrim.Run(ctx, memtrim.Options{}, log)
	}
	if err := p.Run(ctx, log); err != nil {
		log.Error(p.Name+" failed", "err", err)
		return ExitFailed
	}
	return ExitOK
}

// flagValue is the value of fs's flag name; "" if there is none.
func flagValue(fs *flag.FlagSet, name string) string {
	if f := fs.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// Usage writes the --help text: the usage line, intro, and every flag with
// its help and default.
func Usage(fs *flag.FlagSet, name, intro string) {
	w := fs.Output()
	fmt.Fprintf(w, "Usage: %s [flags]\n\n%s\nFlags:\n", name, strings.TrimSpace(intro)+"\n")
	fs.VisitAll(func(f *flag.Flag) {
		argName, help := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s", f.Name)
		if argName != "" {
			fmt.Fprintf(w, " %s", argName)
		}
		fmt.Fprintf(w, "\n      %s", strings.ReplaceAll(help, "\n", "\n      "))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// CheckFlags reports every key of cfg's YAML form (its struct's json
// tags) that has no flag of the same name in fs, or whose help says too
// little to explain it: the file and the command line must offer the same
// settings, each explained by --help. The commands' tests call it.
func CheckFlags(fs *flag.FlagSet, cfg any) error {
	var errs []error
	typ := reflect.TypeOf(cfg)
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			errs = append(errs, fmt.Errorf("config key %q has no flag", name))
		} else if len(f.Usage) < 20 {
			errs = append(errs, fmt.Errorf("--%s: help %q says too little", name, f.Usage))
		}
	}
	return errors.Join(errs...)
}
