// Command fakegateway is a downstream to try throttler with, standing in for
// a rate-limited vendor API: it prints each request (time, gap since the
// previous one, the throttler's headers, the body), answers with a fixed
// status, and with --rate answers 429 with Retry-After past its own limit.
package main

import (
	"flag"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/throttler-dev/throttler/internal/fakegateway"
	"github.com/throttler-dev/throttler/internal/leaky"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to listen on")
	status := flag.Int("status", http.StatusOK, "status to answer with")
	rateFlag := flag.String("rate", "", `its own limit, N/DURATION (e.g. "10/s"); past it, 429 with Retry-After`)
	burst := flag.Int("burst", 1, "requests it takes at once after a quiet spell")
	flag.Parse()
	var rate *leaky.Rate
	if *rateFlag != "" {
		r, err := leaky.ParseRate(*rateFlag)
		if err != nil {
			log.Fatalf("fakegateway: --rate: %v", err)
		}
		rate = &r
	}
	srv := &http.Server{Addr: *listen, Handler: fakegateway.New(rate, *burst, *status, os.Stdout), ReadHeaderTimeout: 5 * time.Second}
	log.Printf("fakegateway: listening on %s, answering %d, limit %q burst %d", *listen, *status, *rateFlag, *burst)
	log.Fatal(srv.ListenAndServe())
}
