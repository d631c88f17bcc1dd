package docgen

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// DocFiles lists the Markdown files whose links CheckLinks checks, as
// paths relative to root: README.md and SECURITY.md at the root, every
// Markdown file under docs/, and every package's README.md (testdata and
// hidden directories left out).
func DocFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		rel = filepath.ToSlash(rel)
		switch {
		case rel == "SECURITY.md", d.Name() == "README.md",
			strings.HasPrefix(rel, "docs/") && strings.HasSuffix(rel, ".md"):
			files = append(files, rel)
		}
		return nil
	})
	slices.Sort(files)
	return files, err
}

// CheckLinks checks every relative link of the Markdown files (paths
// relative to root): its file or directory must exist, inside root, and
// an anchor (#name) must name a heading of the Markdown file it points to
// (or of the same file). Links to other sites (a scheme, such as https:)
// are not checked. It returns one error per broken link, naming the file
// and line.
func CheckLinks(root string, files []string) error {
	anchors := map[string][]string{} // Markdown file (relative to root) -> its anchors
	anchorsOf := func(rel string) ([]string, error) {
		if a, ok := anchors[rel]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			return nil, err
		}
		a := Anchors(string(b))
		anchors[rel] = a
		return a, nil
	}
	var errs []error
	for _, file := range files {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, l := range Links(string(b)) {
			if err := checkLink(root, file, l.Target, anchorsOf); err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: link %q: %w", file, l.Line, l.Target, err))
			}
		}
	}
	return errors.Join(errs...)
}

func checkLink(root, file, target string, anchorsOf func(string) ([]string, error)) error {
	u, err := url.Parse(target)
	if err != nil {
		return err
	}
	if u.Scheme != "" || u.Host != "" {
		return nil // another site
	}
	rel := file
	if u.Path != "" {
		if strings.HasPrefix(u.Path, "/") {
			return errors.New("an absolute path: make it relative to the file")
		}
		rel = filepath.ToSlash(filepath.Join(filepath.Dir(file), u.Path))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return errors.New("points outside the repository")
		}
		st, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			return errors.New("no such file or directory")
		}
		if st.IsDir() {
			if u.Fragment != "" {
				return errors.New("an anchor in a directory")
			}
			return nil
		}
	}
	if u.Fragment == "" {
		return nil
	}
	if !strings.HasSuffix(rel, ".md") {
		return nil // an anchor into a source file: a line, not a heading
	}
	a, err := anchorsOf(rel)
	if err != nil {
		return err
	}
	if !slices.Contains(a, u.Fragment) {
		return fmt.Errorf("%s has no heading with the anchor #%s", rel, u.Fragment)
	}
	return nil
}

// Link is a link of a Markdown file: its target and the line it is on.
type Link struct {
	Target string
	Line   int
}

var (
	inlineLinkRE = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLinkRE    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	codeSpanRE   = regexp.MustCompile("`+[^`]*`+")
	commentRE    = regexp.MustCompile(`(?s)<!--.*?-->`)
)

// Links returns the link targets of a Markdown document, inline
// ([text](target)) and reference definitions ([name]: target), leaving
// out fenced code blocks, code spans and HTML comments.
func Links(doc string) []Link {
	// Blank out comments, keeping their newlines so that line numbers hold.
	doc = commentRE.ReplaceAllStringFunc(doc, func(c string) string {
		return strings.Repeat("\n", strings.Count(c, "\n"))
	})
	var out []Link
	fence := ""
	for i, line := range strings.Split(doc, "\n") {
		t := strings.TrimLeft(line, " ")
		if f := fenceOf(t); f != "" {
			switch {
			case fence == "":
				fence = f
			case strings.HasPrefix(t, fence) && strings.TrimSpace(strings.TrimLeft(t, fence[:1])) == "":
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		line = codeSpanRE.ReplaceAllString(line, "")
		for _, m := range inlineLinkRE.FindAllStringSubmatch(line, -1) {
			out = append(out, Link{Target: m[1], Line: i + 1})
		}
		if m := refLinkRE.FindStringSubmatch(line); m != nil {
			out = append(out, Link{Target: m[1], Line: i + 1})
		}
	}
	return out
}

// fenceOf is the fence a line opens or closes (``` or ~~~, or longer),
// or "".
func fenceOf(line string) string {
	for _, c := range []string{"`", "~"} {
		n := len(line) - len(strings.TrimLeft(line, c))
		if n >= 3 {
			return strings.Repeat(c, n)
		}
	}
	return ""
}

// Anchors returns the anchors of a Markdown document's ATX headings as
// GitHub makes them: the heading's text without its Markdown, lower case,
// letters, digits, spaces, hyphens and underscores kept, spaces made
// hyphens; a repeated anchor gets -1, -2, ...
func Anchors(doc string) []string {
	var out []string
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(doc, "\n") {
		t := strings.TrimLeft(line, " ")
		if f := fenceOf(t); f != "" {
			switch {
			case fence == "":
				fence = f
			case strings.HasPrefix(t, fence):
				fence = ""
			}
			continue
		}
		if fence != "" || !strings.HasPrefix(t, "#") {
			continue
		}
		text := strings.TrimLeft(t, "#")
		if len(t)-len(text) > 6 || (text != "" && text[0] != ' ') {
			continue
		}
		a := Slug(text)
		if n, ok := seen[a]; ok {
			seen[a] = n + 1
			a = fmt.Sprintf("%s-%d", a, n+1)
		} else {
			seen[a] = 0
		}
		out = append(out, a)
	}
	return out
}

var mdLinkTextRE = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// Slug is the anchor GitHub makes of a heading's text.
func Slug(heading string) string {
	heading = strings.TrimSpace(strings.TrimRight(strings.TrimSpace(heading), "#"))
	heading = mdLinkTextRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
