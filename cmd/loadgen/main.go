// Command loadgen measures a running throttler: admissions per second over
// HTTP (admit), and deliveries per second with the dispatch error seen at a
// recording downstream (deliver). Loopback addresses only; every run is
// bounded in time and count.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"throttler/internal/downstreamtest"
)

func main() {
	root := &cobra.Command{Use: "loadgen", Short: "Measure a running throttler", SilenceUsage: true}
	root.AddCommand(admitCommand(), deliverCommand())
	if err := root.Execute(); err != nil {
		os.Exit(1)
	}
}

func loopbackOnly(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	h := u.Hostname()
	if h != "127.0.0.1" && h != "localhost" && h != "::1" {
		return fmt.Errorf("%s: loadgen only targets loopback addresses", raw)
	}
	return nil
}

func newClient(conns int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}}
}

func admitCommand() *cobra.Command {
	var server string
	var clients, tenants int
	var duration time.Duration
	c := &cobra.Command{
		Use:   "admit",
		Short: "POST single jobs from many keep-alive clients for a while; print admissions per second",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := loopbackOnly(server); err != nil {
				return err
			}
			if duration <= 0 || duration > 2*time.Minute || clients < 1 || clients > 4096 {
				return fmt.Errorf("--duration must be up to 2m and --clients 1 to 4096: load runs are bounded")
			}
			client := newClient(clients)
			var counts [600]atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			deadline := time.Now().Add(duration)
			var wg sync.WaitGroup
			for w := 0; w < clients; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []time.Duration
					for i := 0; time.Now().Before(deadline); i++ {
						tenant := fmt.Sprintf("t%d", rand.IntN(tenants))
						body := fmt.Sprintf(`{"payload":{"worker":%d,"n":%d,"text":"your code is 123456"}}`, w, i)
						start := time.Now()
						resp, err := client.Post(server+"/v1/tenants/"+tenant+"/jobs", "application/json", strings.NewReader(body))
						if err != nil {
							counts[599].Add(1)
							continue
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						mine = append(mine, time.Since(start))
						counts[resp.StatusCode].Add(1)
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			slices.Sort(lat)
			total := len(lat)
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "clients %d, tenants %d, %v\n", clients, tenants, duration)
			fmt.Fprintf(out, "requests %d: %.0f/s (202: %d, 429: %d, other: %d, errors: %d)\n", total, float64(total)/duration.Seconds(),
				counts[202].Load(), counts[429].Load(), int64(total)-counts[202].Load()-counts[429].Load(), counts[599].Load())
			if total > 0 {
				fmt.Fprintf(out, "latency p50 %v p99 %v max %v\n", lat[total/2].Round(time.Microsecond), lat[total*99/100].Round(time.Microsecond), lat[total-1].Round(time.Microsecond))
			}
			return nil
		},
	}
	c.Flags().StringVar(&server, "server", "http://127.0.0.1:8080", "throttler API")
	c.Flags().IntVar(&clients, "clients", 64, "concurrent keep-alive clients")
	c.Flags().IntVar(&tenants, "tenants", 1000, "tenants to spread jobs over")
	c.Flags().DurationVar(&duration, "duration", 10*time.Second, "how long to run (at most 2m)")
	return c
}

func deliverCommand() *cobra.Command {
	var server, sink string
	var tenants, perTenant int
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "deliver",
		Short: "Queue jobs for many tenants, receive them at a recording downstream, print deliveries per second and dispatch error",
		Long: `Starts a recording downstream on --sink (the throttler's downstream url must
point at it), enqueues --per-tenant jobs for each of --tenants tenants with the
batch endpoint, waits until every job arrived, and prints deliveries per
second, dispatch error (arrival at the downstream minus the job's slot) and
any window-rule violation per tenant.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := loopbackOnly(server); err != nil {
				return err
			}
			if err := loopbackOnly("http://" + sink); err != nil {
				return err
			}
			if tenants < 1 || perTenant < 1 || perTenant > 1000 || tenants*perTenant > 1_000_000 || timeout <= 0 || timeout > 10*time.Minute {
				return fmt.Errorf("at most 1,000,000 jobs (1000 per tenant) and a --timeout up to 10m: load runs are bounded")
			}
			ds, err := downstreamtest.Start(sink)
			if err != nil {
				return err
			}
			defer ds.Close()
			client := newClient(32)
			start := time.Now()
			slots := map[string]time.Time{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			sem := make(chan struct{}, 32)
			var rejected atomic.Int64
			for i := 0; i < tenants; i++ {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					var b bytes.Buffer
					b.WriteString(`{"jobs":[`)
					for j := 0; j < perTenant; j++ {
						if j > 0 {
							b.WriteByte(',')
						}
						fmt.Fprintf(&b, `{"payload":{"n":%d}}`, j)
					}
					b.WriteString(`]}`)
					resp, err := client.Post(fmt.Sprintf("%s/v1/tenants/t%d/jobs:batch", server, i), "application/json", &b)
					if err != nil {
						fmt.Fprintln(cmd.ErrOrStderr(), err)
						return
					}
					var out struct {
						Results []struct {
							Status     int    `json:"status"`
							ID         string `json:"id"`
							DispatchAt string `json:"dispatch_at"`
						} `json:"results"`
					}
					json.NewDecoder(resp.Body).Decode(&out)
					resp.Body.Close()
					mu.Lock()
					for _, r := range out.Results {
						if r.Status != 202 {
							rejected.Add(1)
							continue
						}
						at, _ := time.Parse(time.RFC3339Nano, r.DispatchAt)
						slots[r.ID] = at
					}
					mu.Unlock()
				}()
			}
			wg.Wait()
			queuedAt := time.Now()
			want := len(slots)
			fmt.Fprintf(cmd.ErrOrStderr(), "queued %d jobs (%d refused) in %v, waiting for deliveries\n", want, rejected.Load(), queuedAt.Sub(start).Round(time.Millisecond))
			deadline := time.Now().Add(timeout)
			for len(ds.Keys()) < want && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			all := ds.All()
			var errs []time.Duration
			for _, a := range all {
				if slot, ok := slots[a.Key]; ok {
					errs = append(errs, a.At.Sub(slot))
				}
			}
			slices.Sort(errs)
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "tenants %d x %d jobs: %d queued, %d arrived (%d distinct)\n", tenants, perTenant, want, len(all), len(ds.Keys()))
			if len(all) > 1 {
				span := all[len(all)-1].At.Sub(all[0].At)
				fmt.Fprintf(out, "deliveries %.0f/s over %v (first to last arrival)\n", float64(len(all)-1)/span.Seconds(), span.Round(time.Millisecond))
				// The steady part: once everything is queued, until the last
				// slot (what the schedule asks for, against what arrived).
				var lastSlot time.Time
				for _, at := range slots {
					lastSlot = later(lastSlot, at)
				}
				var n int
				for _, a := range all {
					if !a.At.Before(queuedAt) && !a.At.After(lastSlot) {
						n++
					}
				}
				var asked int
				for _, at := range slots {
					if !at.Before(queuedAt) && !at.After(lastSlot) {
						asked++
					}
				}
				if w := lastSlot.Sub(queuedAt); w > 0 {
					fmt.Fprintf(out, "steady part (all queued, until the last slot, %v): %.0f/s arrived, %.0f/s scheduled\n", w.Round(time.Millisecond), float64(n)/w.Seconds(), float64(asked)/w.Seconds())
				}
			}
			var steadyErrs []time.Duration
			for _, a := range all {
				if slot, ok := slots[a.Key]; ok && slot.After(queuedAt) {
					steadyErrs = append(steadyErrs, a.At.Sub(slot))
				}
			}
			slices.Sort(steadyErrs)
			if n := len(steadyErrs); n > 0 {
				fmt.Fprintf(out, "dispatch error of jobs due after all were queued (%d): p50 %v p99 %v max %v\n", n,
					steadyErrs[n/2].Round(time.Microsecond), steadyErrs[n*99/100].Round(time.Microsecond), steadyErrs[n-1].Round(time.Microsecond))
			}
			if n := len(errs); n > 0 {
				fmt.Fprintf(out, "dispatch error (arrival - slot): min %v p50 %v p99 %v max %v\n", errs[0].Round(time.Microsecond),
					errs[n/2].Round(time.Microsecond), errs[n*99/100].Round(time.Microsecond), errs[n-1].Round(time.Microsecond))
			}
			// Where the time goes, on a sample: slot to the throttler's write
			// (sent_at), and the write to the arrival.
			var toWrite, toArrive []time.Duration
			for i, a := range all {
				if i%max(1, len(all)/300) != 0 {
					continue
				}
				resp, err := client.Get(server + "/v1/jobs/" + a.Key)
				if err != nil {
					continue
				}
				var j struct {
					SentAt     time.Time `json:"sent_at"`
					DispatchAt time.Time `json:"dispatch_at"`
				}
				json.NewDecoder(resp.Body).Decode(&j)
				resp.Body.Close()
				if !j.SentAt.IsZero() {
					toWrite = append(toWrite, j.SentAt.Sub(slots[a.Key]))
					toArrive = append(toArrive, a.At.Sub(j.SentAt))
				}
			}
			slices.Sort(toWrite)
			slices.Sort(toArrive)
			if n := len(toWrite); n > 0 {
				fmt.Fprintf(out, "sample of %d: slot to write p50 %v p99 %v; write to arrival p50 %v p99 %v\n", n,
					toWrite[n/2].Round(time.Microsecond), toWrite[n*99/100].Round(time.Microsecond),
					toArrive[n/2].Round(time.Microsecond), toArrive[n*99/100].Round(time.Microsecond))
			}
			byTenant := map[string][]downstreamtest.Arrival{}
			for _, a := range all {
				byTenant[a.Tenant] = append(byTenant[a.Tenant], a)
			}
			// A tenant's first job is due at once; the rest are spaced after
			// it, so any lateness of the first carries through its backlog.
			var firstLate []time.Duration
			for _, arr := range byTenant {
				if len(arr) > 0 {
					firstLate = append(firstLate, arr[0].At.Sub(slots[arr[0].Key]))
				}
			}
			// Lateness by place in the tenant's queue: growth along the queue
			// is lateness each send adds and the next inherits.
			byPlace := make([][]time.Duration, perTenant)
			for _, arr := range byTenant {
				for i, a := range arr {
					if i < perTenant {
						byPlace[i] = append(byPlace[i], a.At.Sub(slots[a.Key]))
					}
				}
			}
			var b strings.Builder
			for i, ds := range byPlace {
				if len(ds) == 0 || (i%4 != 0 && i != perTenant-1) {
					continue
				}
				slices.Sort(ds)
				fmt.Fprintf(&b, " #%d:%v", i, ds[len(ds)/2].Round(100*time.Microsecond))
			}
			fmt.Fprintf(out, "median dispatch error by place in queue:%s\n", b.String())
			slices.Sort(firstLate)
			if n := len(firstLate); n > 0 {
				fmt.Fprintf(out, "first job of each tenant: dispatch error p50 %v p99 %v\n", firstLate[n/2].Round(time.Microsecond), firstLate[n*99/100].Round(time.Microsecond))
			}
			violations := 0
			for _, arr := range byTenant {
				T := time.Duration(0)
				if len(arr) > 1 {
					// Each tenant's own interval, from its slots: the smallest
					// difference between consecutive slots.
					var ss []time.Time
					for _, a := range arr {
						ss = append(ss, slots[a.Key])
					}
					slices.SortFunc(ss, func(a, b time.Time) int { return a.Compare(b) })
					for i := 1; i < len(ss); i++ {
						if d := ss[i].Sub(ss[i-1]); d > 0 && (T == 0 || d < T) {
							T = d
						}
					}
				}
				if v := downstreamtest.WindowViolation(arr, T, 1); T > 0 && v != "" {
					if violations == 0 {
						fmt.Fprintln(cmd.ErrOrStderr(), "first violation:", v)
					}
					violations++
				}
			}
			fmt.Fprintf(out, "tenants breaking the window rule: %d of %d\n", violations, len(byTenant))
			if len(ds.Keys()) < want {
				return fmt.Errorf("only %d of %d jobs arrived within %v", len(ds.Keys()), want, timeout)
			}
			return nil
		},
	}
	c.Flags().StringVar(&server, "server", "http://127.0.0.1:8080", "throttler API")
	c.Flags().StringVar(&sink, "sink", "127.0.0.1:9100", "address of the recording downstream this starts")
	c.Flags().IntVar(&tenants, "tenants", 1000, "tenants")
	c.Flags().IntVar(&perTenant, "per-tenant", 25, "jobs per tenant")
	c.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "give up waiting after this")
	return c
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
