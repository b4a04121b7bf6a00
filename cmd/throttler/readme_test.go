package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// readmeSection is the part of README.md under the heading title, up to
// the next heading of the same level.
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	readme := string(repoFile(t, "README.md"))
	start := strings.Index(readme, "\n"+title+"\n")
	if start < 0 {
		t.Fatalf("README.md has no %q", title)
	}
	level := title[:strings.Index(title, " ")+1]
	rest := readme[start+len(title)+2:]
	if end := strings.Index(rest, "\n"+level); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

// README's API table, the enqueue row, names every field of a job the
// OpenAPI document has.
func TestREADMEEnqueueRowNamesEveryField(t *testing.T) {
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
	for _, line := range strings.Split(readmeSection(t, "## HTTP API"), "\n") {
		if strings.HasPrefix(line, "| `POST /v1/tenants/{tenant}/jobs` |") {
			row = line
		}
	}
	fields := doc.Components.Schemas["JobRequest"].Properties
	if row == "" || len(fields) < 8 {
		t.Fatalf("no enqueue row in README (%d fields in the document)", len(fields))
	}
	for name := range fields {
		if !strings.Contains(row, `"`+name+`"`) {
			t.Errorf("README's enqueue row does not name %q", name)
		}
	}
}

// README's API table has a row for each operation of the OpenAPI document
// and none for an operation it lacks (the metrics and the status page are
// in their own sections), and README's API section names every error code
// the document has.
func TestREADMEAPITableMatchesTheDocument(t *testing.T) {
	t.Parallel()
	raw := repoFile(t, "internal/api/openapi.json")
	var doc struct {
		Paths map[string]map[string]json.RawMessage
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	section := readmeSection(t, "## HTTP API")
	inTable := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Z]+ /[^`?]*)[^`]*` \\|").FindAllStringSubmatch(section, -1) {
		inTable[m[1]] = true
	}
	elsewhere := map[string]string{"GET /metrics": "## Metrics", "GET /": "## Access: tokens, roles, safe defaults", "GET /static/app.js": "## Access: tokens, roles, safe defaults"}
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
				if !strings.Contains(readmeSection(t, where), "`"+p+"`") && !strings.Contains(readmeSection(t, where), "`"+op+"`") {
					t.Errorf("README's %q does not name %s", where, op)
				}
				continue
			}
			if !inTable[op] {
				t.Errorf("README's API table has no row for %s", op)
			}
		}
	}
	for op := range inTable {
		if !ops[op] {
			t.Errorf("README's API table has a row for %s, which the document does not have", op)
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
			t.Errorf("README's API section does not name the error code %s", c)
		}
	}
}

// What README tells an operator to do can be done: a running process's
// environment does not change, so a secret from a variable is rotated by
// a restart, one from a file by SIGHUP; and a wait past 60 s is refused,
// not cut short.
func TestREADMEInstructionsCanBeFollowed(t *testing.T) {
	t.Parallel()
	readme := string(repoFile(t, "README.md"))
	for _, para := range strings.Split(readme, "\n\n") {
		if !strings.HasPrefix(para, "To rotate") {
			continue
		}
		if strings.Contains(para, "set the variable (or file)") || !strings.Contains(para, "restart") || !strings.Contains(para, "SIGHUP") {
			t.Errorf("README's rotation: %q, want SIGHUP for a file and a restart for a variable", para)
		}
	}
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "| `GET /v1/jobs/{id}?wait=30s` |") && !strings.Contains(line, "a longer one is refused") {
			t.Errorf("README's ?wait row does not say a wait past 60 s is refused: %q", line)
		}
	}
}
