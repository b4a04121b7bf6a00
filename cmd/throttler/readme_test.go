package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docFile is one page of the guide (README.md, or a file under docs/).
func docFile(t *testing.T, name string) string {
	t.Helper()
	return string(repoFile(t, name))
}

// guidePages are README.md and the guide's pages under docs/, by name.
func guidePages(t *testing.T) map[string]string {
	t.Helper()
	names, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(names) < 10 {
		t.Fatalf("the guide's pages: %v %v", names, err)
	}
	pages := map[string]string{"README.md": docFile(t, "README.md")}
	for _, n := range names {
		rel := strings.TrimPrefix(n, "../../")
		pages[rel] = docFile(t, rel)
	}
	return pages
}

// The API page's enqueue row names every field of a job the OpenAPI
// document has.
func TestAPIPageEnqueueRowNamesEveryField(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any
			}
		}
	}
	if err := json.Unmarshal(repoFile(t, "internal/api/openapi.json"), &doc); err != nil {
		t.Fatal(err)
	}
	row := ""
	for _, line := range strings.Split(docFile(t, "docs/api.md"), "\n") {
		if strings.HasPrefix(line, "| `POST /v1/tenants/{tenant}/jobs` |") {
			row = line
		}
	}
	fields := doc.Components.Schemas["JobRequest"].Properties
	if row == "" || len(fields) < 8 {
		t.Fatalf("no enqueue row in docs/api.md (%d fields in the document)", len(fields))
	}
	for name := range fields {
		if !strings.Contains(row, `"`+name+`"`) {
			t.Errorf("docs/api.md's enqueue row does not name %q", name)
		}
	}
}

// The API page's table has a row for each operation of the OpenAPI
// document and none for an operation it lacks (the metrics and the status
// page are on their own pages), and the page names every error code the
// document has.
func TestAPIPageMatchesTheDocument(t *testing.T) {
	t.Parallel()
	raw := repoFile(t, "internal/api/openapi.json")
	var doc struct {
		Paths map[string]map[string]json.RawMessage
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	section := docFile(t, "docs/api.md")
	inTable := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Z]+ /[^`?]*)[^`]*` \\|").FindAllStringSubmatch(section, -1) {
		inTable[m[1]] = true
	}
	elsewhere := map[string]string{"GET /metrics": "docs/operations.md", "GET /": "docs/access.md", "GET /static/app.js": "docs/access.md"}
	ops := map[string]bool{}
	for path, methods := range doc.Paths {
		for method := range methods {
			if method == "parameters" {
				continue
			}
			op := strings.ToUpper(method) + " " + path
			ops[op] = true
			if where, ok := elsewhere[op]; ok {
				_, p, _ := strings.Cut(op, " ")
				if page := docFile(t, where); !strings.Contains(page, "`"+p+"`") && !strings.Contains(page, "`"+op+"`") {
					t.Errorf("%s does not name %s", where, op)
				}
				continue
			}
			if !inTable[op] {
				t.Errorf("docs/api.md's table has no row for %s", op)
			}
		}
	}
	for op := range inTable {
		if !ops[op] {
			t.Errorf("docs/api.md's table has a row for %s, which the document does not have", op)
		}
	}
	if len(ops) < 15 {
		t.Fatalf("only %d operations in the document", len(ops))
	}
	codes := map[string]bool{}
	for _, m := range regexp.MustCompile(`"error":\s*\{[^}]*?"enum":\s*\[([^\]]*)\]`).FindAllSubmatch(raw, -1) {
		for _, c := range regexp.MustCompile(`"([a-z_0-9]+)"`).FindAllSubmatch(m[1], -1) {
			codes[string(c[1])] = true
		}
	}
	if len(codes) < 30 {
		t.Fatalf("only %d error codes found in the document", len(codes))
	}
	for c := range codes {
		if !strings.Contains(section, "`"+c+"`") && !strings.Contains(section, " "+c+"`") {
			t.Errorf("docs/api.md does not name the error code %s", c)
		}
	}
}

// What the guide tells an operator to do can be done: a running process's
// environment does not change, so a secret from a variable is rotated by
// a restart, one from a file by SIGHUP; and a wait past 60 s is refused,
// not cut short.
func TestGuideInstructionsCanBeFollowed(t *testing.T) {
	t.Parallel()
	rotations, waitRows := 0, 0
	for name, page := range guidePages(t) {
		for _, para := range strings.Split(page, "\n\n") {
			if !strings.HasPrefix(para, "To rotate") {
				continue
			}
			rotations++
			if strings.Contains(para, "set the variable (or file)") || !strings.Contains(para, "restart") || !strings.Contains(para, "SIGHUP") {
				t.Errorf("%s's rotation: %q, want SIGHUP for a file and a restart for a variable", name, para)
			}
		}
		for _, line := range strings.Split(page, "\n") {
			if strings.HasPrefix(line, "| `GET /v1/jobs/{id}?wait=30s` |") {
				waitRows++
				if !strings.Contains(line, "a longer one is refused") {
					t.Errorf("%s's ?wait row does not say a wait past 60 s is refused: %q", name, line)
				}
			}
		}
	}
	if rotations == 0 || waitRows == 0 {
		t.Fatalf("found %d rotation paragraphs and %d ?wait rows in the guide, want both", rotations, waitRows)
	}
}

// Every relative link in the guide reaches a file of the repository, and
// every #anchor a heading of its page (as GitHub makes them: lower case,
// punctuation dropped, spaces as hyphens).
func TestGuideLinksResolve(t *testing.T) {
	t.Parallel()
	pages := guidePages(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	scheme := regexp.MustCompile(`^[a-z]+:`)
	n := 0
	for name, page := range pages {
		for _, m := range link.FindAllStringSubmatch(withoutCode(page), -1) {
			target := m[1]
			if scheme.MatchString(target) {
				continue
			}
			n++
			path, anchor, _ := strings.Cut(target, "#")
			file := name
			if path != "" {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(name), path))
				if _, err := os.Stat("../../" + file); err != nil {
					t.Errorf("%s links to %s, which does not exist", name, target)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			text, ok := pages[file]
			if !ok {
				text = docFile(t, file)
			}
			if !slices.Contains(anchors(text), anchor) {
				t.Errorf("%s links to %s: %s has no heading #%s", name, target, file, anchor)
			}
		}
	}
	if n < 50 {
		t.Fatalf("only %d relative links found in the guide", n)
	}
}

// withoutCode is a page without its fenced code blocks (a link in code is
// not one).
func withoutCode(page string) string {
	var b strings.Builder
	fenced := false
	for line := range strings.Lines(page) {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			b.WriteString(line)
		}
	}
	return b.String()
}

// anchors are the #fragments a page's headings make on GitHub.
func anchors(page string) []string {
	var out []string
	drop := regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
	heading := regexp.MustCompile(`^#{1,6} (.*)`)
	for line := range strings.Lines(withoutCode(page)) {
		if m := heading.FindStringSubmatch(strings.TrimRight(line, "\n")); m != nil {
			out = append(out, strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-"))
		}
	}
	return out
}

// Comments and docs point only at what the repository holds: no issue
// tracker numbers (a reader of the repository cannot open them) and no
// notes kept outside it.
func TestNothingPointsOutsideTheRepository(t *testing.T) {
	t.Parallel()
	outside := regexp.MustCompile(`(?i)\bissues?\s+#?[0-9]+|STYLE` + `\.md|ASYNQ` + `_NOTES|\.\./shared` + `/`)
	text := regexp.MustCompile(`(\.(go|lua|js|html|css|md|toml|ya?ml|json|sh|service)|/Dockerfile|/\.ci/run)$`)
	files := 0
	err := filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "artifacts") {
			return filepath.SkipDir
		}
		if d.IsDir() || !text.MatchString(path) {
			return nil
		}
		files++
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := outside.FindString(line); m != "" {
				t.Errorf("%s:%d names %q, which the repository does not hold", strings.TrimPrefix(path, "../../"), i+1, m)
			}
		}
		return nil
	})
	if err != nil || files < 100 {
		t.Fatalf("walked %d files: %v", files, err)
	}
}

// Every test the guide names as a promise's proof is a test the repository
// has: a test renamed or removed without its line fails here.
func TestGuideNamesOnlyRealTests(t *testing.T) {
	t.Parallel()
	have := map[string]bool{}
	funcs := regexp.MustCompile(`(?m)^func (Test[A-Z]\w*)\(`)
	err := filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		for _, m := range funcs.FindAllSubmatch(b, -1) {
			have[string(m[1])] = true
		}
		return err
	})
	if err != nil || len(have) < 200 {
		t.Fatalf("found %d tests: %v", len(have), err)
	}
	named := regexp.MustCompile("`(Test[A-Z][A-Za-z0-9_]*)")
	n := 0
	for name, page := range guidePages(t) {
		for _, m := range named.FindAllStringSubmatch(page, -1) {
			if n++; !have[m[1]] && m[1] != "TestHooks" { // TestHooks: the Redis store's test-only type
				t.Errorf("%s names %s, which is not a test of the repository", name, m[1])
			}
		}
	}
	if n < 100 {
		t.Fatalf("only %d test names found in the guide", n)
	}
}
