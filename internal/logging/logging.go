// Package logging builds the one structured logger a Tether program uses
// and routes client-go's klog output into it, so an operator reads one
// stream in one format.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"k8s.io/klog/v2"
)

// New returns a logger writing to stderr. level is debug, info, warn or
// error; format is text or json.
func New(level, format string) (*slog.Logger, error) {
	return NewTo(os.Stderr, level, format)
}

// NewTo is New writing to w.
func NewTo(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch strings.ToLower(format) {
	case "", "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
	log := slog.New(h)
	klog.SetSlogLogger(log.With("source", "client-go"))
	return log, nil
}
