package api

import (
	"fmt"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/queue/bolt"
)

// A tenant's policy by API: admin tokens only; a policy that does not hold
// is 4xx naming the problem and changes nothing; one that holds is in
// force at the next admission, kept by the store (a store opened again
// has it), shown with where each key comes from, and DELETE gives the
// file's back.
func TestPolicyByAPI(t *testing.T) {
	t.Parallel()
	const admin, acme, viewer = "admin-token", "acme-token", "viewer-token"
	cfg := loadConfig(t, tourConfig+"\n[plans.pro]\nrate = \"20/s\"\ncapacity = 2\n")
	dir := t.TempDir()
	store := openStore(t, dir, cfg, bolt.Options{})
	h, _ := tourHandler(t, cfg, store)
	shown := func() string {
		got := call{"GET", "/v1/tenants/acme/policy", "", viewer, 200, ""}.run(t, h, nil)
		return fmt.Sprint(got["plan"], got["policy"], got["from"], got["api"])
	}
	file := shown()
	for _, c := range []call{
		{"PUT", "/v1/tenants/acme/policy", `{"plan":"pro"}`, acme, 403, "forbidden"},
		{"PUT", "/v1/tenants/acme/policy", `{"plan":"pro"}`, viewer, 403, "forbidden"},
		{"PUT", "/v1/tenants/acme/policy", `{"plan":"pro"}`, "", 401, "unauthorized"},
		{"PUT", "/v1/tenants/acme/policy", `{"plan":"gold"}`, admin, 422, "invalid_policy"},
		{"PUT", "/v1/tenants/acme/policy", `{"rate":"-5/s"}`, admin, 422, "invalid_policy"},
		{"PUT", "/v1/tenants/acme/policy", `{"windows":["10/fortnight"]}`, admin, 422, "invalid_policy"},
		{"PUT", "/v1/tenants/acme/policy", `{"capacity":"many"}`, admin, 422, "invalid_policy"},
		{"PUT", "/v1/tenants/acme/policy", `{"plan":`, admin, 400, "invalid_json"},
		{"PUT", "/v1/tenants/a%20b/policy", `{"plan":"pro"}`, admin, 400, "invalid_tenant"},
		{"DELETE", "/v1/tenants/acme/policy", "", admin, 404, "no_policy"},
		{"DELETE", "/v1/tenants/acme/policy", "", acme, 403, "forbidden"},
		{"GET", "/v1/tenants/stranger/policy", "", admin, 404, "unknown_tenant"},
	} {
		got := c.run(t, h, nil)
		if c.status == 422 && got["field"] == nil {
			t.Errorf("%s: no field named: %v", c.body, got)
		}
		if now := shown(); now != file {
			t.Fatalf("%s %s by %s changed the policy: %s", c.method, c.body, c.token, now)
		}
	}
	bad := call{"PUT", "/v1/tenants/acme/policy", `{"plan":"gold"}`, admin, 422, "invalid_policy"}.run(t, h, nil)
	if bad["field"] != "policy.plan" {
		t.Errorf("an unknown plan names %v; want policy.plan", bad["field"])
	}
	window := call{"PUT", "/v1/tenants/acme/policy", `{"windows":["10/fortnight"]}`, admin, 422, "invalid_policy"}.run(t, h, nil)
	if window["field"] != "policy.windows[0]" {
		t.Errorf("a bad window names %v; want policy.windows[0]", window["field"])
	}

	// pro: two places, where the file gave five.
	set := call{"PUT", "/v1/tenants/acme/policy", `{"plan":"pro"}`, admin, 200, ""}.run(t, h, nil)
	from, _ := set["from"].(map[string]any)
	if set["plan"] != "pro" || set["plan_from"] != "api" || from["rate"] != "plan" || from["capacity"] != "plan" || from["burst"] != "default" {
		t.Errorf("after PUT pro: %v", set)
	}
	call{"POST", "/v1/tenants/acme/pause", "", admin, 200, ""}.run(t, h, nil) // none handed over: all wait
	call{"POST", "/v1/tenants/acme/jobs", `{"payload":1}`, acme, 202, ""}.run(t, h, nil)
	call{"POST", "/v1/tenants/acme/jobs", `{"payload":2}`, acme, 202, ""}.run(t, h, nil)
	call{"POST", "/v1/tenants/acme/jobs", `{"payload":3}`, acme, 429, "queue_full"}.run(t, h, nil)
	// A tenant not in the file is known once given a policy.
	call{"PUT", "/v1/tenants/stranger/policy", `{"rate":"2/s"}`, admin, 200, ""}.run(t, h, nil)
	call{"GET", "/v1/tenants/stranger", "", admin, 200, ""}.run(t, h, nil)

	// Kept by the store: what a restart reads.
	kept, _, err := store.AllPolicies(t.Context())
	if err != nil || string(kept["acme"]) == "" || string(kept["stranger"]) == "" {
		t.Fatalf("the store keeps %q, %v", kept, err)
	}
	dropped := call{"DELETE", "/v1/tenants/acme/policy", "", admin, 200, ""}.run(t, h, nil)
	if dropped["api"] != nil || shown() != file {
		t.Errorf("after DELETE: %v; want the file's %s", dropped, file)
	}
	if kept, _, _ := store.AllPolicies(t.Context()); kept["acme"] != nil {
		t.Errorf("the store still keeps acme's policy: %s", kept["acme"])
	}
}

// A tenant's callback_url may carry a token in its query: a viewer is
// shown its scheme, host and path only, an admin the whole; a refusal of
// one outside callbacks.allow does not repeat it.
func TestPolicyCallbackURLIsNotShownWhole(t *testing.T) {
	t.Parallel()
	const admin, viewer = "admin-token", "viewer-token"
	cfg := loadConfig(t, tourConfig+callbackConfig(t))
	h, _ := tourHandler(t, cfg, openStore(t, t.TempDir(), cfg, bolt.Options{}))
	const secret = "s3cret-in-the-query"
	call{"PUT", "/v1/tenants/acme/policy", `{"callback_url":"https://app.example/hooks/acme?token=` + secret + `"}`, admin, 200, ""}.run(t, h, nil)
	seen := call{"GET", "/v1/tenants/acme/policy", "", viewer, 200, ""}.run(t, h, nil)
	if got := fmt.Sprint(seen); strings.Contains(got, secret) || !strings.Contains(got, "https://app.example/hooks/acme…") {
		t.Errorf("a viewer is shown %s", got)
	}
	whole := call{"GET", "/v1/tenants/acme/policy", "", admin, 200, ""}.run(t, h, nil)
	if !strings.Contains(fmt.Sprint(whole), secret) {
		t.Errorf("an admin is not shown the whole callback_url: %v", whole)
	}
	refused := call{"PUT", "/v1/tenants/acme/policy", `{"callback_url":"https://evil.example/x?token=` + secret + `"}`, admin, 422, "invalid_policy"}.run(t, h, nil)
	if strings.Contains(fmt.Sprint(refused), secret) || refused["field"] != "policy.callback_url" {
		t.Errorf("the refusal: %v", refused)
	}
}

// A tenant the file does not name, with allow_unknown_tenants false, is
// known by its policy alone: its policy cannot be dropped while it has
// jobs (they could no longer be read, held or cancelled), and can once
// they are gone.
func TestPolicyOfATenantKnownByItAloneIsKeptWhileItHasJobs(t *testing.T) {
	t.Parallel()
	const admin = "admin-token"
	cfg := loadConfig(t, tourConfig)
	h, _ := tourHandler(t, cfg, openStore(t, t.TempDir(), cfg, bolt.Options{}))
	call{"PUT", "/v1/tenants/newco/policy", `{"rate":"1/h"}`, admin, 200, ""}.run(t, h, nil)
	call{"POST", "/v1/tenants/newco/pause", "", admin, 200, ""}.run(t, h, nil)
	job := call{"POST", "/v1/tenants/newco/jobs", `{"payload":1}`, admin, 202, ""}.run(t, h, nil)
	call{"DELETE", "/v1/tenants/newco/policy", "", admin, 409, "tenant_has_jobs"}.run(t, h, nil)
	call{"DELETE", "/v1/jobs/" + fmt.Sprint(job["id"]), "", admin, 200, ""}.run(t, h, nil)
	call{"DELETE", "/v1/tenants/newco/policy", "", admin, 200, ""}.run(t, h, nil)
	call{"GET", "/v1/tenants/newco", "", admin, 404, "unknown_tenant"}.run(t, h, nil)
}
