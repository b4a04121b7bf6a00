package api

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
)

// callbackConfig is [callbacks] allowing one receiver, and a tenant whose
// jobs are told to it by default.
func callbackConfig(t *testing.T) string {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "hook-secret")
	if err := os.WriteFile(secret, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`
[callbacks]
signing_secret_file = %q
allow = ["https://app.example/hooks/"]
[tenants.told]
callback_url = "https://app.example/hooks/told"
`, secret)
}

// A job names where its end is told, within callbacks.allow, or nothing
// is queued; its tenant's callback_url is the default; GET shows it.
func TestCallbackURLsAreCheckedAtAdmission(t *testing.T) {
	t.Parallel()
	h, store := newAPIConfig(t, callbackConfig(t), nil)
	for _, c := range []struct {
		name, body, code string
		status           int
	}{
		{"outside the allow-list", `{"payload":{},"callback_url":"https://evil.example/hooks/x"}`, "callback_not_allowed", 422},
		{"a prefix by its text alone", `{"payload":{},"callback_url":"https://app.example/hooksx"}`, "callback_not_allowed", 422},
		{"not absolute", `{"payload":{},"callback_url":"/hooks/x"}`, "callback_not_allowed", 422},
		{"user info", `{"payload":{},"callback_url":"https://app.example/hooks/x@evil.example"}`, "", 202}, // a path, on app.example
		{"another host by user info", `{"payload":{},"callback_url":"https://app.example@evil.example/hooks/x"}`, "callback_not_allowed", 422},
		{"an unknown state", `{"payload":{},"callback_url":"https://app.example/hooks/x","callback_on":["done"]}`, "invalid_callback_on", 400},
		{"no states", `{"payload":{},"callback_url":"https://app.example/hooks/x","callback_on":[]}`, "invalid_callback_on", 400},
		{"states without a URL", `{"payload":{},"callback_on":["failed"]}`, "invalid_callback_on", 400},
	} {
		st, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", c.body)
		if st != c.status || (c.code != "" && body["error"] != c.code) {
			t.Errorf("%s: %d %v, want %d %s", c.name, st, body, c.status, c.code)
		}
		if c.status == 422 && (fmt.Sprint(body["allow"]) != "[https://app.example/hooks/]" || !strings.Contains(body["message"].(string), "nothing was queued")) {
			t.Errorf("%s: %v, want the allow-list named and nothing queued said", c.name, body)
		}
	}
	// The batch: one job outside the list refuses the whole batch.
	st, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":{}},{"payload":{},"callback_url":"http://app.example/hooks/x"}]}`)
	if st != 422 || body["error"] != "callback_not_allowed" || !strings.Contains(body["message"].(string), "jobs[1]") {
		t.Errorf("batch: %d %v, want 422 callback_not_allowed naming jobs[1]", st, body)
	}
	if ts, err := store.Tenant(context.Background(), "acme"); err != nil || ts.QueueDepth != 1 || ts.Accepted != 1 {
		t.Fatalf("acme: %+v %v, want only the one job allowed queued", ts, err)
	}

	// Its own URL and states; its tenant's URL by default; none at all.
	for _, c := range []struct {
		tenant, body, url, on string
	}{
		{"acme", `{"payload":{},"callback_url":"https://app.example/hooks/a","callback_on":["failed","expired","failed"]}`, "https://app.example/hooks/a", "[failed expired]"},
		{"told", `{"payload":{}}`, "https://app.example/hooks/told", "<nil>"},
		{"told", `{"payload":{},"callback_on":["succeeded"]}`, "https://app.example/hooks/told", "[succeeded]"},
		{"acme", `{"payload":{}}`, "", ""},
	} {
		st, _, body := do(t, h, "POST", "/v1/tenants/"+c.tenant+"/jobs", c.body)
		if st != 202 {
			t.Fatalf("%s: %d %v", c.body, st, body)
		}
		_, _, j := do(t, h, "GET", "/v1/jobs/"+body["id"].(string), "")
		cb, _ := j["callback"].(map[string]any)
		if c.url == "" {
			if cb != nil {
				t.Errorf("%s: callback %v, want none", c.body, cb)
			}
			continue
		}
		if cb == nil || cb["url"] != c.url || fmt.Sprint(cb["on"]) != c.on || cb["state"] != nil || cb["attempts"] != 0.0 {
			t.Errorf("%s: callback %v, want %s on %s, none owed yet", c.body, cb, c.url, c.on)
		}
	}
}

// A config that asks for callbacks has them whole: a secret, an
// allow-list that cannot be read past its host, a tenant URL inside it.
func TestCallbacksConfigIsChecked(t *testing.T) {
	t.Parallel()
	if _, err := loadConfigErr(t, "[callbacks]\nallow = [\"https://app.example/\"]\n"); err == nil || !strings.Contains(err.Error(), "callbacks.signing_secret_env") {
		t.Errorf("no secret: %v", err)
	}
	if _, err := loadConfigErr(t, "[callbacks]\nsigning_secret_env = \"X\"\nallow = [\"https://app.example\"]\n"); err == nil || !strings.Contains(err.Error(), "add \"/\"") {
		t.Errorf("a host prefix: %v", err)
	}
	if _, err := loadConfigErr(t, "[callbacks]\nsigning_secret = \"whsec_x\"\n"); err == nil || strings.Contains(err.Error(), "whsec_x") || !strings.Contains(err.Error(), "never sits in the config file") {
		t.Errorf("an inline secret: %v", err)
	}
	if _, err := loadConfigErr(t, "[tenants.x]\ncallback_url = \"https://app.example/h\"\n"); err == nil || !strings.Contains(err.Error(), "tenants.x.callback_url") {
		t.Errorf("a tenant's URL without [callbacks]: %v", err)
	}
	if _, err := loadConfigErr(t, "[callbacks]\nsigning_secret_env = \"X\"\nallow = [\"https://app.example/\"]\n[tenants.x]\ncallback_url = \"https://other.example/h\"\n"); err == nil || !strings.Contains(err.Error(), "callbacks.allow") {
		t.Errorf("a tenant's URL outside the list: %v", err)
	}
	// Without [callbacks], a job's callback_url is refused for good.
	h, _ := newAPI(t)
	st, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":{},"callback_url":"https://app.example/hooks/x"}`)
	if st != http.StatusUnprocessableEntity || body["error"] != "callback_not_allowed" || !strings.Contains(body["message"].(string), "not configured") {
		t.Errorf("no [callbacks]: %d %v", st, body)
	}
}

// loadConfigErr is loadConfig's error, for a config that is refused.
func loadConfigErr(t *testing.T, body string) (any, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return config.Load(file, nil, nil)
}
