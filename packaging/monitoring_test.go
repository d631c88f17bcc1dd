// Package packaging_test tests what packaging/ ships for operators that Go
// can check: the alerting rules and dashboards of packaging/monitoring.
package packaging_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/tether-edge/tether/internal/docgen"
)

const (
	alertsFile     = "monitoring/alerts.yaml"
	alertTestsFile = "monitoring/alerts_test.yaml"
	dashboardDir   = "monitoring/grafana"
)

// dashboardPrograms says whose metrics each dashboard shows.
var dashboardPrograms = map[string]string{
	"gateways.json": "tether-gateway",
	"edges.json":    "tether-edge",
}

// promtool returns the promtool that tools/build-testbins.sh builds (or
// $PROMTOOL). Outside CI a missing promtool skips the test; in CI (CI set)
// it fails it, so that CI never passes by skipping.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	mod, err := os.ReadFile("../tools/promtool/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require github\.com/prometheus/prometheus (\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("tools/promtool/go.mod requires no github.com/prometheus/prometheus")
	}
	cache := os.Getenv("TETHER_CACHE_DIR")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(home, ".cache", "tether")
	}
	p := filepath.Join(cache, "promtool-"+string(m[1]), "promtool")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("promtool is not built (%s): CI must run `make testbins` (tools/build-testbins.sh) before the tests", p)
	}
	t.Skipf("promtool is not built (%s): run `make testbins` (tools/build-testbins.sh builds it once, about 5 minutes) or set PROMTOOL", p)
	return ""
}

func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

// TestAlertRules checks the rule file and runs its unit tests.
func TestAlertRules(t *testing.T) {
	runPromtool(t, "monitoring", "check", "rules", filepath.Base(alertsFile))
	runPromtool(t, "monitoring", "test", "rules", filepath.Base(alertTestsFile))
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestAlertRulesConventions checks what promtool does not: every alert has
// a severity and a one-line runbook, and alerts_test.yaml tests it both
// firing and quiet.
func TestAlertRulesConventions(t *testing.T) {
	var rules ruleFile
	readYAML(t, alertsFile, &rules)
	var tests struct {
		RuleFiles          []string `json:"rule_files"`
		EvaluationInterval string   `json:"evaluation_interval"`
		Tests              []struct {
			Name          string            `json:"name"`
			Interval      string            `json:"interval"`
			InputSeries   []json.RawMessage `json:"input_series"`
			AlertRuleTest []struct {
				EvalTime  string            `json:"eval_time"`
				Alertname string            `json:"alertname"`
				ExpAlerts []json.RawMessage `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	readYAML(t, alertTestsFile, &tests)
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, tg := range tests.Tests {
		for _, at := range tg.AlertRuleTest {
			if len(at.ExpAlerts) > 0 {
				firing[at.Alertname] = true
			} else {
				quiet[at.Alertname] = true
			}
		}
	}
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s: two alerts of that name", r.Alert)
			}
			seen[r.Alert] = true
			if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, s)
			}
			if rb := r.Annotations["runbook"]; rb == "" || strings.Contains(rb, "\n") {
				t.Errorf("%s: want a runbook annotation of one line, got %q", r.Alert, rb)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary annotation", r.Alert)
			}
			if !firing[r.Alert] {
				t.Errorf("%s: %s never expects it to fire", r.Alert, alertTestsFile)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: %s never expects it to stay quiet", r.Alert, alertTestsFile)
			}
		}
	}
	for name := range firing {
		if !seen[name] {
			t.Errorf("%s tests %s, which %s does not define", alertTestsFile, name, alertsFile)
		}
	}
}

// dashboard is what the tests read of a Grafana dashboard.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID        string      `json:"refId"`
		Expr         string      `json:"expr"`
		LegendFormat string      `json:"legendFormat"`
		Datasource   *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboards(t *testing.T) map[string]dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = d
	}
	if len(out) != len(dashboardPrograms) {
		t.Fatalf("%s holds %d dashboards, dashboardPrograms names %d: keep them in step", dashboardDir, len(out), len(dashboardPrograms))
	}
	return out
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// TestDashboards checks the dashboards' structure: unique uid, a
// Prometheus data source variable that every query uses, unique panel ids,
// panels inside the 24-column grid, a query in every panel.
func TestDashboards(t *testing.T) {
	uids := map[string]string{}
	for name, d := range readDashboards(t) {
		t.Run(name, func(t *testing.T) {
			if _, ok := dashboardPrograms[name]; !ok {
				t.Errorf("no program for %s in dashboardPrograms", name)
			}
			if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 {
				t.Errorf("want uid, title and schemaVersion; got %q, %q, %d", d.UID, d.Title, d.SchemaVersion)
			}
			if other, ok := uids[d.UID]; ok {
				t.Errorf("uid %q is also %s's", d.UID, other)
			}
			uids[d.UID] = name
			var hasDS bool
			for _, v := range d.Templating.List {
				if v.Name == "datasource" {
					var q string
					json.Unmarshal(v.Query, &q)
					hasDS = v.Type == "datasource" && q == "prometheus"
				} else if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
					t.Errorf("variable %s: data source %+v, want uid ${datasource}", v.Name, v.Datasource)
				}
			}
			if !hasDS {
				t.Error("no variable datasource of type datasource (query prometheus)")
			}
			ids := map[int]bool{}
			for _, p := range allPanels(d.Panels) {
				if ids[p.ID] {
					t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
				}
				ids[p.ID] = true
				if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
					t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, g)
				}
				if p.Type == "row" {
					continue
				}
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q: data source %+v, want uid ${datasource}", p.Title, p.Datasource)
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %q: no query", p.Title)
				}
				for _, q := range p.Targets {
					if q.Expr == "" || q.Datasource == nil || q.Datasource.UID != "${datasource}" {
						t.Errorf("panel %q, query %s: want an expression and data source ${datasource}", p.Title, q.RefID)
					}
				}
			}
		})
	}
}

// grafanaVars replaces the dashboards' variables by values that make the
// query plain PromQL.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${datasource}", "x", "$datasource", "x", "$job", "x", "$instance", "x", "$pool", "x",
)

// labelValuesRE splits a label_values(selector, label) variable query.
var labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)

// dashboardQuery is one PromQL expression of a dashboard, with the labels
// it must provide (legend, variable).
type dashboardQuery struct {
	where, expr string
	labels      []string
}

func dashboardQueries(t *testing.T, d dashboard) []dashboardQuery {
	t.Helper()
	var qs []dashboardQuery
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: query: %v", v.Name, err)
		}
		m := labelValuesRE.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
		}
		qs = append(qs, dashboardQuery{"variable " + v.Name, grafanaVars.Replace(m[1]), []string{m[2]}})
	}
	for _, p := range allPanels(d.Panels) {
		for _, q := range p.Targets {
			var legend []string
			for _, m := range regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`).FindAllStringSubmatch(q.LegendFormat, -1) {
				legend = append(legend, m[1])
			}
			qs = append(qs, dashboardQuery{fmt.Sprintf("panel %q query %s", p.Title, q.RefID), grafanaVars.Replace(q.Expr), legend})
		}
	}
	return qs
}

// TestDashboardQueries has promtool parse every query of the dashboards
// (as recording rules of a file written for it).
func TestDashboardQueries(t *testing.T) {
	var rules ruleFile
	rules.Groups = append(rules.Groups, struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	}{Name: "dashboards"})
	var where []string
	dashboards := readDashboards(t)
	for _, name := range slices.Sorted(maps.Keys(dashboards)) {
		for _, q := range dashboardQueries(t, dashboards[name]) {
			rules.Groups[0].Rules = append(rules.Groups[0].Rules, rule{Record: fmt.Sprintf("dashboard:query:%d", len(where)), Expr: q.expr})
			where = append(where, name+", "+q.where)
		}
	}
	b, err := json.Marshal(rules) // JSON is YAML
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboards.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool(t), "check", "rules", "--lint=none", "dashboards.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		// Say which query each rule promtool names is.
		msg := regexp.MustCompile(`dashboard:query:(\d+)`).ReplaceAllStringFunc(string(out), func(r string) string {
			i, _ := strconv.Atoi(strings.TrimPrefix(r, "dashboard:query:"))
			return where[i]
		})
		t.Fatalf("promtool check rules: %v\n%s", err, msg)
	}
	t.Logf("promtool parsed %d dashboard queries", len(where))
}

// templateLabelRE finds the labels an annotation template names.
var templateLabelRE = regexp.MustCompile(`\$labels\.([A-Za-z_][A-Za-z0-9_]*)`)

// TestMetricNames fails when an alert or a dashboard names a metric, or a
// label of one, that the program does not export, and when
// docs/reference/metrics.md's metric table (generated: make generate
// writes it, by running this test with -update) differs from what they
// export. What the programs export is
// read from their own registrations (exported_test.go), not from any
// document.
func TestMetricNames(t *testing.T) {
	gw, edge := exportedByPrograms(t)
	programs := map[string]exported{"tether-gateway": gw, "tether-edge": edge}
	t.Logf("tether-gateway exports %d metrics, tether-edge %d", len(gw), len(edge))

	t.Run("alerts", func(t *testing.T) {
		var rules ruleFile
		readYAML(t, alertsFile, &rules)
		for _, g := range rules.Groups {
			e, ok := programs[g.Name]
			if !ok {
				t.Errorf("group %s: name it after the program whose metrics it watches (tether-gateway or tether-edge)", g.Name)
				continue
			}
			for _, r := range g.Rules {
				var also []string
				for _, a := range r.Annotations {
					for _, m := range templateLabelRE.FindAllStringSubmatch(a, -1) {
						also = append(also, m[1])
					}
				}
				for _, err := range checkExpr(e, r.Expr, also...) {
					t.Errorf("%s %s: %v", alertsFile, r.Alert+r.Record, err)
				}
			}
		}
	})

	t.Run("dashboards", func(t *testing.T) {
		for name, d := range readDashboards(t) {
			e := programs[dashboardPrograms[name]]
			if e == nil {
				t.Errorf("%s: no program in dashboardPrograms", name)
				continue
			}
			for _, q := range dashboardQueries(t, d) {
				for _, err := range checkExpr(e, q.expr, q.labels...) {
					t.Errorf("%s, %s: %v", name, q.where, err)
				}
			}
		}
	})

	t.Run("reference", func(t *testing.T) {
		table, err := metricTable([]string{"tether-gateway", "tether-edge"}, programs)
		if err != nil {
			t.Fatal(err)
		}
		if err := docgen.UpdateRegion("../docs/reference/metrics.md", "metrics", table, *update); err != nil {
			t.Error(err)
		}
	})
}
