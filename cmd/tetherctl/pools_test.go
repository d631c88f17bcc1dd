package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/internal/statusapi"
)

// dedent drops the leading newline and the tabs that indent a golden
// text in the test's source.
func dedent(s string) string {
	s = strings.TrimPrefix(s, "\n")
	return regexp.MustCompile(`(?m)^\t+`).ReplaceAllString(s, "")
}

func TestPoolsTable(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	ps := []cloudPool{
		{Pool: "depot", Members: []string{"edge-4"},
			Election: &poolRecord{Holder: "edge-4", Renewed: ago(3 * time.Second), Expires: now.Add(12 * time.Second)},
			Sync:     &poolRecord{Holder: "edge-4", Renewed: ago(7 * time.Second), Expires: now.Add(23 * time.Second)}},
		{Pool: "lab", Members: []string{"lab-1"}},
		// A new leader that has not synced yet: the old one's record.
		{Pool: "shop", Members: []string{"edge-1", "edge-2", "edge-3"}, Delegated: []string{"edge-1", "edge-3"}, Tainted: []string{"edge-1"},
			Election: &poolRecord{Holder: "edge-2", Renewed: ago(1500 * time.Millisecond)},
			Sync:     &poolRecord{Holder: "edge-1", Renewed: ago(2 * time.Minute), Expired: true}},
		{Pool: "yard", Members: []string{"yard-1", "yard-2"},
			Election: &poolRecord{Holder: "yard-1", Renewed: ago(26*time.Hour + 3*time.Minute), Expired: true}},
	}
	for _, tc := range []struct {
		wide bool
		want string
	}{
		{false, `
			POOL   MEMBERS  LEADER            RENEWED      LAST SYNC                   DELEGATED      TAINTED
			depot  1        edge-4            3s ago       7s ago                      -              -
			lab    1        none              -            -                           -              -
			shop   3        edge-2            2s ago       2m0s ago by edge-1 (stale)  edge-1,edge-3  edge-1
			yard   2        yard-1 (expired)  26h3m0s ago  -                           -              -
			`},
		{true, `
			POOL   MEMBERS  LEADER            RENEWED      LAST SYNC                   DELEGATED      TAINTED  NODES
			depot  1        edge-4            3s ago       7s ago                      -              -        edge-4
			lab    1        none              -            -                           -              -        lab-1
			shop   3        edge-2            2s ago       2m0s ago by edge-1 (stale)  edge-1,edge-3  edge-1   edge-1,edge-2,edge-3
			yard   2        yard-1 (expired)  26h3m0s ago  -                           -              -        yard-1,yard-2
			`},
	} {
		var b bytes.Buffer
		writePoolsTable(&b, ps, now, tc.wide)
		if d := cmp.Diff(dedent(tc.want), b.String()); d != "" {
			t.Errorf("wide=%v (-want +got):\n%s", tc.wide, d)
		}
	}

	var b bytes.Buffer
	writePoolsTable(&b, nil, now, false)
	if want := "no node pools: no Node has the label apps.openyurt.io/nodepool\n"; b.String() != want {
		t.Errorf("no pools: %q, want %q", b.String(), want)
	}
}

// recordedStatus is a /status that a real tether-edge served (testdata).
func recordedStatus(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serveEdge serves body as an edge's /status.
func serveEdge(t *testing.T, body []byte) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// edgeWithoutPool is the /status of an edge that runs no node pool.
var edgeWithoutPool = []byte(`{"node":"edge-9","version":"dev","gateways":[]}`)

func TestEdgePoolsTable(t *testing.T) {
	// When the recording was made: the leader's last sync was 6 s old.
	now := time.Date(2026, 11, 22, 3, 45, 28, 900e6, time.UTC)
	var eps []edgePool
	for _, name := range []string{"edge-status-follower.json", "edge-status-leader.json"} {
		var ep edgePool
		if err := json.Unmarshal(recordedStatus(t, name), &ep); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
	}
	// A follower whose stream broke, 3 revisions behind.
	var behind edgePool
	json.Unmarshal(recordedStatus(t, "edge-status-follower.json"), &behind)
	behind.Node, behind.Pool.Fresh, behind.Pool.SyncedAt = "edge-3", false, now.Add(-41*time.Second)
	behind.Pool.Replication.Connected, behind.Pool.Replication.Lag, behind.Pool.Replication.LastError = false, 3, "dial edge-2: connection refused"
	eps = append(eps, behind, edgePool{Node: "edge-9"})

	for _, tc := range []struct {
		wide bool
		want string
	}{
		{false, `
			NODE    POOL  ROLE      LEADER  EPOCH                       REV  OBJECTS  LAST SYNC  FRESH  LAG               DIGEST
			edge-1  shop  follower  edge-2  edge-2/1795319110830318721  56   53       6s ago     yes    0                 d0cbf0cb121d
			edge-2  shop  leader    edge-2  edge-2/1795319110830318721  56   53       6s ago     yes    -                 d0cbf0cb121d
			edge-3  shop  follower  edge-2  edge-2/1795319110830318721  56   53       41s ago    no     3 (disconnected)  d0cbf0cb121d
			edge-9  -     off       -       -                           -    -        -          -      -                 -
			`},
		{true, `
			NODE    POOL  ROLE      LEADER  EPOCH                       REV  OBJECTS  LAST SYNC  FRESH  LAG               DIGEST                                                            CONNECTED  RESYNCS  LAST ERROR
			edge-1  shop  follower  edge-2  edge-2/1795319110830318721  56   53       6s ago     yes    0                 d0cbf0cb121dfa8f72a9c06567b5f6ce8fd30ce7fa4e16944a352ce8bf1c7154  true       1        -
			edge-2  shop  leader    edge-2  edge-2/1795319110830318721  56   53       6s ago     yes    -                 d0cbf0cb121dfa8f72a9c06567b5f6ce8fd30ce7fa4e16944a352ce8bf1c7154  -          -        -
			edge-3  shop  follower  edge-2  edge-2/1795319110830318721  56   53       41s ago    no     3 (disconnected)  d0cbf0cb121dfa8f72a9c06567b5f6ce8fd30ce7fa4e16944a352ce8bf1c7154  false      1        dial edge-2: connection refused
			edge-9  -     off       -       -                           -    -        -          -      -                 -                                                                 -          -        -
			`},
	} {
		var b bytes.Buffer
		writeEdgePoolsTable(&b, eps, now, tc.wide)
		if d := cmp.Diff(dedent(tc.want), b.String()); d != "" {
			t.Errorf("wide=%v (-want +got):\n%s", tc.wide, d)
		}
	}
}

// maskAges replaces "6s ago", "1h2m3s ago" by "AGE ago": the tests' clock
// is not the recording's.
func maskAges(s string) string {
	return regexp.MustCompile(`\b[0-9hms.]+s ago\b`).ReplaceAllString(s, "AGE ago")
}

// cells splits a table printed by tabwriter into its cells (columns are at
// least two spaces apart; cells may hold single spaces).
func cells(table string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		rows = append(rows, regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1))
	}
	return rows
}

func TestPoolsEdge(t *testing.T) {
	follower := serveEdge(t, recordedStatus(t, "edge-status-follower.json"))
	leader := serveEdge(t, recordedStatus(t, "edge-status-leader.json"))
	off := serveEdge(t, edgeWithoutPool)
	edges := follower + "," + strings.TrimPrefix(leader, "http://") + "," + off

	code, out, errOut := runCtl("pools", "--edge", edges)
	if code != exitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	want := [][]string{
		{"NODE", "POOL", "ROLE", "LEADER", "EPOCH", "REV", "OBJECTS", "LAST SYNC", "FRESH", "LAG", "DIGEST"},
		{"edge-1", "shop", "follower", "edge-2", "edge-2/1795319110830318721", "56", "53", "AGE ago", "yes", "0", "d0cbf0cb121d"},
		{"edge-2", "shop", "leader", "edge-2", "edge-2/1795319110830318721", "56", "53", "AGE ago", "yes", "-", "d0cbf0cb121d"},
		{"edge-9", "-", "off", "-", "-", "-", "-", "-", "-", "-", "-"},
	}
	if d := cmp.Diff(want, cells(maskAges(out))); d != "" {
		t.Errorf("table (-want +got):\n%s\n%s", d, out)
	}

	code, out, errOut = runCtl("-o", "json", "pools", "--edge", edges)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got []edgePool
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	var st struct{ Pool *statusapi.Pool }
	json.Unmarshal(recordedStatus(t, "edge-status-follower.json"), &st)
	if len(got) != 3 || got[0].Edge != follower || got[0].Node != "edge-1" || !cmp.Equal(got[0].Pool, st.Pool) ||
		got[1].Edge != leader || got[2].Edge != off || got[2].Pool != nil {
		t.Errorf("-o json: want the edges' URLs, nodes and pool parts, sorted by node:\n%s", out)
	}
	if !strings.Contains(out, `"pool": null`) {
		t.Errorf("an edge without a pool has \"pool\": null:\n%s", out)
	}
}

func TestPoolsEdgeErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	live := serveEdge(t, recordedStatus(t, "edge-status-leader.json"))
	gw := serveStatus(t, statusapi.Gateway{Replica: "gw1"})

	code, out, errOut := runCtl("pools", "--edge", dead+","+live+","+gw)
	if code != exitError {
		t.Errorf("exit %d, want %d", code, exitError)
	}
	for _, want := range []string{
		"tetherctl: edge http://" + dead + " unreachable", "connection refused", "tether-edge running", "127.0.0.1:10267", "SSH tunnel",
		"tetherctl: edge " + gw + ": /status has no node name: not a tether-edge status",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q lacks %q", errOut, want)
		}
	}
	if rows := cells(out); len(rows) != 2 || rows[1][0] != "edge-2" {
		t.Errorf("the reachable edge is still shown, and only it:\n%s", out)
	}

	code, out, _ = runCtl("pools", "-o", "json", "--edge", dead)
	if code != exitError || strings.TrimSpace(out) != "[]" {
		t.Errorf("-o json with no edge answering: exit %d, stdout %q; want 1 and []", code, out)
	}
}

func TestNormalizeEdge(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1":              "http://127.0.0.1:10267",
		"127.0.0.1:20267":        "http://127.0.0.1:20267",
		":10268":                 "http://127.0.0.1:10268",
		"edge-1.example.com":     "http://edge-1.example.com:10267",
		"http://10.0.1.5/":       "http://10.0.1.5:10267",
		"https://10.0.1.5:8443":  "https://10.0.1.5:8443",
		" [fd00::5] ":            "http://[fd00::5]:10267",
		"http://[fd00::5]:10267": "http://[fd00::5]:10267",
	} {
		if got := normalizeEdge(in); got != want {
			t.Errorf("normalizeEdge(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPoolsNoKubeconfig(t *testing.T) {
	// client-go reads $HOME once, when it starts: ~/.kube/config is this
	// user's.
	if _, err := os.Stat(clientcmd.RecommendedHomeFile); err == nil {
		t.Skipf("%s exists", clientcmd.RecommendedHomeFile)
	}
	home := t.TempDir()
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a pod
	code, out, errOut := runCtl("pools")
	if code != exitError || out != "" {
		t.Errorf("exit %d, stdout %q; want %d and nothing", code, out, exitError)
	}
	for _, want := range []string{"tetherctl pools: no kubeconfig found (looked for " + clientcmd.RecommendedHomeFile + ")", "--kubeconfig", "$KUBECONFIG", "--edge"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q lacks %q", errOut, want)
		}
	}

	missing := filepath.Join(home, "nope.kubeconfig")
	code, _, errOut = runCtl("pools", "--kubeconfig", missing)
	if code != exitError || !strings.Contains(errOut, "kubeconfig "+missing) || !strings.Contains(errOut, "no such file") {
		t.Errorf("--kubeconfig %s: exit %d, stderr %q", missing, code, errOut)
	}

	// $KUBECONFIG replaces ~/.kube/config; client-go skips its files that
	// do not exist.
	t.Setenv("KUBECONFIG", missing)
	code, _, errOut = runCtl("pools")
	if code != exitError || !strings.Contains(errOut, "no kubeconfig found (looked for "+missing+")") {
		t.Errorf("$KUBECONFIG=%s: exit %d, stderr %q", missing, code, errOut)
	}
}
