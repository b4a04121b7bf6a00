package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/client"
)

// How a job ended is one line: failed ones first, the answer's status and
// the start of its body on one line (JSON compacted, other text escaped,
// bytes as base64), cut at maxShownBody, and at most maxShownJobs lines.
func TestOutcomeLines(t *testing.T) {
	t.Parallel()
	ended := func(line int, state string, r *client.Response) *item {
		return &item{line: line, accepted: true, final: client.JobStatus{ID: fmt.Sprintf("j%d", line), State: state, Response: r}}
	}
	long := strings.Repeat("é", maxShownBody) // two bytes each: cut on a rune
	items := []*item{
		ended(1, "succeeded", &client.Response{Status: 201, Body: "{\n  \"sid\": \"SM1\"\n}"}),
		ended(2, "failed", &client.Response{Status: 402, Body: `{"error": {"code": "card_declined"}}`}),
		ended(3, "succeeded", &client.Response{Status: 200, Body: "line one\nline two"}),
		ended(4, "succeeded", &client.Response{Status: 200, BodyBase64: "/wA=", Truncated: true}),
		ended(5, "succeeded", &client.Response{Status: 200, Body: long}),
		{line: 6, accepted: true, final: client.JobStatus{ID: "j6", State: "failed", LastError: "dial tcp: connection refused"}},
		{line: 7, accepted: false},
		{line: 8, accepted: true, final: client.JobStatus{ID: "j8", State: "queued"}},
	}
	var b bytes.Buffer
	printOutcomes(&b, outcomes(items))
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	want := []string{
		`  line 2, job j2: failed, response 402 {"error":{"code":"card_declined"}}`,
		`  line 6, job j6: failed (dial tcp: connection refused)`,
		`  line 1, job j1: succeeded, response 201 {"sid":"SM1"}`,
		`  line 3, job j3: succeeded, response 200 line one\nline two`,
		`  line 4, job j4: succeeded, response 200 (bytes, base64) /wA= …(truncated)`,
	}
	if len(lines) != 6 || strings.Join(lines[:5], "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s\n(and line 5)", b.String(), strings.Join(want, "\n"))
	}
	if !strings.HasSuffix(lines[5], "…(truncated)") || len(lines[5]) > maxShownBody+80 || !strings.Contains(lines[5], "éé") {
		t.Fatalf("a long body: %q", lines[5])
	}
	var many []*item
	for i := range maxShownJobs + 3 {
		many = append(many, ended(i+1, "succeeded", &client.Response{Status: 204}))
	}
	b.Reset()
	printOutcomes(&b, outcomes(many))
	if n := strings.Count(b.String(), "\n"); n != maxShownJobs+1 || !strings.Contains(b.String(), "and 3 more") {
		t.Fatalf("%d lines:\n%s", n, b.String())
	}
}

func TestParseRequest(t *testing.T) {
	t.Parallel()
	r, err := parseRequest(`{"method":"POST","path":"/v1/refunds","query":{"expand[]":"charge","id":["a","b"],"x":null},"headers":{"Stripe-Account":"acct_1"}}`)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(r)
	if string(raw) != `{"method":"POST","path":"/v1/refunds","query":{"expand[]":["charge"],"id":["a","b"]},"headers":{"Stripe-Account":"acct_1"}}` {
		t.Fatalf("%s", raw)
	}
	for _, bad := range []string{`{"url":"x"}`, `{"query":{"a":1}}`, `{"query":{"a":[1]}}`, `[`} {
		if _, err := parseRequest(bad); err == nil || !strings.Contains(err.Error(), "--request") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if r, err := parseRequest(""); r != nil || err != nil {
		t.Fatalf("none: %v %v", r, err)
	}
}

// With --wait the summary shows each job's answer, as the downstream gave
// it: a decline's body, kept on the failed job, is what the user needs.
func TestWaitShowsTheResponse(t *testing.T) {
	t.Parallel()
	ds, px := setup(t, "[tenant_defaults]\nrate = \"100/s\"\ncapacity = 50\n")
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if bytes.Contains(body, []byte("decline")) {
			w.WriteHeader(http.StatusPaymentRequired)
			io.WriteString(w, `{"error": {"code": "card_declined", "message": "Your card was declined."}}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id": "re_1", "status": "succeeded"}`)
	})
	code, out, errOut := runEnqueue(context.Background(), t, "{\"charge\":\"ch_ok\"}\n{\"charge\":\"ch_decline\"}\n",
		"--server", px.URL, "--tenant", "shop", "--file", "-", "--wait", "--progress", "none")
	if code != exitNotDelivered || !strings.Contains(out, "1 delivered, 1 failed") ||
		!strings.Contains(out, `line 2, job `) || !strings.Contains(out, `: failed, response 402 {"error":{"code":"card_declined","message":"Your card was declined."}}`) ||
		!strings.Contains(out, `: succeeded, response 201 {"id":"re_1","status":"succeeded"}`) {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "shop", "--data", `{"charge":"ch_decline"}`,
		"--idempotency-key", "json-1", "--wait", "--json", "--progress", "none")
	var sum summary
	if err := json.Unmarshal([]byte(out), &sum); err != nil || code != exitNotDelivered || len(sum.Outcomes) != 1 {
		t.Fatalf("exit %d %v\n%s%s", code, err, out, errOut)
	}
	if o := sum.Outcomes[0]; o.State != "failed" || o.Status != 402 || !strings.Contains(o.Body, "card_declined") || o.ID != sum.IDs[0] {
		t.Fatalf("outcome %+v", o)
	}
}

// --request goes with every job; one its downstream does not allow is
// refused for good, and the run says which part and why.
func TestRequestNotAllowed(t *testing.T) {
	t.Parallel()
	_, px := setup(t, "[tenant_defaults]\nrate = \"100/s\"\n")
	code, out, errOut := runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "shop", "--data", `{"a":1}`,
		"--request", `{"path":"/v1/refunds"}`, "--progress", "none")
	if code != exitRejected || !strings.Contains(errOut, "refused for good") || !strings.Contains(errOut, "request.path") ||
		!strings.Contains(errOut, "job_paths") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "shop", "--data", "1", "--request", `{"url":"x"}`); code != exitBadInput {
		t.Fatalf("bad --request: exit %d %s", code, errOut)
	}
}
