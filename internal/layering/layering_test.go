package layering

import (
	"encoding/json"
	"io"
	"os/exec"
	"path"
	"strings"
	"testing"
)

const module = "github.com/tether-edge/tether"

// rule forbids packages matching from (a path below the module, "..."
// for the whole subtree) to depend, directly or not, on any package of
// deny but those of allow. Test files are not production code and are not
// checked.
type rule struct {
	from  string
	deny  []string
	why   string
	allow []string
}

var rules = []rule{
	{"gateway/...", []string{"edgeproxy/..."}, "the two programs never import each other: what they share lives below both (tunnel, poolstore, internal/openyurt)", nil},
	{"edgeproxy/...", []string{"gateway/..."}, "the two programs never import each other", nil},
	{"tunnel/...", []string{"gateway/...", "edgeproxy/...", "internal/cli"}, "the wire protocol knows neither side", nil},
	{"netrules/...", []string{"gateway/...", "edgeproxy/...", "internal/cli", "poolstore/..."}, "netrules knows nothing of the programs that use it", nil},
	{"poolstore/...", []string{"gateway/...", "edgeproxy/...", "internal/cli"}, "poolstore knows nothing of the programs that use it (it takes their parts as small interfaces)", nil},
	{"internal/openyurt", []string{"..."}, "the shared names are a leaf: every layer may import them", nil},
	{"poolstore/record", []string{"..."}, "the pool's record contract is a leaf: the gateway links it without the pool's store, bbolt or serving", nil},
	{"poolstore/serve", []string{"poolstore/...", "tunnel/...", "internal/kube"}, "serving the replica to the node's components needs only the replica: it knows neither how it is filled nor the cloud or the peers", []string{"poolstore/replica", "poolstore/feed"}},
	{"poolstore/replica", []string{"poolstore/...", "tunnel/...", "internal/kube"}, "the replica is below the rest of the pool: the source, replication and serving build on it, and it knows none of them, the cloud or the peers", []string{"poolstore/feed"}},
	{"poolstore/feed", []string{"..."}, "the signed feed's contract is a leaf: the gateway signs with it and the edge verifies with it, without the pool's store, bbolt or serving", nil},
	{"internal/statusapi", []string{"..."}, "the /status contract is a leaf: the programs fill it and its readers import it alone", nil},
	{"internal/localapi", []string{"gateway/...", "edgeproxy/...", "poolstore/...", "internal/cli"}, "serving kube-apiserver reads from a local store is one engine that the offline cache and the pool replica both use: it knows neither program nor either store", nil},
	{"internal/edgeaccess", []string{"..."}, "the edge-access mark is a leaf: the gateway and tether-edge read it alike", nil},
	{"internal/promreg", []string{"..."}, "registering a part's metrics is a leaf: every layer may import it", nil},
	{"internal/component", []string{"..."}, "the parts' lifecycle (run, stop in order, ready, status) is a leaf: both programs build on it and it knows none of their parts", nil},
	{"cmd/tetherctl", []string{"gateway/...", "edgeproxy/..."}, "tetherctl reads the programs' /status through internal/statusapi: " +
		"importing a program would link it into the operator's tool and let the contract follow its internals " +
		"(gateway/selfca, a leaf, names the self-managed CA's files that `tetherctl ca` reads)", []string{"gateway/selfca"}},
	{"...", []string{"internal/testenv", "internal/deptest", "gateway/internal/edgetest", "gateway/internal/metrictest", "gateway/internal/pooltest"}, "no production package imports test support", nil},
}

// exempt lists packages whose whole job is to drive the others in tests
// and benchmarks.
var exempt = []string{"e2e/...", "internal/testenv/...", "internal/deptest", "gateway/internal/edgetest", "gateway/internal/metrictest", "gateway/internal/pooltest", "internal/layering", "tools/..."}

type pkg struct {
	ImportPath string
	Deps       []string
}

// TestLayering fails on a wrong arrow, naming the chain's two ends and the
// rule's reason.
func TestLayering(t *testing.T) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Deps", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 30 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	checked := 0
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if matchAny(rel, exempt) {
			continue
		}
		for _, r := range rules {
			if !match(rel, r.from) {
				continue
			}
			checked++
			for _, d := range p.Deps {
				drel, ok := strings.CutPrefix(d, module+"/")
				if !ok || drel == rel {
					continue
				}
				if r.forbids(drel) {
					t.Errorf("%s depends on %s: %s", rel, drel, r.why)
				}
			}
		}
	}
	if checked < 30 {
		t.Errorf("only %d package/rule pairs checked; the rules no longer match the tree", checked)
	}
}

// TestLayeringCatchesAWrongArrow: the matcher sees a dependency a rule
// forbids (a guard against a test that can no longer fail).
func TestLayeringCatchesAWrongArrow(t *testing.T) {
	for _, c := range []struct {
		pkg, dep string
		want     bool
	}{
		{"gateway/topology", "edgeproxy/filter", true},
		{"poolstore", "internal/cli", true},
		{"cmd/tetherctl", "internal/testenv", true},
		{"internal/openyurt", "internal/kube", true},
		{"gateway/topology", "internal/openyurt", false},
		{"poolstore", "internal/kube", false},
		{"cmd/tetherctl", "gateway", true},
		{"cmd/tetherctl", "gateway/nodewatch", true},
		{"cmd/tetherctl", "edgeproxy", true},
		{"cmd/tetherctl", "edgeproxy/edgetunnel", true},
		{"internal/statusapi", "gateway/nodewatch", true},
		{"cmd/tetherctl", "gateway/selfca", false},
		{"cmd/tetherctl", "internal/statusapi", false},
		{"gateway", "internal/statusapi", false},
		{"internal/component", "internal/statusapi", true},
		{"edgeproxy", "internal/component", false},
		{"internal/localapi", "poolstore", true},
		{"internal/localapi", "edgeproxy/cache", true},
		{"poolstore", "internal/localapi", false},
		{"edgeproxy/apiproxy", "internal/localapi", false},
		{"poolstore/record", "internal/kube", true},
		{"gateway/election", "poolstore/record", false},
		{"poolstore/replica", "poolstore", true},
		{"poolstore/replica", "poolstore/record", true},
		{"poolstore/replica", "internal/localapi", false},
		{"poolstore", "poolstore/replica", false},
		{"poolstore/serve", "poolstore", true},
		{"poolstore/serve", "poolstore/elect", true},
		{"poolstore/serve", "poolstore/replica", false},
		{"poolstore/replica", "poolstore/serve", true},
		{"tunnel", "internal/promreg", false},
		{"internal/promreg", "internal/kube", true},
	} {
		got := false
		for _, r := range rules {
			if match(c.pkg, r.from) && r.forbids(c.dep) {
				got = true
			}
		}
		if got != c.want {
			t.Errorf("%s -> %s forbidden: %v, want %v", c.pkg, c.dep, got, c.want)
		}
	}
}

// forbids reports whether r forbids a dependency on dep.
func (r rule) forbids(dep string) bool {
	return matchAny(dep, r.deny) && !matchAny(dep, r.allow)
}

func matchAny(rel string, patterns []string) bool {
	for _, p := range patterns {
		if match(rel, p) {
			return true
		}
	}
	return false
}

// match reports whether rel is pattern, or below it for "x/...", or
// anything for "...".
func match(rel, pattern string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return rel == base || strings.HasPrefix(rel, base+"/")
	}
	return rel == path.Clean(pattern)
}
