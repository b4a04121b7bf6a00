// Command fakegateway is a downstream to try throttler with: it prints each
// request it receives (time, gap since the previous one, the throttler's
// headers, the body) and answers with a fixed status.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to listen on")
	status := flag.Int("status", http.StatusOK, "status to answer every request with")
	flag.Parse()
	var mu sync.Mutex
	var last time.Time
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		body, _ := io.ReadAll(io.LimitReader(r.Body, 4096))
		mu.Lock()
		gap := "-"
		if !last.IsZero() {
			gap = now.Sub(last).Round(time.Millisecond).String()
		}
		last = now
		fmt.Fprintf(os.Stdout, "%s  +%-8s tenant=%s attempt=%s key=%s  %s\n", now.Format("15:04:05.000"), gap,
			r.Header.Get("X-Throttler-Tenant"), r.Header.Get("X-Throttler-Attempt"), r.Header.Get("Idempotency-Key"), body)
		mu.Unlock()
		w.WriteHeader(*status)
	})
	log.Printf("fakegateway: listening on %s, answering %d", *listen, *status)
	log.Fatal(http.ListenAndServe(*listen, nil))
}
