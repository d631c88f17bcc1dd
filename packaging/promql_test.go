package packaging_test

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// This file finds what a PromQL expression of the alerts and dashboards
// names: metrics (with the labels their selectors match on) and the labels
// of by/without/on/ignoring/group_left/group_right. It is a scanner, not a
// parser: promtool checks the syntax (TestAlertRules, TestDashboardQueries);
// this only has to find names in expressions that parse.

// selector is one vector selector: metric{label op "value", ...}.
type selector struct {
	metric string   // "" for {__name__=~"..."} selectors
	nameRE string   // the regexp of a __name__=~ matcher
	labels []string // labels matched on, without __name__
}

// promqlRefs is what an expression names.
type promqlRefs struct {
	selectors []selector
	grouping  []string // labels of by/without/on/ignoring/group_left/group_right
}

// promqlKeywords are identifiers that are not metrics: operators,
// modifiers, and the aggregations (which a by or without clause may
// separate from their parenthesis).
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"inf": true, "nan": true, "start": true, "end": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// groupingKeywords take a list of label names in parentheses.
var groupingKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

type token struct {
	kind byte // 'i' identifier, 's' string, 'n' number or duration, 'p' punctuation
	text string
}

// scanPromQL splits expr into tokens; range and subquery brackets are
// dropped with their content (durations only).
func scanPromQL(expr string) ([]token, error) {
	var toks []token
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#': // comment to the end of the line
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			var b strings.Builder
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' && c != '`' && j+1 < len(expr) {
					j++
				}
				b.WriteByte(expr[j])
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at offset %d", i)
			}
			toks = append(toks, token{'s', b.String()})
			i = j + 1
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated [ at offset %d", i)
			}
			i += j + 1
		case isIdentStart(c):
			j := i + 1
			for j < len(expr) && isIdentChar(expr[j]) {
				j++
			}
			toks = append(toks, token{'i', expr[i:j]})
			i = j
		case c >= '0' && c <= '9' || c == '.':
			j := i + 1
			for j < len(expr) && (isIdentChar(expr[j]) || expr[j] == '.') {
				j++
			}
			toks = append(toks, token{'n', expr[i:j]})
			i = j
		default:
			if i+1 < len(expr) && strings.Contains("=~ != !~ == >= <=", expr[i:i+2]) {
				toks = append(toks, token{'p', expr[i : i+2]})
				i += 2
				continue
			}
			toks = append(toks, token{'p', string(c)})
			i++
		}
	}
	return toks, nil
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdentChar(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

// parsePromQL returns what expr names.
func parsePromQL(expr string) (promqlRefs, error) {
	toks, err := scanPromQL(expr)
	if err != nil {
		return promqlRefs{}, err
	}
	var r promqlRefs
	next := func(i int) token {
		if i+1 < len(toks) {
			return toks[i+1]
		}
		return token{}
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch {
		case t.kind == 'i' && groupingKeywords[t.text]:
			if next(i).text != "(" {
				continue // group_left without labels
			}
			for i += 2; i < len(toks) && toks[i].text != ")"; i++ {
				if toks[i].kind == 'i' {
					r.grouping = append(r.grouping, toks[i].text)
				}
			}
		case t.kind == 'i' && promqlKeywords[strings.ToLower(t.text)]:
		case t.kind == 'i' && next(i).text == "(":
			// a function or an aggregation
		case t.kind == 'i':
			sel := selector{metric: t.text}
			if next(i).text == "{" {
				var err error
				if i, err = readMatchers(toks, i+1, &sel); err != nil {
					return r, fmt.Errorf("%s: %w", t.text, err)
				}
			}
			r.selectors = append(r.selectors, sel)
		case t.text == "{":
			var sel selector
			var err error
			if i, err = readMatchers(toks, i, &sel); err != nil {
				return r, err
			}
			r.selectors = append(r.selectors, sel)
		}
	}
	return r, nil
}

// readMatchers reads the matchers from the "{" at toks[i] to its "}",
// whose index it returns.
func readMatchers(toks []token, i int, sel *selector) (int, error) {
	for i++; i < len(toks); i++ {
		switch t := toks[i]; {
		case t.text == "}":
			return i, nil
		case t.text == ",":
		case t.kind == 'i' && i+2 < len(toks) && toks[i+1].kind == 'p' && toks[i+2].kind == 's':
			op, value := toks[i+1].text, toks[i+2].text
			switch {
			case t.text == "__name__" && op == "=":
				sel.metric = value
			case t.text == "__name__" && op == "=~":
				sel.nameRE = value
			case t.text == "__name__":
				return i, fmt.Errorf("__name__%s is not supported here", op)
			default:
				sel.labels = append(sel.labels, t.text)
			}
			i += 2
		default:
			return i, fmt.Errorf("unexpected %q in a selector", t.text)
		}
	}
	return i, fmt.Errorf("unterminated selector")
}

// targetLabels are the labels Prometheus (job, instance) or the scrape
// configuration (pool, for edges: packaging/README.md) puts on every series
// of a target; the programs do not export them.
var targetLabels = []string{"job", "instance", "pool"}

// family is a metric the program exports: its label names and type
// ("counter", "gauge", "histogram", "summary", "untyped"; "" when only its
// descriptor is known, not its type).
type family struct {
	labels []string
	typ    string
	help   string
}

// exported is what a program exports: metric name to family.
type exported map[string]family

// lookup finds the family a series name belongs to: the name itself, or a
// histogram's or summary's _bucket, _sum or _count series. extra are the
// labels the series has besides the family's (le of _bucket).
func (e exported) lookup(name string) (f family, extra []string, err error) {
	if f, ok := e[name]; ok {
		return f, nil, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		f, ok := e[base]
		if !ok {
			break
		}
		switch {
		case f.typ == "histogram" && suffix == "_bucket":
			return f, []string{"le"}, nil
		case (f.typ == "histogram" || f.typ == "summary") && suffix != "_bucket":
			return f, nil, nil
		case f.typ == "":
			return f, nil, fmt.Errorf("%s: %s is exported but has no series yet, so its type (histogram?) is unknown", name, base)
		}
		return f, nil, fmt.Errorf("%s: %s is a %s, it has no %s series", name, base, f.typ, suffix)
	}
	return family{}, nil, fmt.Errorf("%s is not exported", name)
}

// checkExpr reports the metrics and labels expr names that e does not
// export. also are labels the expression's users name (legend templates,
// $labels in annotations): each must be a label of one of its metrics.
func checkExpr(e exported, expr string, also ...string) []error {
	refs, err := parsePromQL(expr)
	if err != nil {
		return []error{err}
	}
	var errs []error
	have := slices.Clone(targetLabels)
	for _, sel := range refs.selectors {
		var fams []family
		var extra []string
		switch {
		case sel.metric != "":
			f, x, err := e.lookup(sel.metric)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			fams, extra = []family{f}, x
		case sel.nameRE != "":
			re, err := regexp.Compile("^(?:" + sel.nameRE + ")$")
			if err != nil {
				errs = append(errs, fmt.Errorf("__name__=~%q: %w", sel.nameRE, err))
				continue
			}
			for name, f := range e {
				if re.MatchString(name) {
					fams = append(fams, f)
				}
			}
			if len(fams) == 0 {
				errs = append(errs, fmt.Errorf("__name__=~%q matches no exported metric", sel.nameRE))
				continue
			}
		}
		var labels []string
		for _, f := range fams {
			labels = append(labels, f.labels...)
		}
		labels = append(labels, extra...)
		for _, l := range sel.labels {
			if !slices.Contains(labels, l) && !slices.Contains(targetLabels, l) {
				errs = append(errs, fmt.Errorf("%s has no label %q (it has %s)", selName(sel), l, listOrNone(labels)))
			}
		}
		have = append(have, labels...)
	}
	for _, l := range append(refs.grouping, also...) {
		if !slices.Contains(have, l) {
			errs = append(errs, fmt.Errorf("label %q is none of the expression's metrics' (%s)", l, listOrNone(have)))
		}
	}
	return errs
}

func selName(s selector) string {
	if s.metric != "" {
		return s.metric
	}
	return fmt.Sprintf("{__name__=~%q}", s.nameRE)
}

func listOrNone(l []string) string {
	l = slices.Clone(l)
	sort.Strings(l)
	l = slices.Compact(l)
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

func TestParsePromQL(t *testing.T) {
	for _, tc := range []struct {
		expr      string
		selectors []selector
		grouping  []string
	}{
		{`up`, []selector{{metric: "up"}}, nil},
		{`sum by (job, instance) (rate(a_total{result!~"ok|conflict", x="}"}[5m])) > 3`,
			[]selector{{metric: "a_total", labels: []string{"result", "x"}}}, []string{"job", "instance"}},
		{`max_over_time(g[30m]) - g offset 1h and on (instance) h == bool 0`,
			[]selector{{metric: "g"}, {metric: "g"}, {metric: "h"}}, []string{"instance"}},
		{`histogram_quantile(0.99, sum by (le) (rate(h_bucket{job=~"$job"}[$__rate_interval])))`,
			[]selector{{metric: "h_bucket", labels: []string{"job"}}}, []string{"le"}},
		{`{__name__=~"tether_edge_.+", job="x"}`, []selector{{nameRE: "tether_edge_.+", labels: []string{"job"}}}, nil},
		{`a * on (node) group_left (pool) b - 14 * 86400 + 1e3 < time()`,
			[]selector{{metric: "a"}, {metric: "b"}}, []string{"node", "pool"}},
		{`count(x == 0) or vector(0)`, []selector{{metric: "x"}}, nil},
		{`sum without (a) (x) / max by (b) (y)`, []selector{{metric: "x"}, {metric: "y"}}, []string{"a", "b"}},
	} {
		got, err := parsePromQL(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if fmt.Sprint(got.selectors) != fmt.Sprint(tc.selectors) || fmt.Sprint(got.grouping) != fmt.Sprint(tc.grouping) {
			t.Errorf("%s:\n got %v %v\nwant %v %v", tc.expr, got.selectors, got.grouping, tc.selectors, tc.grouping)
		}
	}

	e := exported{
		"h":       {labels: []string{"node"}, typ: "histogram"},
		"c_total": {labels: []string{"result"}, typ: "counter"},
		"d":       {labels: []string{"reason"}},
	}
	for expr, want := range map[string]string{
		`sum by (le, node) (rate(h_bucket{node="a"}[5m]))`:  "",
		`rate(h_sum[5m]) / rate(h_count[5m])`:               "",
		`rate(c_total{reason="x"}[5m])`:                     `c_total has no label "reason"`,
		`sum by (reason) (rate(c_total[5m]))`:               `label "reason" is none of`,
		`rate(c_total_bucket[5m])`:                          "c_total is a counter, it has no _bucket series",
		`d_count`:                                           "type (histogram?) is unknown",
		`missing_total`:                                     "missing_total is not exported",
		`max by (job, instance, pool) (d{instance="gw-1"})`: "",
		`{__name__=~"nothing_.+"}`:                          "matches no exported metric",
	} {
		errs := checkExpr(e, expr)
		switch {
		case want == "" && len(errs) > 0:
			t.Errorf("%s: %v", expr, errs)
		case want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), want)):
			t.Errorf("%s: got %v, want one error with %q", expr, errs, want)
		}
	}
}
