// Package target finds the throttler API a command talks to, the way
// `serve` finds its settings: flag, then environment, then config file,
// then the default. It is the commands' (enqueue, status, pause, resume),
// not the public client's: a program that imports throttler/client says
// where the server is itself.
package target

import (
	"cmp"
	"fmt"
	"net/url"
	"strings"

	"github.com/throttler-dev/throttler/internal/config"
)

// DefaultServer is where the API listens with no config.
const DefaultServer = "http://127.0.0.1:8080"

// Target is where the API is and how to authenticate.
type Target struct {
	Server string // base URL, e.g. http://127.0.0.1:8080
	Token  string // bearer token ("" for none)
}

// Resolve picks the server and token: flags, then the environment
// (THROTTLER_SERVER, THROTTLER_TOKEN), then the config file (--config or
// THROTTLER_CONFIG: server.listen), then DefaultServer.
func Resolve(flagServer, flagToken, flagConfig string, env []string) (Target, error) {
	get := func(name string) string {
		for i := len(env) - 1; i >= 0; i-- {
			if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
				return v
			}
		}
		return ""
	}
	t := Target{Server: cmp.Or(flagServer, get("THROTTLER_SERVER")), Token: cmp.Or(flagToken, get("THROTTLER_TOKEN"))}
	if t.Server == "" {
		if file := cmp.Or(flagConfig, get("THROTTLER_CONFIG")); file != "" {
			cfg, err := config.Load(file, env, nil)
			if err != nil {
				return Target{}, err
			}
			t.Server = "http://" + cfg.Server.Listen
		}
	}
	t.Server = strings.TrimRight(cmp.Or(t.Server, DefaultServer), "/")
	u, err := url.Parse(t.Server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Target{}, fmt.Errorf("server %q: want a URL such as http://127.0.0.1:8080", t.Server)
	}
	return t, nil
}
