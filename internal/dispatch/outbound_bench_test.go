package dispatch

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"throttler/internal/config"
	"throttler/internal/leaky"
	"throttler/internal/outbound"
	"throttler/internal/queue"
)

// BenchmarkVendorRequest measures attempts per second with what a vendor
// asks (Basic auth, a form body, a Standard Webhooks signature, the answer
// kept) against plain JSON, in the same run: rounds of each in turn, so a
// machine shared with others slows both alike. Against a local server, at
// a rate that never holds a send back, with concurrent senders (one
// tenant each). It reports both rates, vendor/plain (the median of the
// rounds' ratios) and the CPU per attempt of each.
//
//	go test -run '^$' -bench VendorRequest -benchtime 40000x -count 5 ./internal/dispatch
func BenchmarkVendorRequest(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"sid":"SM00000000000000000000000000000001","status":"queued"}`)
	}))
	defer srv.Close()
	plain := compileDS(b, srv.URL+"/send", config.Downstream{})
	vendor := compileDS(b, srv.URL+"/2010-04-01/Accounts/AC0123/Messages.json", config.Downstream{
		Body:              config.BodyForm,
		Auth:              config.DownstreamAuth{Type: config.AuthBasic, Username: "AC0123", PasswordFile: secretFile(b, "tw-bench-token")},
		SigningSecretFile: secretFile(b, outbound.SecretPrefix+base64.StdEncoding.EncodeToString(hookKey)),
	})
	payload := []byte(`{"To":"+15550100","From":"+15550199","Body":"Your code is 123456","MediaUrl":["https://x.example/1.png","https://x.example/2.png"]}`)
	const senders, round = 32, 256
	dispatchers := map[*outbound.Downstream]*Dispatcher{}
	for _, o := range []*outbound.Downstream{plain, vendor} {
		r := routeTo(o)
		r.Policy = leaky.Policy{Interval: time.Microsecond, Burst: 1, Capacity: 1 << 20}
		dispatchers[o] = New(Options{Routes: func(string) Route { return r }, Client: NewClient(senders)})
		defer dispatchers[o].CloseIdleConnections()
	}
	cpu := map[*outbound.Downstream]time.Duration{}
	run := func(o *outbound.Downstream, n int) time.Duration {
		d := dispatchers[o]
		start, cpu0 := time.Now(), processCPU()
		defer func() { cpu[o] += processCPU() - cpu0 }()
		var wg sync.WaitGroup
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := s; i < n; i += senders {
					j := queue.Job{ID: fmt.Sprintf("01knb4s3vq5m8h7xkq2d9e%04d", i%10000), Tenant: fmt.Sprintf("t%d", s),
						Payload: payload, Attempts: 1, DispatchAt: time.Now()}
					if out := d.Handle(context.Background(), j); out.Result != queue.Succeeded || out.Response == nil {
						b.Errorf("attempt: %+v", out)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	run(plain, senders) // connections made, code warm
	run(vendor, senders)
	clear(cpu)
	b.ResetTimer()
	var tPlain, tVendor time.Duration
	var ratios []float64
	for done, i := 0, 0; done < b.N; done, i = done+round, i+1 {
		// Each goes first in every other round: the second of a pair
		// comes out faster by itself (measured: plain against plain, 1.05
		// to 1.15 in one order).
		n := min(round, b.N-done)
		var p, v time.Duration
		if i%2 == 0 {
			p, v = run(plain, n), run(vendor, n)
		} else {
			v, p = run(vendor, n), run(plain, n)
		}
		tPlain, tVendor = tPlain+p, tVendor+v
		ratios = append(ratios, p.Seconds()/v.Seconds())
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/tPlain.Seconds(), "plain_attempts/s")
	b.ReportMetric(float64(b.N)/tVendor.Seconds(), "vendor_attempts/s")
	// CPU per attempt (this process: the dispatcher and the server), which
	// other processes on the machine move less than wall time.
	b.ReportMetric(float64(cpu[plain].Microseconds())/float64(b.N), "plain_cpu_µs/attempt")
	b.ReportMetric(float64(cpu[vendor].Microseconds())/float64(b.N), "vendor_cpu_µs/attempt")
	// The median of the rounds' ratios: a round's pair ran within a few
	// milliseconds of each other, so a load that comes and goes (other
	// processes on the machine) weighs on both alike.
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "vendor/plain")
}
