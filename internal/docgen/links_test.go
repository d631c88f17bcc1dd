package docgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDocLinks fails on a relative link of README.md, SECURITY.md,
// docs/** or a package README that leads nowhere: a file or directory
// that is not in the repository, or an anchor that is no heading of the
// file it points to.
func TestDocLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	files, err := DocFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "SECURITY.md", "docs/README.md", "docs/bench/README.md", "gateway/README.md"} {
		if !strings.Contains(strings.Join(files, "\n")+"\n", want+"\n") {
			t.Errorf("DocFiles left out %s: %q", want, files)
		}
	}
	if err := CheckLinks(root, files); err != nil {
		t.Error(err)
	}
}

func TestCheckLinks(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Title\n\n"+
		"[guide](docs/guide.md#the-gateways-ports) [dir](docs/) [here](#title) [site](https://example.com/x#y)\n"+
		"[gone](docs/gone.md)\n"+
		"[bad anchor](docs/guide.md#nowhere)\n"+
		"`[in code](docs/gone.md)`\n"+
		"```\n[in a fence](docs/gone.md)\n```\n"+
		"<!-- [in a comment](docs/gone.md) -->\n"+
		"[ref]: docs/missing.md\n")
	write("docs/guide.md", "# Guide\n\n## The gateway's ports\n\n[up](../README.md#title) [out](../../x.md) [self](#guide)\n")

	err := CheckLinks(root, []string{"README.md", "docs/guide.md"})
	if err == nil {
		t.Fatal("no error for broken links")
	}
	var got []string
	for _, line := range strings.Split(err.Error(), "\n") {
		file, rest, _ := strings.Cut(line, ": link ")
		target, _, _ := strings.Cut(rest, ": ")
		got = append(got, file+" "+target)
	}
	want := []string{
		`README.md:4 "docs/gone.md"`,
		`README.md:5 "docs/guide.md#nowhere"`,
		`README.md:11 "docs/missing.md"`,
		`docs/guide.md:5 "../../x.md"`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("broken links (-want +got):\n%s\nerror:\n%v", diff, err)
	}
}

func TestAnchors(t *testing.T) {
	doc := "# Tether operator's guide\n\n" +
		"## node-admission.yaml: what a node may not set for itself\n" +
		"## Flags and `--max-handshakes`\n" +
		"```\n# not a heading\n```\n" +
		"## Ports\n## Ports\n" +
		"#hashtag, no heading\n" +
		"### [Linked](x.md) heading ###\n"
	want := []string{
		"tether-operators-guide",
		"node-admissionyaml-what-a-node-may-not-set-for-itself",
		"flags-and---max-handshakes",
		"ports",
		"ports-1",
		"linked-heading",
	}
	if diff := cmp.Diff(want, Anchors(doc)); diff != "" {
		t.Errorf("Anchors (-want +got):\n%s", diff)
	}
}
