package outbound

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue"
)

func TestKeep(t *testing.T) {
	t.Parallel()
	o := compile(t, config.Downstream{URL: "https://x.example/", KeepResponseHeaders: []string{"x-request-id"}, KeepResponseBytes: ptr(8)})
	h := http.Header{}
	h.Add("Content-Type", "application/json")
	h.Add("Location", "/v1/x")
	h.Add("Retry-After", "3")
	h.Add("X-Request-Id", "a")
	h.Add("X-Request-Id", "b")
	h.Add("Set-Cookie", "session=secret")
	h.Add("X-Other", "no")
	cases := []struct {
		body      string
		truncated bool
		want      queue.Response
	}{
		{`{"id":1}`, false, queue.Response{Body: `{"id":1}`}},
		{`{"id":12}`, false, queue.Response{Body: `{"id":12`, Truncated: true}},
		{`short`, true, queue.Response{Body: `short`, Truncated: true}},
		{`abcdefgé`, false, queue.Response{Body: `abcdefg`, Truncated: true}}, // é split by the cut: dropped whole
		{`abcdeé`, false, queue.Response{Body: `abcdeé`}},
		{"\xff\xfe\x00b", false, queue.Response{BodyBase64: base64.StdEncoding.EncodeToString([]byte("\xff\xfe\x00b"))}},
		{``, false, queue.Response{}},
	}
	for _, c := range cases {
		got := o.Keep(201, h, []byte(c.body), c.truncated)
		c.want.Status = 201
		c.want.Headers = map[string]string{"Content-Type": "application/json", "Location": "/v1/x", "Retry-After": "3", "X-Request-Id": "a, b"}
		if !reflect.DeepEqual(*got, c.want) {
			t.Errorf("%q: got %+v, want %+v", c.body, *got, c.want)
		}
	}
	// The default keeps 4096 bytes; 0 keeps none; the JSON shape.
	big := strings.Repeat("x", 5000)
	if r := compile(t, config.Downstream{URL: "https://x.example/"}).Keep(200, nil, []byte(big), false); len(r.Body) != 4096 || !r.Truncated || len(r.Headers) != 0 {
		t.Errorf("default: %d %v", len(r.Body), r.Truncated)
	}
	r := compile(t, config.Downstream{URL: "https://x.example/", KeepResponseBytes: ptr(0)}).Keep(204, h, []byte("x"), false)
	b, _ := json.Marshal(r)
	if string(b) != `{"status":204,"headers":{"Content-Type":"application/json","Location":"/v1/x","Retry-After":"3"},"truncated":true}` {
		t.Errorf("%s", b)
	}
}
