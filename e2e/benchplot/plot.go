// Package benchplot writes what the bench commands of e2e (scalebench,
// tunnelbench, poolbench) measured where an operator finds it: their text
// output and SVG plots of their key results, in one directory per run.
//
//   - Chart (plot.go) is one plot: lines (a series of points each, such
//     as edges registered against time, or ECDF's distribution of
//     samples) or grouped bars (one value per group and series, such as a
//     figure per WAN scenario, Tether beside Konnectivity). It is drawn by
//     gonum.org/v1/plot into SVG.
//   - Out (out.go) is a run's output directory (--out): it copies what
//     the bench prints to its standard output into <bench>.txt there, and
//     writes each Chart as <name>.svg beside it.
//
// Only the benches import it: the programs must not link the plotting
// library (TestProgramsDoNotLinkIt).
package benchplot

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Size of every plot: readable beside text in a browser or a Markdown
// page, at 96 px per inch 768×480 px.
const (
	width  = 8 * vg.Inch
	height = 5 * vg.Inch
	margin = 12 // points
	// legendIndent puts the legend below the data area's left edge,
	// past the Y axis's label and ticks.
	legendIndent = 60
)

// sans is the typeface of every text: Liberation Sans, embedded in the
// plotting library (its default is the serif one).
var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

// XY is a point of a Line.
type XY struct{ X, Y float64 }

// Line is one series of a line chart, drawn in the order of its points.
type Line struct {
	Name   string
	Points []XY
}

// Bars is one series of a bar chart: its value in each of the chart's
// Groups, in their order; NaN for a value not measured (no bar).
type Bars struct {
	Name   string
	Values []float64
}

// Chart is one plot: either Lines, or Groups with Bars.
type Chart struct {
	Title  string
	X, Y   string // the axes' labels
	Lines  []Line
	Groups []string // bar chart: the groups along the X axis
	Bars   []Bars
	// LogY draws the Y axis on a log scale (lines only; values must be
	// positive).
	LogY bool
}

// SVG draws c: the plot, and below it the legend (below, not on the
// data, whatever the curves' shape).
func (c Chart) SVG() ([]byte, error) {
	p, legend, err := c.plot()
	if err != nil {
		return nil, err
	}
	r := legend.Rectangle(draw.Canvas{})
	band := r.Max.Y - r.Min.Y + margin
	canvas := vgsvg.New(width, height+band)
	dc := draw.New(canvas)
	// A margin: gonum lets the last tick label run off the right edge.
	p.Draw(draw.Crop(dc, margin, -margin, band, -margin))
	legend.Draw(draw.Crop(dc, legendIndent, -margin, margin/2, -height))
	var buf bytes.Buffer
	if _, err := canvas.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("render %q: %w", c.Title, err)
	}
	return buf.Bytes(), nil
}

func (c Chart) plot() (*plot.Plot, *plot.Legend, error) {
	p := plot.New()
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	legend.Padding = 4
	for _, t := range []*text.Style{&p.Title.TextStyle, &p.X.Label.TextStyle, &p.Y.Label.TextStyle, &p.X.Tick.Label, &p.Y.Tick.Label, &legend.TextStyle} {
		t.Font.Typeface, t.Font.Variant = sans.Typeface, sans.Variant
	}
	p.Title.Text = c.Title
	p.Title.TextStyle.Font.Size = 14
	p.Title.Padding = 10
	p.X.Label.Text = c.X
	p.Y.Label.Text = c.Y
	p.Add(plotter.NewGrid())
	var err error
	switch {
	case len(c.Lines) > 0 && len(c.Bars) > 0:
		err = errors.New("lines and bars together")
	case len(c.Lines) > 0:
		err = c.addLines(p, &legend)
	case len(c.Bars) > 0:
		err = c.addBars(p, &legend)
	default:
		err = errors.New("no data")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("chart %q: %w", c.Title, err)
	}
	return p, &legend, nil
}

func (c Chart) addLines(p *plot.Plot, legend *plot.Legend) error {
	if c.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	n := 0
	for i, l := range c.Lines {
		xys := make(plotter.XYs, 0, len(l.Points))
		for _, pt := range l.Points {
			if !finite(pt.X) || !finite(pt.Y) || (c.LogY && pt.Y <= 0) {
				continue
			}
			xys = append(xys, plotter.XY{X: pt.X, Y: pt.Y})
		}
		if len(xys) == 0 {
			continue
		}
		n++
		line, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("line %q: %w", l.Name, err)
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		line.Dashes = plotutil.Dashes(i)
		p.Add(line)
		if l.Name != "" {
			legend.Add(l.Name, line)
		}
	}
	if n == 0 {
		return errors.New("no line has a point")
	}
	return nil
}

func (c Chart) addBars(p *plot.Plot, legend *plot.Legend) error {
	if len(c.Groups) == 0 {
		return errors.New("bars without groups")
	}
	// The bars of a group side by side, filling 80 % of the space
	// between two groups.
	groupWidth := (width - 2*vg.Inch) / vg.Length(len(c.Groups))
	w := 0.8 * groupWidth / vg.Length(len(c.Bars))
	top := 0.0
	for i, b := range c.Bars {
		if len(b.Values) != len(c.Groups) {
			return fmt.Errorf("bars %q: %d values for %d groups", b.Name, len(b.Values), len(c.Groups))
		}
		vals := make(plotter.Values, len(b.Values))
		for k, v := range b.Values {
			if finite(v) {
				vals[k] = v // NaN stays 0: no bar
				top = max(top, v)
			}
		}
		bc, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("bars %q: %w", b.Name, err)
		}
		bc.Color = plotutil.Color(i)
		bc.LineStyle.Width = 0
		bc.Offset = w * (vg.Length(i) - vg.Length(len(c.Bars)-1)/2)
		p.Add(bc)
		sty := p.Y.Tick.Label
		sty.XAlign, sty.YAlign = draw.XCenter, draw.YBottom
		p.Add(barLabels{offset: bc.Offset, values: b.Values, style: sty})
		if b.Name != "" {
			legend.Add(b.Name, bc)
		}
	}
	p.NominalX(c.Groups...)
	p.X.Min, p.X.Max = -0.5, float64(len(c.Groups))-0.5
	p.Y.Min = 0
	if top > 0 {
		p.Y.Max = 1.08 * top // room for the labels
	}
	return nil
}

// barLabels writes each bar's value above it, so that a bar too small to
// see still reads ("n/a": not measured).
type barLabels struct {
	offset vg.Length // the bars' offset from their group's center
	values []float64
	style  text.Style
}

func (l barLabels) Plot(c draw.Canvas, p *plot.Plot) {
	x, y := p.Transforms(&c)
	for i, v := range l.values {
		s, at := "n/a", 0.0
		if finite(v) {
			s, at = barValue(v), v
		}
		c.FillText(l.style, vg.Point{X: x(float64(i)) + l.offset, Y: y(at) + 2}, s)
	}
}

// barValue is v with three significant digits at most, no exponent.
func barValue(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100 || v == 0:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// maxECDF bounds the points of an ECDF: beyond it, the line joins the
// samples at 0.1 % steps of the distribution.
const maxECDF = 1000

// ECDF is the empirical distribution of samples as a Line: for each value
// v, the percentage of the samples at most v (a step at each sample; of
// more than maxECDF samples, the value at each 0.1 % of them).
func ECDF(name string, samples []float64) Line {
	s := slices.Clone(samples)
	slices.Sort(s)
	l := Line{Name: name}
	n := len(s)
	if n <= maxECDF {
		for i, v := range s {
			l.Points = append(l.Points, XY{v, 100 * float64(i) / float64(n)}, XY{v, 100 * float64(i+1) / float64(n)})
		}
		return l
	}
	for k := 0; k <= maxECDF; k++ {
		i := max(0, (k*n+maxECDF-1)/maxECDF-1) // nearest rank of k/maxECDF
		l.Points = append(l.Points, XY{s[i], 100 * float64(k) / maxECDF})
	}
	return l
}
