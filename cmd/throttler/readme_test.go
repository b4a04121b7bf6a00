package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
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

// README's configuration reference has every key a config file takes:
// each as `section.key`, or in the row of its section, as `key`.
func TestREADMEConfigurationReferenceHasEveryKey(t *testing.T) {
	t.Parallel()
	ref := readmeSection(t, "## Configuration reference")
	rows := strings.Split(ref, "\n")
	listed := func(prefix, key string) bool {
		if strings.Contains(ref, "`"+prefix+key+"`") {
			return true
		}
		for _, row := range rows {
			if strings.HasPrefix(row, "| `"+prefix) && strings.Contains(strings.SplitN(row, " | ", 2)[0], "`"+key+"`") {
				return true
			}
		}
		return false
	}
	sections := map[string]reflect.Type{
		"server.": reflect.TypeFor[config.Server](), "store.": reflect.TypeFor[config.Store](),
		"dispatch.": reflect.TypeFor[config.Dispatch](), "log.": reflect.TypeFor[config.Log](),
		"callbacks.": reflect.TypeFor[config.Callbacks](), "downstreams.NAME.": reflect.TypeFor[config.Downstream](),
		"tenant_defaults.": reflect.TypeFor[config.TenantSettings](),
	}
	n := 0
	for prefix, typ := range sections {
		for f := range typ.Fields() {
			key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if key == "" || key == "-" || f.Type == reflect.TypeFor[config.InlineSecret]() {
				continue // an inline secret is a key the config refuses, saying what to write
			}
			n++
			if !listed(prefix, key) {
				t.Errorf("README's configuration reference lacks %s%s", prefix, key)
			}
		}
	}
	if n < 40 {
		t.Fatalf("only %d keys found in the config's types", n)
	}
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
