package api

import (
	"fmt"
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
