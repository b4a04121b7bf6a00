package policies

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue/redis"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

const file = `
[plans.pro]
rate = "20/s"
[tenant_defaults]
rate = "1/s"
`

// process is one process's keeper on a shared Redis, with its config and
// the tenants it was told changed.
type process struct {
	cfg     atomic.Pointer[config.Config]
	mu      sync.Mutex
	changed []string
	keeper  *Keeper
}

func (p *process) told() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.changed)
}

func loadConfig(t *testing.T, body string) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func startProcess(t *testing.T, url, body string) *process {
	t.Helper()
	p := &process{}
	p.cfg.Store(loadConfig(t, body))
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	store, err := redis.Open(context.Background(), redis.Options{Client: goredis.NewClient(opt), OwnsClient: true,
		Policy: func(tenant string) leaky.Policy { ts, _ := p.cfg.Load().Tenant(tenant); return ts.Policy() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	p.keeper = New(Options{Store: store, Live: p.cfg.Load,
		Changed: func(tenants []string) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.changed = append(p.changed, tenants...)
		}})
	if err := p.keeper.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.keeper.Stop)
	return p
}

func rateOf(c *config.Config, tenant string) string {
	ts, _ := c.Tenant(tenant)
	return ts.Rate.String()
}

// Two processes share a Redis: a policy one sets is in force in the other
// within a poll, and told to it once; the one that set it is told once (at
// the PUT), not again when its own change comes back; a policy the other's
// file refuses is kept aside and taken at the reload that makes it hold; a
// Redis that lost its data takes every policy with it.
func TestPoliciesFollowTheStore(t *testing.T) {
	srv := redistest.Start(t, false)
	ctx := context.Background()
	a := startProcess(t, srv.URL(), file)
	b := startProcess(t, srv.URL(), strings.Replace(file, "[plans.pro]", "[plans.other]", 1)+"[plans.pro]\nrate = \"20/s\"\n")
	within := func(what string, cond func() bool) { testutil.WaitFor(t, 2*time.Second, what, cond) }

	if _, err := a.keeper.SetPolicy(ctx, "acme", config.PolicyLayer{Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	within("b takes acme's policy", func() bool { return rateOf(b.cfg.Load(), "acme") == "20/s" })
	time.Sleep(3 * Poll) // a's own change comes back meanwhile
	if got := a.told(); !slices.Equal(got, []string{"acme"}) {
		t.Errorf("a was told %v; want [acme] once (its own change, at the PUT)", got)
	}
	if got := b.told(); !slices.Equal(got, []string{"acme"}) {
		t.Errorf("b was told %v; want [acme] once", got)
	}

	// A plan b's file lacks: b keeps what it had, and takes it at the
	// reload that brings the plan.
	reload := func(p *process, body string) {
		t.Helper()
		next := loadConfig(t, body)
		if err := p.keeper.Adopt(next, p.cfg.Load(), func() { p.cfg.Store(next) }); err != nil {
			t.Fatal(err)
		}
	}
	reload(a, file+"[plans.gold]\nrate = \"50/s\"\n")
	if _, err := a.keeper.SetPolicy(ctx, "beta", config.PolicyLayer{Plan: "gold"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * Poll)
	if got := rateOf(b.cfg.Load(), "beta"); got != "1/s" {
		t.Fatalf("b took a policy its file refuses: beta at %s", got)
	}
	reload(b, file+"[plans.gold]\nrate = \"50/s\"\n")
	if got := rateOf(b.cfg.Load(), "beta"); got != "50/s" {
		t.Errorf("after the reload that brings plan gold, b has beta at %s; want 50/s", got)
	}
	if got := rateOf(b.cfg.Load(), "acme"); got != "20/s" {
		t.Errorf("after the reload, b has acme at %s; want 20/s (kept)", got)
	}

	// Redis loses its data: its count of changes goes back.
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// A change after the loss, so that the count is not back at zero only.
	if _, err := a.keeper.SetPolicy(ctx, "gamma", config.PolicyLayer{Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	within("b drops what Redis lost and takes gamma", func() bool {
		return rateOf(b.cfg.Load(), "acme") == "1/s" && rateOf(b.cfg.Load(), "beta") == "1/s" && rateOf(b.cfg.Load(), "gamma") == "20/s"
	})
	within("a drops what Redis lost", func() bool { return rateOf(a.cfg.Load(), "acme") == "1/s" && rateOf(a.cfg.Load(), "gamma") == "20/s" })
}
