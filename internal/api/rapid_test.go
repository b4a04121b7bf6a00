package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// Requests drawn from openapi.json for every operation (rapid_gen_test.go),
// each with an admin, a viewer, a producer (acme only), no or a wrong
// token, sent to a live API over the embedded store, wired as the service
// wires it (tourConfig with queues of two, the dispatcher failing every
// job so that failed jobs exist to list and retry). Every answer must be
// one the document describes (checkExchange: a status the operation
// lists, or one the document gives every path; the body and the required
// headers as documented; a request the document calls malformed refused),
// no 5xx but a 503, an error body {"error", "message"}, no token in any
// answer, a body that is not JSON never taken, the access the document's
// prose promises (no token: 401 but on the public routes; a viewer
// changes nothing; a producer reaches its own tenant only, and another
// tenant's job is answered as if it did not exist), and every job
// accepted (202) found again by its id.
//
// Each check is a fresh server and a sequence of 1 to 10 requests, some
// resent. The default run is rapid's 100 checks (about 800 requests; 20
// checks under -short); a longer one is -rapid.checks=N after the package
// (docs/RELIABILITY.md).
func TestGeneratedRequestsAnswerAsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := apiDoc()
	if err != nil {
		t.Fatal(err)
	}
	ops := docOps(doc)
	names := make([]string, len(ops))
	var drawn []string // names, weighted
	for i, op := range ops {
		names[i] = op.name
		drawn = append(drawn, op.name)
		// More of the requests that make jobs, and of those that name
		// one, so that checks have jobs to read, cancel and retry.
		if op.bodyRequired {
			drawn = append(drawn, op.name, op.name)
		}
		if strings.Contains(op.path, "{id}") {
			drawn = append(drawn, op.name)
		}
	}
	// Queues of two jobs, not five: a check's few enqueues fill them, and
	// the 429 (its Retry-After and RateLimit fields) is checked too.
	body := strings.Replace(tourConfig, "capacity = 5\n", "capacity = 2\n", 1)
	if body == tourConfig {
		t.Fatal("tourConfig has no capacity = 5")
	}
	cfg := loadConfig(t, body)
	tl := &answerTally{byOp: map[string]map[int]int{}}
	start := time.Now()
	// Drawn fairly (see fair): 1 to 10 requests a check; under the race
	// detector, which runs the checks five times slower, 1 to 4.
	most := 10
	if testutil.Race {
		most = 4
	}
	count := rapid.Custom(func(t *rapid.T) int { return 1 + fair(t, "requests", most) })
	opName := rapid.Custom(func(t *rapid.T) string { return oneOf(t, "operation", drawn) })
	// A client resends: three requests in twenty go 1 to 3 times more (a
	// repeated key, a queue filling up to its 429).
	resends := rapid.Custom(func(t *rapid.T) int { return max(0, fair(t, "resends", 20)-16) })
	checks := func(pick func(rt *rapid.T) *docOp) func(rt *rapid.T) {
		return func(rt *rapid.T) {
			c := newCheck(t, rt, cfg, tl)
			for range count.Draw(rt, "requests") {
				r := requestFor(c.ids, pick(rt)).Draw(rt, "request")
				for range 1 + resends.Draw(rt, "resent") {
					c.send(r)
				}
			}
			c.acceptedAreFound(ops[slices.Index(names, "GET /v1/jobs/{id}")])
		}
	}
	rapid.Check(t, checks(func(rt *rapid.T) *docOp {
		return ops[slices.Index(names, opName.Draw(rt, "operation"))]
	}))
	// rapid's bits lean to zero, so a run of a hundred checks can leave an
	// operation out: such an operation gets checks of its own, its
	// requests among the others of each check.
	for _, op := range tl.undrawn(ops) {
		if testing.Short() {
			break // the short run reports coverage, it does not ask for it
		}
		t.Run("with "+op.name, func(t *testing.T) {
			rapid.Check(t, checks(func(rt *rapid.T) *docOp {
				if rapid.Bool().Draw(rt, "this operation") {
					return op
				}
				return ops[slices.Index(names, opName.Draw(rt, "operation"))]
			}))
		})
	}
	tl.report(t, ops, time.Since(start))
}

// check is one check's server and what it has seen.
type check struct {
	rt       *rapid.T
	h        http.Handler
	tally    *answerTally
	ids      []string          // the jobs accepted (202), in order
	tenantOf map[string]string // the tenant of each
}

// newCheck starts a server of its own for one check (a fresh store: a
// tenant's queue fills within a few requests, and a failure replays on
// the state it started from), stopped when the check ends.
func newCheck(t *testing.T, rt *rapid.T, cfg *config.Config, tl *answerTally) *check {
	// In memory where the machine has it: a store writes and syncs an 8
	// MiB log when it opens, a tenth of a second on a disk, times a check.
	base := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "throttler-rapid-")
	if err != nil {
		dir, err = os.MkdirTemp("", "throttler-rapid-")
	}
	if err != nil {
		rt.Fatal(err)
	}
	store, err := openStoreIn(dir, cfg, bolt.Options{})
	if err != nil {
		os.RemoveAll(dir)
		rt.Fatal(err)
	}
	h, stop := tourHandler(t, cfg, store)
	rt.Cleanup(func() {
		stop()
		store.Close()
		os.RemoveAll(dir)
	})
	return &check{rt: rt, h: h, tally: tl, tenantOf: map[string]string{}}
}

// send sends r and checks its answer.
func (c *check) send(r apiRequest) (int, map[string]any) {
	req := httptest.NewRequest(r.method, r.target, strings.NewReader(r.body))
	req.Header = r.header.Clone()
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, req)
	status, body := rec.Code, rec.Body.Bytes()
	c.tally.add(r.op.name, status)
	if err := checkExchange(r.method, r.target, r.body, r.header, status, rec.Header(), body); err != nil {
		c.rt.Fatalf("openapi.json: %v", err)
	}
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	if err := answerHolds(r, status, rec.Header(), body, m); err != nil {
		c.rt.Fatalf("%s %s (%s token): %d: %v\nbody: %s", r.method, r.target, r.token.name, status, err, truncate(string(body), 400))
	}
	if err := c.scopeHolds(r, status, m); err != nil {
		c.rt.Fatalf("%s %s (%s token): %d %v: %v", r.method, r.target, r.token.name, status, m, err)
	}
	c.note(r, status, m)
	return status, m
}

// errorCode is the form of every error code the document lists.
var errorCode = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// answerHolds checks what the document says of every answer beyond one
// operation's schemas.
func answerHolds(r apiRequest, status int, header http.Header, raw []byte, body map[string]any) error {
	if status >= 500 && status != http.StatusServiceUnavailable {
		return fmt.Errorf("a server error")
	}
	for _, tk := range tokenKinds {
		if tk.secret == "" {
			continue
		}
		if bytes.Contains(raw, []byte(tk.secret)) {
			return fmt.Errorf("the answer holds the %s token", tk.name)
		}
		for k, vs := range header {
			if strings.Contains(strings.Join(vs, " "), tk.secret) {
				return fmt.Errorf("header %s holds the %s token", k, tk.name)
			}
		}
	}
	// Every body the document takes is JSON: bytes that are not (however
	// lenient a streaming decoder is about what follows a value) are
	// refused.
	if r.body != "" && !json.Valid([]byte(r.body)) && status < 300 {
		return fmt.Errorf("a body that is not JSON was taken")
	}
	if status >= 400 && strings.HasPrefix(header.Get("Content-Type"), "application/json") {
		code, _ := body["error"].(string)
		msg, _ := body["message"].(string)
		if !errorCode.MatchString(code) || msg == "" {
			return fmt.Errorf(`an error answer without {"error": CODE, "message": TEXT}`)
		}
	}
	// With tokens configured, every route but the public ones needs one,
	// and a token the server does not know is refused wherever it is sent.
	unauthorized := status == http.StatusUnauthorized
	switch {
	case r.token.name == "wrong" && !unauthorized:
		return fmt.Errorf("an unknown token got past auth")
	case r.token.name == "none" && !r.op.public && !unauthorized:
		return fmt.Errorf("no token got past auth on a route that needs one")
	case r.token.name == "none" && r.op.public && unauthorized:
		return fmt.Errorf("a public route asked for a token")
	case unauthorized && (body["error"] != "unauthorized" || header.Get("WWW-Authenticate") == ""):
		return fmt.Errorf("401 without unauthorized and WWW-Authenticate")
	case r.token.name == "viewer" && r.method != http.MethodGet && status < 300:
		return fmt.Errorf("a viewer changed something")
	}
	return nil
}

// scopeHolds checks the producer's scope (acme) against the tenants r
// names and the job it names, and that no accepted job is lost to a
// token that reaches it.
func (c *check) scopeHolds(r apiRequest, status int, body map[string]any) error {
	if r.token.name == "producer" && status < 300 {
		for _, tn := range r.tenants {
			if tn != "acme" {
				return fmt.Errorf("a producer of acme reached tenant %q", tn)
			}
		}
	}
	tenant, known := c.tenantOf[r.id]
	if !known || r.token.name == "none" || r.token.name == "wrong" || status == http.StatusMethodNotAllowed {
		return nil
	}
	reaches := r.token.name != "producer" || tenant == "acme"
	code, _ := body["error"].(string)
	switch {
	case reaches && code == "job_not_found":
		return fmt.Errorf("job %s of %s, accepted, is not found", r.id, tenant)
	case !reaches && (status < 300 || code == "forbidden" || code == "not_cancellable" || code == "not_retryable"):
		return fmt.Errorf("a producer of acme learnt of job %s of %s", r.id, tenant)
	}
	return nil
}

// note keeps the jobs an answer accepted: a job enqueued (202), a batch's
// jobs answered 202.
func (c *check) note(r apiRequest, status int, body map[string]any) {
	if len(r.tenants) == 0 {
		return
	}
	keep := func(id any) {
		if s, ok := id.(string); ok && c.tenantOf[s] == "" {
			c.ids = append(c.ids, s)
			c.tenantOf[s] = r.tenants[0]
		}
	}
	switch {
	case r.op.name == "POST /v1/tenants/{tenant}/jobs" && status == http.StatusAccepted && r.method == http.MethodPost:
		keep(body["id"])
	case r.op.name == "POST /v1/tenants/{tenant}/jobs:batch" && status == http.StatusOK && r.method == http.MethodPost:
		results, _ := body["results"].([]any)
		for _, res := range results {
			if m, _ := res.(map[string]any); m["status"] == float64(http.StatusAccepted) {
				keep(m["id"])
			}
		}
	}
}

// acceptedAreFound reads every job the check's server accepted, by its id
// with the admin token: nothing accepted disappears.
func (c *check) acceptedAreFound(get *docOp) {
	admin := tokenKinds[0]
	for _, id := range c.ids {
		r := apiRequest{op: get, token: admin, method: "GET", target: "/v1/jobs/" + id, id: id,
			header: http.Header{"Authorization": {"Bearer " + admin.secret}}}
		status, body := c.send(r)
		if status != http.StatusOK || body["id"] != id || body["tenant"] != c.tenantOf[id] {
			c.rt.Fatalf("job %s of %s, accepted, read back as %d %v", id, c.tenantOf[id], status, body)
		}
	}
}

// answerTally counts the answers of a run, by operation and status.
type answerTally struct {
	mu   sync.Mutex
	byOp map[string]map[int]int
}

func (tl *answerTally) add(op string, status int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.byOp[op] == nil {
		tl.byOp[op] = map[int]int{}
	}
	tl.byOp[op][status]++
}

// undrawn are the operations no request has been drawn for yet.
func (tl *answerTally) undrawn(ops []*docOp) []*docOp {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var out []*docOp
	for _, op := range ops {
		if len(tl.byOp[op.name]) == 0 {
			out = append(out, op)
		}
	}
	return out
}

// report logs the run's figures (the long run's are in
// docs/RELIABILITY.md) and fails a full run that left an operation out.
func (tl *answerTally) report(t *testing.T, ops []*docOp, took time.Duration) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	requests, covered, happy := 0, 0, 0
	var lines []string
	for _, op := range ops {
		statuses := tl.byOp[op.name]
		n, ok := 0, false
		for st, k := range statuses {
			n += k
			ok = ok || st < 300
		}
		requests += n
		if n > 0 {
			covered++
		} else if !testing.Short() {
			t.Errorf("%s: no request drawn", op.name)
		}
		if ok {
			happy++
		}
		lines = append(lines, fmt.Sprintf("  %-40s %v", op.name, statuses))
	}
	t.Logf("%d requests, %d of %d operations covered (%d answered 2xx at least once), %v\n%s",
		requests, covered, len(ops), happy, took.Round(time.Millisecond), strings.Join(lines, "\n"))
}
