package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
)

// benchAnswer is what both servers answer every request with: a 201 and
// a small JSON body, as Twilio's.
const benchAnswer = `{"sid":"SM00000000000000000000000000000001","status":"queued"}`

// benchPayload is a Twilio message: the vendor sends it as a form
// (MediaUrl repeated), plain as the JSON it is.
var benchPayload = []byte(`{"To":"+15550100","From":"+15550199","Body":"Your code is 123456","MediaUrl":["https://x.example/1.png","https://x.example/2.png"]}`)

// BenchmarkVendorRequest measures attempts per second with what a vendor
// asks (Basic auth, a form body, a Standard Webhooks signature, the answer
// kept) against plain JSON, in the same run: rounds of each in turn, so a
// machine shared with others slows both alike. Against a local server, at
// a rate that never holds a send back, with concurrent senders (one
// tenant each). It reports both rates, vendor/plain (the median of the
// rounds' ratios) and the CPU per attempt of each.
//
// The server shares the process, so its work counts as the sender's.
// net-http is net/http's server, which makes a string and a map entry of
// every header it reads, the vendor's four more too (Authorization,
// webhook-id, -timestamp, -signature). same-server-work reads each
// request's lines and body and writes the same answer whatever the
// headers, so what differs is the sender's alone. headers-alike (net/http's
// server) has plain send four static headers of the sizes of the vendor's
// four: both send as many headers and bytes, and what is left is the cost
// of computing the vendor's (the form, the signature), apart from what
// net/http spends on four more headers each side (sorted, cloned for
// redirects, written, parsed; eleven on the server, past the eight a
// small Go map holds).
//
//	go test -run '^$' -bench VendorRequest -benchtime 40000x -count 5 ./internal/dispatch
func BenchmarkVendorRequest(b *testing.B) {
	netHTTP := func(b *testing.B) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, benchAnswer)
		}))
		b.Cleanup(srv.Close)
		return srv.URL
	}
	b.Run("net-http", func(b *testing.B) { benchVendor(b, netHTTP(b), nil) })
	b.Run("same-server-work", func(b *testing.B) { benchVendor(b, wireServer(b), nil) })
	b.Run("headers-alike", func(b *testing.B) {
		benchVendor(b, netHTTP(b), map[string]string{
			"X-Pad-Authorization": "Basic QUMwMTIzOnR3LWJlbmNoLXRva2Vu", "X-Pad-Webhook-Id": "01knb4s3vq5m8h7xkq2d9e0001",
			"X-Pad-Webhook-Timestamp": "1764650000", "X-Pad-Webhook-Signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
		})
	})
}

// benchVendor is BenchmarkVendorRequest against the server at base, plain
// sending plainHeaders too.
func benchVendor(b *testing.B, base string, plainHeaders map[string]string) {
	plain := compileDS(b, base+"/send", config.Downstream{Headers: plainHeaders})
	vendor := compileDS(b, base+"/2010-04-01/Accounts/AC0123/Messages.json", config.Downstream{
		Body:              config.BodyForm,
		Auth:              config.DownstreamAuth{Type: config.AuthBasic, Username: "AC0123", PasswordFile: secretFile(b, "tw-bench-token")},
		SigningSecretFile: secretFile(b, outbound.SecretPrefix+base64.StdEncoding.EncodeToString(hookKey)),
	})
	const senders, round = 32, 256
	cpu := map[*outbound.Downstream]time.Duration{}
	run := map[*outbound.Downstream]func(int) time.Duration{}
	for _, o := range []*outbound.Downstream{plain, vendor} {
		r := routeTo(o)
		r.Policy = leaky.Policy{Interval: time.Microsecond, Burst: 1, Capacity: 1 << 20}
		d := New(Options{Routes: func(string) Route { return r }, Client: NewClient(senders)})
		defer d.CloseIdleConnections()
		run[o] = func(n int) time.Duration {
			start, cpu0 := time.Now(), processCPU()
			sendAll(b, d, senders, n)
			cpu[o] += processCPU() - cpu0
			return time.Since(start)
		}
	}
	run[plain](senders) // connections made, code warm
	run[vendor](senders)
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
			p, v = run[plain](n), run[vendor](n)
		} else {
			v, p = run[vendor](n), run[plain](n)
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

// sendAll hands n attempts to d from senders goroutines, one tenant each,
// and waits for them: each must succeed and keep the answer.
func sendAll(b *testing.B, d *Dispatcher, senders, n int) {
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := s; i < n; i += senders {
				j := queue.Job{ID: fmt.Sprintf("01knb4s3vq5m8h7xkq2d9e%04d", i%10000), Tenant: fmt.Sprintf("t%d", s),
					Payload: benchPayload, Attempts: 1, DispatchAt: time.Now()}
				if out := d.Handle(context.Background(), j); out.Result != queue.Succeeded || out.Response == nil {
					b.Errorf("attempt: %+v", out)
					return
				}
			}
		})
	}
	wg.Wait()
}

// wireServer serves HTTP/1.1 as plainly as it can be served: it reads a
// request's lines up to the blank one and Content-Length bytes of body,
// and writes benchAnswer. Its work follows the request's size alone, not
// which headers it has. It returns the server's base url.
func wireServer(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveWire(c)
		}
	}()
	return "http://" + ln.Addr().String()
}

func serveWire(c net.Conn) {
	defer c.Close()
	answer := []byte("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(benchAnswer)) + "\r\n\r\n" + benchAnswer)
	r := bufio.NewReader(c)
	for {
		length := 0
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return // the client closed it, or a line longer than the buffer: not ours
			}
			if len(line) <= len("\r\n") {
				break
			}
			if name, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(name, []byte("Content-Length")) {
				length, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
			}
		}
		if _, err := r.Discard(length); err != nil {
			return
		}
		if _, err := c.Write(answer); err != nil {
			return
		}
	}
}
