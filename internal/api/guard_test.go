package api

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/testutil"
)

// A client holds at most its share of the request slots: with a share of
// one, a token whose body is still coming is refused a second request at
// once (503, naming the setting, the connection closed), while another
// token and the health endpoints are answered.
func TestEachClientHoldsItsShareOfTheSlots(t *testing.T) {
	t.Parallel()
	h, _ := newAPIConfig(t, "[server]\nmax_requests_per_client = 1\n"+testutil.AuthTokens(
		testutil.Token{Name: "slow", Secret: "slow-token", Role: "producer", Tenants: []string{"a"}},
		testutil.Token{Name: "other", Secret: "other-token", Role: "producer", Tenants: []string{"b"}},
	), nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	// The slow one: headers and the start of a body, then nothing.
	var c net.Conn
	var answers *bufio.Reader
	sendSlow := func() {
		var err error
		if c, err = net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://")); err != nil {
			t.Fatal(err)
		}
		answers = bufio.NewReader(c)
		fmt.Fprintf(c, "POST /v1/tenants/a/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer slow-token\r\nContent-Length: 100\r\n\r\n{\"pay")
	}
	sendSlow()
	t.Cleanup(func() { c.Close() })
	postBody := func(tenant, token, body string) *http.Response {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/tenants/"+tenant+"/jobs", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	post := func(tenant, token string) *http.Response { return postBody(tenant, token, `{"payload":1}`) }
	// Until the server holds the slow request, a probe must queue nothing:
	// jobs admitted meanwhile would fill the tenant, and the slow request,
	// once whole, would be refused for that.
	testutil.WaitFor(t, 5*time.Second, "the slow request to hold the token's share", func() bool {
		if postBody("a", "slow-token", `{"payload":`).StatusCode == http.StatusServiceUnavailable {
			return true
		}
		// Not held: the server has not read the slow request yet, or it
		// came while the probe held the share, and was refused. Then it
		// has its answer: it is sent again.
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := answers.Peek(1)
		c.SetReadDeadline(time.Time{})
		if err == nil {
			c.Close()
			sendSlow()
		}
		return false
	})
	if resp := post("a", "slow-token"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !resp.Close {
		t.Errorf("the token's second request: %d, Retry-After %q, closed %v; want 503, 1, closed", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close)
	}
	if resp := post("b", "other-token"); resp.StatusCode != http.StatusAccepted {
		t.Errorf("another token's request: %d, want 202", resp.StatusCode)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, err := srv.Client().Get(srv.URL + path); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %v %v, want 200", path, resp, err)
		}
	}
	// The rest of the body: the slow one is admitted, and its share is free.
	fmt.Fprintf(c, "load\":1}%s", strings.Repeat(" ", 100-len(`{"payload":1}`)))
	resp, err := http.ReadResponse(answers, nil)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the slow request, once whole: %v %v, want 202", resp, err)
	}
	testutil.WaitFor(t, 5*time.Second, "the token's share free again", func() bool {
		return post("a", "slow-token").StatusCode == http.StatusAccepted
	})
}
