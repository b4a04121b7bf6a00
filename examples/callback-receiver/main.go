// Command callback-receiver receives throttler's callbacks (DESIGN.md
// section 6b): it verifies each one's Standard Webhooks signature, with
// nothing but the standard library (not throttler's code), drops a repeat
// by its webhook-id, and prints one JSON line per callback it accepts:
//
//	export THROTTLER_CALLBACK_SECRET="whsec_$(openssl rand -base64 32)"  # the same value throttler has
//	go run ./examples/callback-receiver -listen 127.0.0.1:9100
//
// with throttler's config saying
//
//	[callbacks]
//	signing_secret_env = "THROTTLER_CALLBACK_SECRET"
//	allow = ["http://127.0.0.1:9100/"]
//
// and a job (or its tenant) giving "callback_url":
// "http://127.0.0.1:9100/hooks". A callback it cannot verify is answered
// 401 (throttler tries it again, then gives up); one it accepts, 204.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9100", "host:port to listen on")
	flag.Parse()
	secret := os.Getenv("THROTTLER_CALLBACK_SECRET")
	if secret == "" {
		log.Fatal("set THROTTLER_CALLBACK_SECRET to the whsec_ secret throttler signs with")
	}
	r := &receiver{secret: secret, seen: map[string]bool{}, out: json.NewEncoder(os.Stdout)}
	log.Printf("listening on %s", *listen)
	log.Fatal(http.ListenAndServe(*listen, r))
}

// receiver verifies and prints callbacks. A real one would keep the ids
// it has seen in its database, in the transaction that acts on the event.
type receiver struct {
	secret string
	mu     sync.Mutex
	seen   map[string]bool
	out    *json.Encoder
}

// event is a callback's body: the job as GET /v1/jobs/{id} shows it.
type event struct {
	Type string `json:"type"` // job.succeeded, job.failed, job.expired, job.cancelled
	Job  struct {
		ID       string `json:"id"`
		Tenant   string `json:"tenant"`
		State    string `json:"state"`
		Response *struct {
			Status int    `json:"status"`
			Body   string `json:"body"`
		} `json:"response"`
	} `json:"job"`
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 4<<20))
	if err != nil {
		http.Error(w, "cannot read the body", http.StatusBadRequest)
		return
	}
	if err := verify(r.secret, req.Header, body, time.Now()); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var ev event
	if err := json.Unmarshal(body, &ev); err != nil {
		http.Error(w, "not a callback", http.StatusBadRequest)
		return
	}
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	repeat := r.seen[id]
	r.seen[id] = true
	r.out.Encode(map[string]any{"webhook_id": id, "type": ev.Type, "job": ev.Job.ID, "tenant": ev.Job.Tenant, "state": ev.Job.State, "repeat": repeat})
	r.mu.Unlock()
	// A repeat (throttler tries again until it hears a 2xx) is answered
	// 2xx as well, and not acted on twice.
	w.WriteHeader(http.StatusNoContent)
}

// verify checks a Standard Webhooks signature: secret is "whsec_<base64
// key>"; the signature is HMAC-SHA256 over "id.timestamp.body", one
// "v1,<base64>" per secret throttler signs with (two while it rotates).
func verify(secret string, h http.Header, body []byte, now time.Time) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return errors.New("the secret is not whsec_ and base64")
	}
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil || now.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return errors.New("webhook-id missing, or webhook-timestamp missing or more than 5 minutes off")
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.", id, ts)
	mac.Write(body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return errors.New("no valid webhook-signature")
}
