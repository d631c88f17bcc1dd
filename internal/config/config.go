// Package config loads a program's settings: one strict YAML file for the
// rest, flags for what the operator gives on the command line. Flags
// override the file; unknown keys in the file are an error, not a warning,
// so a typo never silently falls back to a default.
//
// The file's keys are the flag names (`tunnel-listen: ":10262"`), because
// the config struct's yaml/json tags are.
package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// Validator is a config that checks itself before use.
type Validator interface {
	Validate() error
}

// FlagName is the flag that names the config file.
const FlagName = "config"

// Parse fills cfg: it finds --config in args first and loads that file
// into cfg (over the defaults cfg already holds), then parses the flags of
// fs over it, then calls cfg.Validate. fs must bind its flags to cfg's
// fields and define the "config" flag itself.
func Parse(fs *flag.FlagSet, args []string, cfg Validator) error {
	path, err := findConfigFlag(fs, args)
	if err != nil {
		return err
	}
	if path != "" {
		if err := LoadFile(path, cfg); err != nil {
			return err
		}
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q (all settings are flags)", fs.Args())
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return nil
}

// LoadFile reads a YAML file strictly into cfg.
func LoadFile(path string, cfg any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// findConfigFlag returns the value of -config/--config in args ("" if
// absent), in any of the forms the flag package accepts. It walks args the
// way fs.Parse will, so a flag's separate value is never taken for a flag.
func findConfigFlag(fs *flag.FlagSet, args []string) (string, error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") {
			return "", nil // flags end here
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == FlagName {
			if hasValue {
				return value, nil
			}
			if i+1 == len(args) {
				return "", errors.New("flag needs an argument: --" + FlagName)
			}
			return args[i+1], nil
		}
		if !hasValue && !isBoolFlag(fs, name) {
			i++ // skip the flag's value
		}
	}
	return "", nil
}

func isBoolFlag(fs *flag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// StringList is a flag.Value for lists: a flag may be repeated or carry
// comma-separated items. The first use on the command line replaces what
// the config file set; further uses append.
type StringList struct {
	Items *[]string
	set   bool
}

// NewStringList binds a StringList to items.
func NewStringList(items *[]string) *StringList { return &StringList{Items: items} }

func (l *StringList) String() string {
	if l == nil || l.Items == nil {
		return ""
	}
	return strings.Join(*l.Items, ",")
}

func (l *StringList) Set(v string) error {
	if !l.set {
		*l.Items = nil
		l.set = true
	}
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*l.Items = append(*l.Items, item)
		}
	}
	return nil
}
