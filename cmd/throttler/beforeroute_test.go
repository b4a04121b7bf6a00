package main

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
)

// The HTTP server answers a request it cannot read itself, before any
// route and without auth, in text/plain: 400 for a malformed header, 431
// past 64 KiB of headers. The OpenAPI document it serves says so (its
// MalformedRequest and HeaderFieldsTooLarge answers), as it says every
// other answer.
func TestAnswersBeforeAnyRoute(t *testing.T) {
	t.Parallel()
	base := startServer(t, writeConfig(t, "", downstreamtest.New(t)))
	addr := strings.TrimPrefix(base, "http://")
	for _, c := range []struct {
		name, request string
		status        int
	}{
		{"a malformed header", "GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", http.StatusBadRequest},
		{"headers past 64 KiB", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", 80<<10) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
	} {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte(c.request)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != c.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Errorf("%s: %d %s, want %d in text/plain", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), c.status)
		}
	}
	_, _, raw := send(t, "GET", base+"/openapi.json", "")
	var doc struct {
		Components struct {
			Responses map[string]struct {
				Description string
				Content     map[string]any
			}
		}
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for name, status := range map[string]string{"MalformedRequest": "400", "HeaderFieldsTooLarge": "431"} {
		r, ok := doc.Components.Responses[name]
		if _, plain := r.Content["text/plain"]; !ok || !plain || !strings.Contains(r.Description, status) {
			t.Errorf("the served document's %s answer: %+v, want %s in text/plain", name, r, status)
		}
	}
}
