package benchplot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// svgTexts checks that svg is well-formed XML with an <svg> root and
// returns the contents of its <text> elements.
func svgTexts(t *testing.T, svg []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var texts []string
	var root string
	inText := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = e.Name.Local
			}
			if e.Name.Local == "text" {
				inText = true
				texts = append(texts, "")
			}
		case xml.CharData:
			if inText {
				texts[len(texts)-1] += string(e)
			}
		case xml.EndElement:
			if e.Name.Local == "text" {
				inText = false
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return texts
}

func TestChartSVG(t *testing.T) {
	for _, c := range []struct {
		name  string
		chart Chart
		want  []string // among the SVG's texts
	}{
		{
			name: "lines",
			chart: Chart{
				Title: "edges registered", X: "seconds since the gateway's start", Y: "edges registered",
				Lines: []Line{
					{Name: "cold start", Points: []XY{{0, 0}, {1, 40}, {2, 150}, {3, 200}}},
					{Name: "restart storm", Points: []XY{{0, 0}, {1, 120}, {2, 200}}},
				},
			},
			want: []string{"edges registered", "seconds since the gateway's start", "cold start", "restart storm", "0", "200"},
		},
		{
			name: "bars",
			chart: Chart{
				Title: "bulk throughput", Y: "MB/s",
				Groups: []string{"clean", "rtt80-loss1", "rtt80-loss3"},
				Bars: []Bars{
					{Name: "Tether", Values: []float64{300, 8.5, 3}},
					{Name: "Konnectivity", Values: []float64{250, math.NaN(), 0.8}},
				},
			},
			// The bars' values above them, n/a where not measured.
			want: []string{"bulk throughput", "MB/s", "clean", "rtt80-loss1", "rtt80-loss3", "Tether", "Konnectivity", "300", "8.50", "n/a", "0.8"},
		},
		{
			name: "ECDF",
			chart: Chart{
				Title: "replication lag", X: "lag (ms)", Y: "% of changes",
				Lines: []Line{ECDF("pool of 10", []float64{3, 1, 2, 8, 5})},
			},
			want: []string{"replication lag", "lag (ms)", "% of changes", "pool of 10"},
		},
		{
			name: "log Y",
			chart: Chart{
				Title: "p99", X: "loss (%)", Y: "ms", LogY: true,
				Lines: []Line{{Name: "Konnectivity", Points: []XY{{0, 2}, {1, 300}, {3, 2000}}}},
			},
			want: []string{"p99", "loss (%)", "ms", "Konnectivity"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			svg, err := c.chart.SVG()
			if err != nil {
				t.Fatal(err)
			}
			texts := svgTexts(t, svg)
			for _, w := range c.want {
				if !slices.Contains(texts, w) {
					t.Errorf("no text %q in the SVG; texts: %q", w, texts)
				}
			}
		})
	}
}

func TestChartErrors(t *testing.T) {
	for name, c := range map[string]Chart{
		"empty":            {Title: "x"},
		"no points":        {Title: "x", Lines: []Line{{Name: "a"}}},
		"lines and bars":   {Title: "x", Lines: []Line{{Points: []XY{{1, 1}}}}, Groups: []string{"g"}, Bars: []Bars{{Values: []float64{1}}}},
		"values != groups": {Title: "x", Groups: []string{"g", "h"}, Bars: []Bars{{Values: []float64{1}}}},
		"bars, no groups":  {Title: "x", Bars: []Bars{{Values: []float64{1}}}},
	} {
		if _, err := c.SVG(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestBarValue(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 1271.1: "1271", 149.94: "150", 95.44: "95.4", 8.5: "8.50", 0.8: "0.8", 0.04: "0.04", 0.0123: "0.012"} {
		if got := barValue(v); got != want {
			t.Errorf("barValue(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestECDF(t *testing.T) {
	l := ECDF("x", []float64{3, 1, 2, 4})
	want := []XY{{1, 0}, {1, 25}, {2, 25}, {2, 50}, {3, 50}, {3, 75}, {4, 75}, {4, 100}}
	if !slices.Equal(l.Points, want) {
		t.Errorf("ECDF = %v, want %v", l.Points, want)
	}
	// Many samples: 1,001 points from the smallest to the largest, the
	// median at 50 %.
	var many []float64
	for i := range 10000 {
		many = append(many, float64(10000-i))
	}
	l = ECDF("x", many)
	if len(l.Points) != maxECDF+1 {
		t.Fatalf("%d points, want %d", len(l.Points), maxECDF+1)
	}
	if first, last, mid := l.Points[0], l.Points[maxECDF], l.Points[maxECDF/2]; first != (XY{1, 0}) || last != (XY{10000, 100}) || mid != (XY{5000, 50}) {
		t.Errorf("ECDF of 1..10000: first %v, median %v, last %v", first, mid, last)
	}
}

func TestOut(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	stdout := os.Stdout
	o, err := Open("testbench", dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stdout.WriteString("scale: edges=3\n"); err != nil {
		t.Error(err)
	}
	perr := o.Plot("lines", Chart{Title: "t", Lines: []Line{{Name: "a", Points: []XY{{0, 0}, {1, 1}}}}})
	if err := o.Close(); err != nil {
		t.Error(err)
	}
	if perr != nil {
		t.Fatal(perr)
	}
	if os.Stdout != stdout {
		t.Error("Close did not restore os.Stdout")
	}
	txt, err := os.ReadFile(filepath.Join(dir, "testbench.txt"))
	if err != nil || string(txt) != "scale: edges=3\n" {
		t.Errorf("testbench.txt = %q, %v; want the line printed", txt, err)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "lines.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if texts := svgTexts(t, svg); !slices.Contains(texts, "t") {
		t.Errorf("lines.svg: no title among %q", texts)
	}
}

func TestDefaultDirAndHelp(t *testing.T) {
	if h := Help("poolbench"); !strings.Contains(h, "poolbench.txt") || !strings.Contains(h, "poolbench-YYYYMMDD-HHMMSS") {
		t.Errorf("Help = %q", h)
	}
}

// TestProgramsDoNotLinkIt: the plotting library stays out of the two
// programs (and tetherctl): only the benches import this package.
func TestProgramsDoNotLinkIt(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "../../cmd/tether-gateway", "../../cmd/tether-edge", "../../cmd/tetherctl")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps found %d packages", len(deps))
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "gonum.org/") || strings.HasSuffix(d, "/e2e/benchplot") {
			t.Errorf("a program links %s", d)
		}
	}
}
