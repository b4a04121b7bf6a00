package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/secret"
)

// configFlags are the flags every command that reads config.toml takes.
type configFlags struct {
	file string
	set  []string
}

func (f *configFlags) register(c *cobra.Command) {
	c.Flags().StringVarP(&f.file, "config", "c", "", "config file (default: $THROTTLER_CONFIG, else built-in defaults)")
	c.Flags().StringArrayVar(&f.set, "set", nil, "override one key, e.g. --set server.listen=127.0.0.1:9090 (repeatable)")
}

func (f *configFlags) load(env []string, extra ...string) (*config.Config, error) {
	file := cmp.Or(f.file, lookup(env, "THROTTLER_CONFIG"))
	return config.Load(file, env, append(append([]string(nil), f.set...), extra...))
}

func lookup(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if len(env[i]) > len(name) && env[i][:len(name)+1] == name+"=" {
			return env[i][len(name)+1:]
		}
	}
	return ""
}

func newConfigCommand(env []string) *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Work with config files"}
	var flags configFlags
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate a config file (with env and --set overrides) and say what it configures",
		Long: `Validate a config file (with env and --set overrides) as serve does at start
and at SIGHUP: each downstream is compiled too, so a secret that is not set
or not readable, or a TLS file that is not a certificate, is refused naming
its key. Then say what it configures: per downstream its request, its auth,
signing and TLS, naming where each secret comes from and whether it could
be read, never its value.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := flags.load(env)
			if err != nil {
				return exitError{code: 2, err: err}
			}
			out := cmd.OutOrStdout()
			var errs []error
			for _, name := range slices.Sorted(maps.Keys(cfg.Downstreams)) {
				d := cfg.Downstreams[name]
				if _, err := outbound.Compile(name, d); err != nil {
					errs = append(errs, err)
				}
				describeDownstream(out, name, d)
			}
			if cb := cfg.Callbacks; cb.Enabled() {
				if _, err := outbound.CompileSigner("callbacks", cb.SigningRef()); err != nil {
					errs = append(errs, err)
				}
				fmt.Fprintf(out, "callbacks: to %s, signed (Standard Webhooks), %s; timeout %v, %d attempts\n",
					strings.Join(cb.Allow, ", "), describeSecret("callbacks.signing_secret", "secret", cb.SigningRef()), cb.Timeout.Std(), cb.MaxAttempts)
			}
			file := cmp.Or(cfg.File, "built-in defaults")
			if len(errs) > 0 {
				return exitError{code: 2, err: fmt.Errorf("%s: %w", file, errors.Join(errs...))}
			}
			fmt.Fprintf(out, "%s: ok: %d downstream(s), %d named tenant(s), listen %s, store %s\n",
				file, len(cfg.Downstreams), len(cfg.Tenants), cfg.Server.Listen, cfg.Store.Backend)
			return nil
		},
	}
	flags.register(check)
	c.AddCommand(check)
	return c
}

// describeDownstream says what a downstream's config asks of each request,
// in a few lines: where it goes and how the payload is written, its auth,
// signing and TLS, and what a job may choose. Secrets are named by where
// they come from, with whether they could be read (each is read here for
// that, and dropped); static header values are not shown (a credential
// put there by mistake would be).
func describeDownstream(w io.Writer, name string, d config.Downstream) {
	key := "downstreams." + name
	if d.Handler != "" {
		fmt.Fprintf(w, "downstream %s: Go handler %q, called in-process by the program that registers it (a stock throttler serves this config with --role api only)\n", name, d.Handler)
		fmt.Fprintf(w, "  a job may ask: %s\n", describeJobRules(d))
		return
	}
	body := d.Body
	switch d.Body {
	case config.BodyForm:
		body += " (arrays " + d.FormArrays + ")"
	case config.BodyRaw:
		body += " (" + d.ContentType + ")"
	}
	fmt.Fprintf(w, "downstream %s: %s %s, body %s\n", name, d.Method, shownURL(d.URL), body)
	if len(d.Headers) > 0 {
		fmt.Fprintf(w, "  headers: %s (values not shown)\n", strings.Join(slices.Sorted(maps.Keys(d.Headers)), ", "))
	}
	auth := "none"
	if what, ref, ok := d.Auth.Secret(); ok {
		kind := d.Auth.Type
		if kind == config.AuthHeader {
			kind += " " + d.Auth.Name
		}
		auth = kind + ", " + describeSecret(key+".auth."+what, what, ref)
	}
	fmt.Fprintf(w, "  auth: %s\n", auth)
	signing := "none"
	if ref := d.SigningRef(); !ref.IsZero() {
		signing = "Standard Webhooks, " + describeSecret(key+".signing_secret", "secret", ref)
	}
	fmt.Fprintf(w, "  signing: %s\n", signing)
	fmt.Fprintf(w, "  tls: %s\n", describeTLS(d))
	fmt.Fprintf(w, "  a job may ask: %s\n", describeJobRules(d))
}

// describeSecret is secret.Describe after trying to read the secret (key
// is its config key without _env or _file).
func describeSecret(key, what string, ref secret.Ref) string {
	_, err := secret.Resolve(key, ref)
	return secret.Describe(what, ref, err == nil)
}

// shownURL is a url without what may be a credential: user info, and the
// query's values.
func shownURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(not a url)"
	}
	shown := u.Scheme + "://" + u.Host + u.EscapedPath()
	if u.User != nil {
		shown += " (user info in the url not shown: use auth)"
	}
	if q := u.Query(); len(q) > 0 {
		shown += "?" + strings.Join(slices.Sorted(maps.Keys(q)), "=…&") + "=…"
	}
	return shown
}

func describeTLS(d config.Downstream) string {
	if !strings.HasPrefix(strings.ToLower(d.URL), "https:") {
		return "none (http)"
	}
	var parts []string
	if d.TLSCAFile != "" {
		parts = append(parts, "CAs from "+d.TLSCAFile)
	} else {
		parts = append(parts, "the system's CAs")
	}
	if d.TLSCertFile != "" {
		parts = append(parts, "client certificate "+d.TLSCertFile+" (key "+d.TLSKeyFile+")")
	}
	if d.TLSServerName != "" {
		parts = append(parts, "server name "+d.TLSServerName)
	}
	return strings.Join(parts, ", ")
}

func describeJobRules(d config.Downstream) string {
	list := func(what string, v []string) string {
		if len(v) == 0 {
			return "no " + what
		}
		return what + " " + strings.Join(v, ", ")
	}
	methods := append([]string{d.Method}, d.JobMethods...)
	slices.Sort(methods)
	return list("paths", d.JobPaths) + "; " + list("methods", slices.Compact(methods)) + "; " + list("headers", d.JobHeaders)
}
