package outbound

import (
	"errors"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue"
)

// A downstream that is a Go handler compiles without a url: a job's
// request is checked against its job_* lists (the handler gets it), its
// payload is never encoded, and Keep keeps what the handler returns.
func TestHandlerDownstreamChecksTheJobsRequest(t *testing.T) {
	t.Parallel()
	keep := 4
	o, err := Compile("sms", config.Downstream{Handler: "sms", JobPaths: []string{"/v1/*"}, JobMethods: []string{"PUT"},
		JobHeaders: []string{"X-Tag"}, KeepResponseBytes: &keep})
	if err != nil || o.Handler() != "sms" {
		t.Fatalf("compile: %v %v", o, err)
	}
	if err := o.Check([]byte(`"any text"`), nil); err != nil {
		t.Fatalf("a job without a request: %v", err)
	}
	ok := &queue.JobRequest{Method: "put", Path: "/v1/a", Headers: map[string]string{"x-tag": "1"}}
	if err := o.Check([]byte(`{}`), ok); err != nil {
		t.Fatalf("an allowed request: %v", err)
	}
	for _, r := range []*queue.JobRequest{{Method: "DELETE"}, {Path: "/v2/a"}, {Headers: map[string]string{"X-Other": "1"}}} {
		var na *NotAllowedError
		if err := o.Check(nil, r); !errors.As(err, &na) || na.Code != CodeRequestNotAllowed {
			t.Fatalf("%+v: %v, want request_not_allowed", r, err)
		}
	}
	if r := o.Keep(0, nil, []byte("abcdef"), false); r.Body != "abcd" || !r.Truncated {
		t.Fatalf("kept %+v, want 4 bytes, truncated", r)
	}
}
