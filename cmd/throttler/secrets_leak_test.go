package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The secrets of the leak test: distinctive values, each found by a plain
// search, in every form a careless line could print them.
const (
	leakUser       = "ACleak0001"
	leakBasicPW    = "S3cr3t-basic-7f1e2d9a"
	leakBearer     = "S3cr3t-bearer-4c9a11e0"
	leakBearerNext = "S3cr3t-bearer-rotated-8d03"
	leakHeader     = "S3cr3t-header-b0d5c7f2"
	leakHookKey    = "S3cr3t-signing-key-e61f-0123" // the key's bytes; the secret is whsec_<base64>
	// leakCanary is a tenant's name: not a secret, so it must be found
	// wherever the collector looks (the proof that it looks).
	leakCanary = "canary-5e2b"
	// leakPlanted is a "secret" that a job carries, in base64, as a header
	// value its request may set, which GET /v1/jobs/{id} shows: the proof
	// that the collector finds a secret's base64 in an API answer.
	leakPlanted = "Planted-value-3a9c71"
)

var leakHook = "whsec_" + base64.StdEncoding.EncodeToString([]byte(leakHookKey))

// leakForms are the forms of every secret searched for, by name: each
// value, its base64 (standard, raw and URL), and the Basic authorization of
// user:password.
func leakForms(secrets map[string]string) map[string]string {
	forms := map[string]string{}
	for name, v := range secrets {
		forms[name] = v
		for enc, e := range map[string]*base64.Encoding{"base64": base64.StdEncoding, "raw base64": base64.RawStdEncoding, "url base64": base64.URLEncoding} {
			forms[name+" ("+enc+")"] = e.EncodeToString([]byte(v))
		}
	}
	return forms
}

// leakSecrets are the test's real secrets, in every form.
func leakSecrets() map[string]string {
	forms := leakForms(map[string]string{"basic password": leakBasicPW, "bearer token": leakBearer,
		"rotated bearer token": leakBearerNext, "header value": leakHeader, "signing secret": leakHook, "signing key": leakHookKey})
	forms["basic authorization"] = base64.StdEncoding.EncodeToString([]byte(leakUser + ":" + leakBasicPW))
	return forms
}

// found lists where each form shows up in what was collected.
func found(collected map[string]string, forms map[string]string) []string {
	var hits []string
	for _, where := range slices.Sorted(mapsKeys(collected)) {
		for _, name := range slices.Sorted(mapsKeys(forms)) {
			if strings.Contains(collected[where], forms[name]) {
				hits = append(hits, name+" in "+where)
			}
		}
	}
	return hits
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// leakConfig has one downstream per way a secret is used (basic auth from
// the environment, bearer from a file, a header from the environment, a
// signing secret), each on the recording downstream at ds.
func leakConfig(t *testing.T, ds *downstreamtest.Server, tokenFile string) string {
	t.Helper()
	return fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
shutdown_timeout = "5s"
[log]
level = "debug"
format = "text"
[store]
path = %q
[tenant_defaults]
rate = "50/s"
capacity = 100
downstream = "basicds"
[downstreams.basicds]
url = "%s/2010-04-01/Accounts/%s/Messages.json"
body = "form"
auth = { type = "basic", username = %q, password_env = "THROTTLER_LEAK_BASIC_PW" }
job_headers = ["X-Account"]
keep_response_headers = ["Request-Id"]
[downstreams.bearerds]
url = "%s/v1/charges"
auth = { type = "bearer", token_file = %q }
job_paths = ["/v1/*"]
[downstreams.headerds]
url = "%s/api/send"
auth = { type = "header", name = "X-Api-Key", value_env = "THROTTLER_LEAK_HEADER" }
max_attempts = 1
[downstreams.hookds]
url = "%s/hooks/in"
signing_secret_env = "THROTTLER_LEAK_HOOK"
[tenants.t-bearer]
downstream = "bearerds"
[tenants.t-header]
downstream = "headerds"
[tenants.t-hook]
downstream = "hookds"
[tenants.%s]
downstream = "headerds"
`, filepath.Join(t.TempDir(), "throttler.db"), ds.URL, leakUser, leakUser, ds.URL, tokenFile, ds.URL, ds.URL, leakCanary)
}

// received is what the recording downstream saw of each request's
// credentials, by tenant.
type received struct {
	mu   sync.Mutex
	auth map[string][]string
}

func (rc *received) add(tenant, v string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.auth[tenant] = append(rc.auth[tenant], v)
}

func (rc *received) of(tenant string) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.auth[tenant])
}

// vendor answers like one: 201 with a body and a Request-Id, 400 for a
// payload that asks to fail; it records the credentials each request
// carried (the signature checked against the key).
func vendor(t *testing.T, ds *downstreamtest.Server) *received {
	rc := &received{auth: map[string][]string{}}
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tenant := r.Header.Get("X-Throttler-Tenant")
		cred := r.Header.Get("Authorization") + r.Header.Get("X-Api-Key")
		if sig := r.Header.Get("Webhook-Signature"); sig != "" {
			mac := hmac.New(sha256.New, []byte(leakHookKey))
			fmt.Fprintf(mac, "%s.%s.%s", r.Header.Get("Webhook-Id"), r.Header.Get("Webhook-Timestamp"), body)
			cred = fmt.Sprintf("signed %v", sig == "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		}
		rc.add(tenant, cred)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_"+tenant)
		if strings.Contains(string(body), "fail") {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"invalid number","hint":"check To"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"sid":"SMleak","status":"queued"}`)
	})
	return rc
}

// No secret of a downstream (a basic password, a bearer token from a file,
// a header value, a signing secret), nor its base64, nor the Basic
// authorization made from it, shows anywhere a user can look: the process
// log at debug level, /metrics, every API answer (jobs delivered, failed,
// refused at admission, errors), the status page and its JSON, config
// check, across a reload that rotates a secret and one refused for a
// secret gone. The downstream got them all, and the collector is shown to
// find what it looks for.
func TestNoSecretLeaks(t *testing.T) {
	testutil.SkipShort(t, "process test: runs and reloads the throttler binary")
	ds := downstreamtest.New(t)
	rc := vendor(t, ds)
	t.Setenv("THROTTLER_LEAK_BASIC_PW", leakBasicPW)
	t.Setenv("THROTTLER_LEAK_HEADER", leakHeader)
	t.Setenv("THROTTLER_LEAK_HOOK", leakHook)
	tokenFile := filepath.Join(t.TempDir(), "bearer")
	leakWrite(t, tokenFile, leakBearer+"\n")
	file := filepath.Join(t.TempDir(), "config.toml")
	config := leakConfig(t, ds, tokenFile)
	leakWrite(t, file, config)
	p := startProcess(t, file)
	collected := map[string]string{}
	ids := leakWorkload(t, p.base, collected)
	waitFinished(t, p.base, ids)

	// A reload that rotates the bearer token, one refused because the
	// token file is empty, and one that puts it back.
	leakWrite(t, tokenFile, leakBearerNext+"\n")
	p.reload(t, file, config, "config reloaded")
	ids = append(ids, leakEnqueue(t, p.base, collected, "t-bearer", `{"payload":{"amount":7}}`, 202))
	leakWrite(t, tokenFile, "\n")
	p.reload(t, file, config, "config reload refused")
	leakWrite(t, tokenFile, leakBearerNext+"\n")
	p.reload(t, file, config, "config reloaded")
	waitFinished(t, p.base, ids)

	leakCollect(t, p.base, ids, collected)
	collected["config check"] = configCheck(t, file, nil)
	collected["config check, a secret not set"] = configCheck(t, file, []string{"THROTTLER_LEAK_HEADER="})
	collected["process log"] = p.logs()

	if hits := found(collected, leakSecrets()); len(hits) > 0 {
		t.Errorf("secrets leaked:\n  %s", strings.Join(hits, "\n  "))
	}
	leakProofs(t, rc, collected)
}

// leakProofs shows the test could fail: the downstream got every secret
// (so they were in play), and the collector finds a tenant's name in the
// log, the metrics and the API, and a planted value's base64 in a job.
func leakProofs(t *testing.T, rc *received, collected map[string]string) {
	t.Helper()
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte(leakUser+":"+leakBasicPW))
	for tenant, want := range map[string][]string{
		"t-basic":  {basic},
		"t-bearer": {"Bearer " + leakBearer, "Bearer " + leakBearerNext},
		"t-header": {leakHeader},
		"t-hook":   {"signed true"},
	} {
		got := rc.of(tenant)
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("%s: the downstream did not get %.14s… (got %d requests)", tenant, w, len(got))
			}
		}
	}
	hits := strings.Join(found(collected, leakForms(map[string]string{"canary": leakCanary, "planted": leakPlanted})), "\n")
	for _, want := range []string{"canary in process log", "canary in GET /metrics", "canary in GET /v1/tenants/", "planted (base64) in GET /v1/jobs/"} {
		if !strings.Contains(hits, want) {
			t.Errorf("the collector does not see %q: it would miss a leak there; it found:\n%s", want, hits)
		}
	}
}

func leakWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// leakEnqueue enqueues one job for tenant, expects status, keeps the
// answer in collected and returns the job's id ("" if refused).
func leakEnqueue(t *testing.T, base string, collected map[string]string, tenant, body string, status int) string {
	t.Helper()
	st, raw := callRaw(t, "POST", base+"/v1/tenants/"+tenant+"/jobs", body)
	collected[fmt.Sprintf("POST %s %s -> %d", tenant, body, st)] = raw
	if st != status {
		t.Errorf("enqueue %s %s: %d %s, want %d", tenant, body, st, raw, status)
	}
	if st != 202 {
		return ""
	}
	return idOf(raw)
}

func idOf(raw string) string {
	_, rest, _ := strings.Cut(raw, `"id":"`)
	id, _, _ := strings.Cut(rest, `"`)
	return id
}

// leakWorkload sends jobs of every kind: delivered on each downstream,
// one that fails, and jobs refused at admission (a request not allowed, a
// payload not encodable, malformed), single and in a batch. It returns the
// admitted jobs' ids.
func leakWorkload(t *testing.T, base string, collected map[string]string) []string {
	t.Helper()
	planted := base64.StdEncoding.EncodeToString([]byte(leakPlanted))
	var ids []string
	for _, j := range []struct {
		tenant, body string
		status       int
	}{
		{"t-basic", `{"payload":{"To":"+15550100","From":"+15550199","Body":"hi","MediaUrl":["https://x.example/a.png"]},"request":{"headers":{"X-Account":"` + planted + `"}}}`, 202},
		{"t-bearer", `{"payload":{"amount":100},"request":{"path":"/v1/refunds"}}`, 202},
		{"t-header", `{"payload":{"to":"+15550100"}}`, 202},
		{"t-header", `{"payload":{"fail":true}}`, 202},
		{"t-hook", `{"payload":{"event":"invoice.paid"}}`, 202},
		{leakCanary, `{"payload":{"to":"+15550100"}}`, 202},
		{"t-basic", `{"payload":["To","From"]}`, 422},
		{"t-basic", `{"payload":{"To":"1"},"request":{"path":"/v1/x"}}`, 422},
		{"t-basic", `{"payload":{"To":"1"},"request":{"headers":{"Authorization":"Basic Zm9vOmJhcg=="}}}`, 422},
		{"t-basic", `{"payload":{"To":"1"},"request":{"headers":{"X-Account":"a\r\nX-Api-Key: x"}}}`, 422},
		{"t-bearer", `{"payload":{"a":1},"request":{"path":"/v1/../admin"}}`, 422},
		{"t-header", `{"payload":{"a":1},"request":{"headers":{"X-Api-Key":"mine"}}}`, 422},
		{"t-hook", `{"payload":{"a":1},"request":{"headers":{"webhook-signature":"v1,x"}}}`, 422},
		{"t-hook", `{"payload":`, 400},
		{"t-hook", `{"payload":1,"request":{"auth":"x"}}`, 400},
	} {
		if id := leakEnqueue(t, base, collected, j.tenant, j.body, j.status); id != "" {
			ids = append(ids, id)
		}
	}
	st, raw := callRaw(t, "POST", base+"/v1/tenants/t-bearer/jobs:batch", `{"jobs":[{"payload":{"a":2}},{"payload":{"a":3},"request":{"path":"/elsewhere"}}]}`)
	collected["POST t-bearer batch"] = raw
	if st != 200 || !strings.Contains(raw, `"status":202`) || !strings.Contains(raw, `"part":"request.path"`) {
		t.Errorf("batch: %d %s", st, raw)
	}
	ids = append(ids, idOf(raw))
	for _, verb := range []string{"pause", "resume"} {
		_, collected["POST "+verb] = callRaw(t, "POST", base+"/v1/tenants/"+leakCanary+"/"+verb, "{}")
	}
	return ids
}

// waitFinished waits until every job of ids has ended.
func waitFinished(t *testing.T, base string, ids []string) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "every job ended", atMostEvery(100*time.Millisecond, func() bool {
		for _, id := range ids {
			switch jobState(t, base, id)["state"] {
			case "succeeded", "failed":
			default:
				return false
			}
		}
		return true
	}))
}

// leakCollect reads everything the API and the status page show.
func leakCollect(t *testing.T, base string, ids []string, collected map[string]string) {
	t.Helper()
	paths := []string{"/", "/static/app.js", "/metrics", "/v1/whoami", "/v1/downstreams", "/v1/tenants",
		"/v1/history?tenant=t-basic&tenant=t-bearer&tenant=t-header&tenant=t-hook&tenant=" + leakCanary,
		"/v1/jobs/0000000000000000000000000a", "/v1/nothing", "/healthz", "/readyz"}
	for _, tenant := range []string{"t-basic", "t-bearer", "t-header", "t-hook", leakCanary} {
		paths = append(paths, "/v1/tenants/"+tenant, "/v1/tenants/"+tenant+"/jobs?state=failed")
	}
	for _, id := range ids {
		paths = append(paths, "/v1/jobs/"+id)
	}
	for _, path := range paths {
		st, raw := callRaw(t, "GET", base+path, "")
		if st >= 500 {
			t.Errorf("GET %s: %d %s", path, st, raw)
		}
		collected["GET "+path] = raw
	}
	if !strings.Contains(collected["GET /v1/tenants/t-header/jobs?state=failed"], "invalid number") {
		t.Errorf("the failed job is not listed with its answer: %s", collected["GET /v1/tenants/t-header/jobs?state=failed"])
	}
}

// configCheck runs `throttler config check` on file as a user would, with
// env added to the test's, and returns all it printed.
func configCheck(t *testing.T, file string, env []string) string {
	t.Helper()
	cmd := exec.Command(throttlerBinary(t), "config", "check", "--config", file)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if (err == nil) != (len(env) == 0) || !strings.Contains(string(out), "auth: basic, password from $THROTTLER_LEAK_BASIC_PW (set)") {
		t.Errorf("config check (env %v): %v\n%s", env, err, out)
	}
	return string(out)
}
