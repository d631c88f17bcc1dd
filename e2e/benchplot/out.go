package benchplot

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Out is a bench run's output directory: the text the bench prints to its
// standard output is copied into <bench>.txt there while it is open, and
// Plot writes charts beside it.
type Out struct {
	Dir   string
	bench string
	// While open, os.Stdout is w, the write end of a pipe whose reader
	// copies to stdout (the original) and file until done.
	stdout, w, file *os.File
	done            chan struct{}
	written         []string
}

// Help is the usage text of a bench's --out flag.
func Help(bench string) string {
	return fmt.Sprintf("write the text output (also printed) as %s.txt and the SVG plots into `dir`, created if missing; empty: %s-YYYYMMDD-HHMMSS (the start, UTC) in the current directory", bench, bench)
}

// DefaultDir is the output directory of a run started at now: the bench's
// name and the time, so that runs do not overwrite one another.
func DefaultDir(bench string, now time.Time) string {
	return bench + "-" + now.UTC().Format("20060102-150405")
}

// Open creates dir (DefaultDir of now when empty) and copies the standard
// output into dir/<bench>.txt until Close.
func Open(bench, dir string) (*Out, error) {
	if dir == "" {
		dir = DefaultDir(bench, time.Now())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("output directory: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, bench+".txt"))
	if err != nil {
		return nil, fmt.Errorf("output directory: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("output directory: %w", err)
	}
	o := &Out{Dir: dir, bench: bench, stdout: os.Stdout, w: w, file: f, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		defer r.Close()
		// A failing copy to the file must not stop the printing: on an
		// error, go on to stdout alone.
		if _, err := io.Copy(io.MultiWriter(o.stdout, f), r); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %s: %v\n", bench, f.Name(), err)
			io.Copy(o.stdout, r)
		}
	}()
	os.Stdout = w
	return o, nil
}

// Plot writes c as dir/<name>.svg.
func (o *Out) Plot(name string, c Chart) error {
	svg, err := c.SVG()
	if err != nil {
		return err
	}
	path := filepath.Join(o.Dir, name+".svg")
	if err := os.WriteFile(path, svg, 0o644); err != nil {
		return err
	}
	o.written = append(o.written, filepath.Base(path))
	return nil
}

// Plots writes each chart as dir/<name>.svg, in the order of the names,
// and returns the errors of those it could not write.
func (o *Out) Plots(charts map[string]Chart) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(charts)) {
		if err := o.Plot(name, charts[name]); err != nil {
			errs = append(errs, fmt.Errorf("plot %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Close restores the standard output, finishes the copy into the text
// file and says on stderr where the output is.
func (o *Out) Close() error {
	os.Stdout = o.stdout
	o.w.Close()
	select {
	case <-o.done:
	case <-time.After(5 * time.Second): // a child kept the pipe open
	}
	err := o.file.Close()
	fmt.Fprintf(os.Stderr, "%s: output in %s: %s.txt", o.bench, o.Dir, o.bench)
	for _, p := range o.written {
		fmt.Fprintf(os.Stderr, ", %s", p)
	}
	fmt.Fprintln(os.Stderr)
	return err
}
