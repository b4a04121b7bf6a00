package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The status page's job view shows what the job asked of its downstream's
// request (path, query, headers) and what was kept of the answer: its
// status, its kept headers and its body, here a card decline; and the
// callback its end owes, here pending after its receiver answered 503.
func TestStatusPageShowsRequestAndResponse(t *testing.T) {
	testutil.SkipShort(t, "browser test: headless Chromium")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	bin := chromium(t)
	ds := downstreamtest.New(t)
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_page_1")
		w.WriteHeader(http.StatusPaymentRequired)
		io.WriteString(w, `{"error":{"code":"card_declined","message":"Your card was declined."}}`)
	})
	// Its callback's receiver is failing.
	hooks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	t.Cleanup(hooks.Close)
	_, secretFile := newHookSecret(t)
	// The lines before [tenant_defaults] are the test downstream's keys.
	base := startServer(t, writeConfig(t, fmt.Sprintf(`job_paths = ["/v1/*"]
job_headers = ["Stripe-Account"]
keep_response_headers = ["Request-Id"]
[tenant_defaults]
rate = "10/s"
[callbacks]
signing_secret_file = %q
allow = [%q]
min_backoff = "1h"
`, secretFile, hooks.URL+"/"), ds))
	st, _, adm := call(t, "POST", base+"/v1/tenants/shop/jobs",
		`{"payload":{"charge":"ch_1"},"request":{"path":"/v1/refunds","query":{"expand[]":"charge"},"headers":{"Stripe-Account":"acct_page"}},"callback_url":"`+hooks.URL+`/hooks/refunds"}`)
	if st != 202 {
		t.Fatalf("enqueue: %d %v", st, adm)
	}
	id := adm["id"].(string)
	testutil.WaitFor(t, 10*time.Second, "the job failed with the decline, its callback tried", atMostEvery(100*time.Millisecond, func() bool {
		j := jobState(t, base, id)
		cb, _ := j["callback"].(map[string]any)
		attempts, _ := cb["attempts"].(float64)
		return j["state"] == "failed" && attempts >= 1
	}))
	plan := []map[string]any{{"do": "live"}, {"do": "lookup", "job": id, "expect": "card_declined"}}
	dom := headlessFor(t, bin, pageProxy(t, base, plan, nil)+"/", 10*time.Second, "--dump-dom")
	driven(t, dom)
	for _, want := range []string{
		`(downstream's method) /v1/refunds?expand%5B%5D=charge`,
		`Stripe-Account: acct_page`,
		`data-status="402"`,
		`Request-Id: req_page_1`,
		`Content-Type: application/json`,
		`{"error":{"code":"card_declined","message":"Your card was declined."}}`,
		`id="lookupCallback">pending (`, // 1 attempt, or 2: the wait after the first is random, up to an hour
		hooks.URL + `/hooks/refunds`,
		`the receiver answered 503`,
	} {
		if !strings.Contains(dom, want) && !strings.Contains(dom, htmlEscape(want)) {
			t.Errorf("the job view lacks %s", want)
		}
	}
	if t.Failed() {
		i := strings.Index(dom, `id="lookupResult"`)
		t.Logf("job view:\n%s", dom[max(0, i):min(len(dom), i+3000)])
	}
}

// htmlEscape is s as --dump-dom writes it in text.
func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
