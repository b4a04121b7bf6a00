package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Load reads file (none if "") over the defaults, then applies env (as
// os.Environ gives it) and the overrides ("section.key=value", from flags),
// and validates the result.
func Load(file string, env []string, overrides []string) (*Config, error) {
	cfg := Default()
	if file != "" {
		cfg.File = file
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, &Error{File: file, Reason: fmt.Sprintf("cannot read: %v", err)}
		}
		if err := cfg.decode(string(raw)); err != nil {
			return nil, err
		}
	}
	if err := cfg.applyEnv(env); err != nil {
		return nil, err
	}
	for _, o := range overrides {
		key, value, ok := strings.Cut(o, "=")
		if !ok {
			return nil, &Error{File: "flag --set", Key: o, Reason: "want section.key=value, e.g. --set server.listen=127.0.0.1:9090"}
		}
		if err := cfg.set(strings.TrimSpace(key), value); err != nil {
			return nil, &Error{File: "flag --set", Key: key, Reason: err.Error()}
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (c *Config) decode(raw string) error {
	// Named tenants and downstreams start empty: keys they leave out are
	// filled from the defaults after decoding.
	md, err := toml.Decode(raw, c)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return &Error{File: c.File, Key: perr.LastKey, Reason: fmt.Sprintf("line %d: %s", perr.Position.Line, perr.Message)}
		}
		// Type mismatches are plain errors that name the key only in their
		// text: `toml: line 2 (last key "server.listen"): incompatible types...`.
		msg := strings.TrimPrefix(err.Error(), "toml: ")
		if m := lastKeyRE.FindStringSubmatch(msg); m != nil {
			return &Error{File: c.File, Key: m[2], Reason: strings.TrimSpace(m[1] + strings.TrimPrefix(msg, m[0]))}
		}
		return &Error{File: c.File, Reason: msg}
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return &Error{File: c.File, Key: keys[0], Reason: fmt.Sprintf("unknown key (unknown: %s); see config.toml in the repository for every key", strings.Join(keys, ", "))}
	}
	return nil
}

var lastKeyRE = regexp.MustCompile(`^(line \d+ )?\(last key "([^"]*)"\):`)

// envSections are the sections that THROTTLER_<SECTION>_<KEY> reaches.
func (c *Config) envSections() map[string]reflect.Value {
	return map[string]reflect.Value{
		"server":          reflect.ValueOf(&c.Server).Elem(),
		"store":           reflect.ValueOf(&c.Store).Elem(),
		"dispatch":        reflect.ValueOf(&c.Dispatch).Elem(),
		"tenant_defaults": reflect.ValueOf(&c.TenantDefaults).Elem(),
		"auth":            reflect.ValueOf(&c.Auth).Elem(),
		"log":             reflect.ValueOf(&c.Log).Elem(),
	}
}

func (c *Config) applyEnv(env []string) error {
	known := map[string]string{}
	for section, v := range c.envSections() {
		for i := 0; i < v.NumField(); i++ {
			key := v.Type().Field(i).Tag.Get("toml")
			known["THROTTLER_"+strings.ToUpper(section+"_"+key)] = section + "." + key
		}
	}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "THROTTLER_") || name == "THROTTLER_TOKEN" || name == "THROTTLER_CONFIG" {
			continue
		}
		path, ok := known[name]
		if !ok {
			continue // other programs' THROTTLER_ variables are not ours to refuse
		}
		if err := c.set(path, value); err != nil {
			return &Error{File: "environment " + name, Key: path, Reason: err.Error()}
		}
	}
	return nil
}

// set assigns one "section.key" from text, as env and flags give it.
func (c *Config) set(path, value string) error {
	section, key, ok := strings.Cut(path, ".")
	sv, known := c.envSections()[section]
	if !ok || !known {
		return fmt.Errorf("unknown key; settable sections are server, store, dispatch, tenant_defaults, auth and log")
	}
	for i := 0; i < sv.NumField(); i++ {
		if sv.Type().Field(i).Tag.Get("toml") == key {
			return setText(sv.Field(i), value)
		}
	}
	return fmt.Errorf("unknown key in [%s]", section)
}

func setText(f reflect.Value, value string) error {
	if f.Kind() == reflect.Pointer {
		p := reflect.New(f.Type().Elem())
		if err := setText(p.Elem(), value); err != nil {
			return err
		}
		f.Set(p)
		return nil
	}
	if u, ok := f.Addr().Interface().(interface{ UnmarshalText([]byte) error }); ok {
		return u.UnmarshalText([]byte(value))
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString(value)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not a whole number", value)
		}
		f.SetInt(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(value))
		if err != nil {
			return fmt.Errorf("%q is not true or false", value)
		}
		f.SetBool(b)
	default:
		return fmt.Errorf("this key cannot be set from the environment or a flag; set it in the file")
	}
	return nil
}
