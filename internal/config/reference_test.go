package config

import (
	"encoding"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// referenceRows reads the configuration reference (docs/configuration.md):
// each row's keys (its first cell's backquoted names; a name without a dot
// after the first takes the first's section, as in "`callbacks.min_backoff`,
// `max_backoff`") and the whole row's text.
func referenceRows(t *testing.T) map[string]string {
	t.Helper()
	page, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(page)
	name := regexp.MustCompile("`([^`]+)`")
	rows := map[string]string{}
	for line := range strings.Lines(section) {
		cells := strings.Split(line, " | ")
		if !strings.HasPrefix(line, "| `") || len(cells) < 2 {
			continue
		}
		prefix := ""
		for _, m := range name.FindAllStringSubmatch(cells[0], -1) {
			key := m[1]
			if i := strings.LastIndex(key, "."); i >= 0 {
				prefix = key[:i+1]
			} else {
				key = prefix + key
			}
			rows[key] = line
		}
	}
	return rows
}

// Every key the config file takes has its row in the configuration
// reference, and every row names a key the file takes: a key added
// without its line, or a line left after its key went, fails here. A table
// (a downstream's auth, a token, a tenant) is one row that names each of
// its keys.
func TestReferenceNamesEveryKey(t *testing.T) {
	t.Parallel()
	rows := referenceRows(t)
	documented := map[string]bool{}
	var walk func(path string, typ reflect.Type)
	walk = func(path string, typ reflect.Type) {
		for f := range typ.Fields() {
			tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if tag == "" || tag == "-" || f.Type == reflect.TypeFor[InlineSecret]() {
				continue // not a key, or one the loader refuses with its own error
			}
			key := path + tag
			ft := f.Type
			switch {
			case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct && key == "tenants":
				inRow(t, rows, "tenants.NAME.*", ft.Elem(), "allow_unknown_tenants")
				documented["tenants.NAME.*"] = true
			case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct && key == "plans":
				inRow(t, rows, "plans.NAME.*", ft.Elem(), "allow_unknown_tenants", "plan")
				documented["plans.NAME.*"] = true
			case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
				walk(key+".NAME.", ft.Elem())
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
				inRow(t, rows, "[["+key+"]]", ft.Elem())
				documented["[["+key+"]]"] = true
			case ft.Kind() == reflect.Struct && ft.PkgPath() == typ.PkgPath() && rows[key] != "":
				inRow(t, rows, key, ft)
				documented[key] = true
			case ft.Kind() == reflect.Struct && ft.PkgPath() == typ.PkgPath():
				walk(key+".", ft)
			default:
				documented[key] = true
				if rows[key] == "" {
					t.Errorf("the configuration reference has no row for %s", key)
				}
			}
		}
	}
	walk("", reflect.TypeFor[Config]())
	for key := range rows {
		if !documented[key] {
			t.Errorf("the configuration reference has a row for %s, which the config file does not take", key)
		}
	}
}

// inRow checks that the row of key names each key of the table typ (but
// those in except) in backquotes.
func inRow(t *testing.T, rows map[string]string, key string, typ reflect.Type, except ...string) {
	t.Helper()
	row := rows[key]
	if row == "" {
		t.Errorf("the configuration reference has no row for %s", key)
		return
	}
	for f := range typ.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if tag == "" || tag == "-" || f.Type == reflect.TypeFor[InlineSecret]() || slices.Contains(except, tag) {
			continue
		}
		if !strings.Contains(row, "`"+tag+"`") && !regexp.MustCompile(`[{,|]\s*`+tag+`\b`).MatchString(row) {
			t.Errorf("the configuration reference's row for %s does not name its key %s", key, tag)
		}
	}
}

// the reference's default for each key of the sections without names is what a
// service with no file runs with: the default cell's value, read as the
// file would read it, equals Default()'s (after the defaults the loader
// fills in, for the keys Default leaves empty).
func TestReferenceDefaultsAreTheDefaults(t *testing.T) {
	t.Parallel()
	rows := referenceRows(t)
	def, err := Load("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	value := regexp.MustCompile("^`([^`]*)`$")
	checked := 0
	for _, section := range []string{"server", "store", "dispatch", "log", "tenant_defaults", "callbacks", "auth"} {
		sv := reflect.ValueOf(def).Elem().FieldByNameFunc(func(n string) bool {
			f, _ := reflect.TypeFor[Config]().FieldByName(n)
			return f.Tag.Get("toml") == section
		})
		for i := range sv.NumField() {
			f := sv.Type().Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			row := rows[section+"."+tag]
			if row == "" {
				continue // TestReferenceNamesEveryKey says so
			}
			m := value.FindStringSubmatch(strings.TrimSpace(strings.Split(row, " | ")[1]))
			if m == nil {
				continue // "none", or words: not a value to compare
			}
			got := reflect.New(f.Type)
			if err := decodeAs(got.Interface(), m[1]); err != nil {
				t.Errorf("%s.%s: the reference's default %q does not read as the file would: %v", section, tag, m[1], err)
				continue
			}
			checked++
			if want := sv.Field(i); !reflect.DeepEqual(got.Elem().Interface(), want.Interface()) {
				t.Errorf("%s.%s: the configuration reference says the default is %s, the service runs with %v", section, tag, m[1], fmtValue(want))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d defaults compared: the table's layout changed?", checked)
	}
	t.Logf("%d defaults compared", checked)
}

// decodeAs reads text into into as the config file reads a value: quoted,
// unless into is a number or a bool.
func decodeAs(into any, text string) error {
	t := reflect.TypeOf(into).Elem()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	lit := strconv.Quote(text)
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Bool:
		if _, isText := reflect.New(t).Interface().(encoding.TextUnmarshaler); !isText {
			lit = text
		}
	}
	var doc map[string]toml.Primitive
	md, err := toml.Decode("v = "+lit, &doc)
	if err != nil {
		return err
	}
	return md.PrimitiveDecode(doc["v"], into)
}

// fmtValue is v as a reader of the table would write it.
func fmtValue(v reflect.Value) string {
	for v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if d, ok := v.Interface().(Duration); ok {
		return time.Duration(d).String()
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprint(v.Interface())
}

// The reference says of each key what a reload does with it, as
// NeedsRestart decides: "restart" for a key of a section a running service
// keeps, "applied" for the others.
func TestReferenceSaysWhatAReloadApplies(t *testing.T) {
	t.Parallel()
	restart := map[string]bool{}
	cfg := reflect.TypeFor[Config]()
	for f := range cfg.Fields() {
		section, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if section == "" || section == "-" {
			continue
		}
		cur, next := Default(), Default()
		if !changeSomething(reflect.ValueOf(next).Elem().FieldByIndex(f.Index)) {
			t.Fatalf("cannot change section %s to ask NeedsRestart", section)
		}
		restart[section] = len(cur.NeedsRestart(next)) > 0
	}
	n := 0
	for key, row := range referenceRows(t) {
		section, _, _ := strings.Cut(strings.Trim(key, "[]"), ".")
		cells := strings.Split(row, " | ")
		if len(cells) < 4 {
			t.Errorf("the row for %s has no \"on SIGHUP\" column", key)
			continue
		}
		want := "applied"
		if restart[section] {
			want = "restart"
		}
		if got := strings.TrimSpace(cells[2]); got != want {
			t.Errorf("%s: the reference says %q on SIGHUP, the service does %q", key, got, want)
		}
		n++
	}
	if n < 50 || !restart["server"] || restart["tenants"] {
		t.Fatalf("%d rows checked; restart by section: %v", n, restart)
	}
}

// changeSomething makes v (a config section) differ from what it was, and
// reports whether it could.
func changeSomething(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("x"), reflect.New(v.Type().Elem()).Elem())
		v.Set(m)
		return true
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() && f.Kind() == reflect.String {
				f.SetString(f.String() + "x")
				return true
			}
			if f := v.Field(i); f.CanSet() && f.Kind() == reflect.Bool {
				f.SetBool(!f.Bool())
				return true
			}
			if f := v.Field(i); f.CanSet() && f.Kind() == reflect.Int {
				f.SetInt(f.Int() + 1)
				return true
			}
		}
	}
	return false
}
