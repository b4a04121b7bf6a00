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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/downstreamtest"
)

func main() {
	root := &cobra.Command{Use: "loadgen", Short: "Measure a running throttler", SilenceUsage: true}
	root.AddCommand(admitCommand(), policiesCommand(), ceilingCommand(), fillCommand(), deliverCommand(), sinkCommand(), timersCommand())
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

// serverFlag is the --server flag of the commands that load a throttler.
func serverFlag(c *cobra.Command, server *string) {
	c.Flags().StringVar(server, "server", "http://127.0.0.1:8080", "throttler API")
}

func newClient(conns int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}}
}

func admitCommand() *cobra.Command {
	var server, ceiling, beside string
	var clients, tenants, rounds int
	var duration time.Duration
	c := &cobra.Command{
		Use:   "admit",
		Short: "POST single jobs from many keep-alive clients for a while; print admissions per second",
		Long: `POSTs single jobs to --server from --clients keep-alive clients, spread over
--tenants tenants, for --duration, and prints admissions per second and
latency. With --ceiling (the address of a loadgen ceiling process), runs
--rounds rounds alternating the server and the ceiling, and prints the
server's rate as a ratio of the ceiling's in each round: figures on a shared
machine move from run to run, ratios measured side by side move less.

With --beside (a second throttler, e.g. another build on another port),
loads both at the same time, --clients each, for --rounds rounds, and prints
the second's rate as a ratio of the first's. Both share the same minutes of
the machine and its CPU, so the ratio is the inverse of what each admission
costs them (above 1: the second costs less): an A/B comparison of two builds
with less noise than alternating them. Start both on fresh stores.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if ceiling != "" && beside != "" {
				return fmt.Errorf("--ceiling and --beside are two ways to compare: give one")
			}
			for _, u := range []string{server, ceiling, beside} {
				if u == "" {
					continue
				}
				if err := loopbackOnly(u); err != nil {
					return err
				}
			}
			if duration <= 0 || duration > 2*time.Minute || clients < 1 || clients > 4096 || tenants < 1 || rounds < 1 || rounds > 10 {
				return fmt.Errorf("--duration must be up to 2m, --clients 1 to 4096, --tenants at least 1 and --rounds 1 to 10: load runs are bounded")
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "clients %d, tenants %d, %v per run\n", clients, tenants, duration)
			client := newClient(clients)
			if beside != "" {
				admitBeside(out, client, newClient(clients), server, beside, clients, tenants, rounds, duration)
				return nil
			}
			if ceiling == "" {
				r := admitRun(client, server, "t", clients, tenants, duration)
				r.print(out, "server")
				return nil
			}
			ceilingClient := newClient(clients)
			var ratios []string
			for i := 1; i <= rounds; i++ {
				s := admitRun(client, server, "t", clients, tenants, duration)
				s.print(out, fmt.Sprintf("round %d server ", i))
				c := admitRun(ceilingClient, ceiling, "t", clients, tenants, duration)
				c.print(out, fmt.Sprintf("round %d ceiling", i))
				if c.rate() > 0 {
					ratios = append(ratios, fmt.Sprintf("%.2f", s.rate()/c.rate()))
				}
			}
			fmt.Fprintf(out, "server / ceiling by round: %s\n", strings.Join(ratios, " / "))
			return nil
		},
	}
	serverFlag(c, &server)
	c.Flags().StringVar(&ceiling, "ceiling", "", "a loadgen ceiling to alternate with (e.g. http://127.0.0.1:8090)")
	c.Flags().StringVar(&beside, "beside", "", "a second throttler to load at the same time (A/B), e.g. http://127.0.0.1:8081")
	c.Flags().IntVar(&rounds, "rounds", 3, "rounds, with --ceiling or --beside")
	c.Flags().IntVar(&clients, "clients", 64, "concurrent keep-alive clients")
	c.Flags().IntVar(&tenants, "tenants", 1000, "tenants to spread jobs over")
	c.Flags().DurationVar(&duration, "duration", 10*time.Second, "how long to run (at most 2m)")
	return c
}

// admitBeside loads server and beside at the same time, round after round,
// and prints beside's rate as a ratio of server's in each round.
func admitBeside(out io.Writer, client, besideClient *http.Client, server, beside string, clients, tenants, rounds int, duration time.Duration) {
	var ratios []string
	for i := 1; i <= rounds; i++ {
		var a, b admitResult
		var wg sync.WaitGroup
		wg.Go(func() { a = admitRun(client, server, "t", clients, tenants, duration) })
		wg.Go(func() { b = admitRun(besideClient, beside, "t", clients, tenants, duration) })
		wg.Wait()
		a.print(out, fmt.Sprintf("round %d server", i))
		b.print(out, fmt.Sprintf("round %d beside", i))
		if a.rate() > 0 {
			ratios = append(ratios, fmt.Sprintf("%.3f", b.rate()/a.rate()))
		}
	}
	fmt.Fprintf(out, "beside / server by round: %s\n", strings.Join(ratios, " / "))
}

// admitResult is one admit run: answers by status and latencies.
type admitResult struct {
	duration time.Duration
	counts   map[int]int64 // by status; 0: transport errors
	lat      []time.Duration
}

func (r admitResult) rate() float64 { return float64(len(r.lat)) / r.duration.Seconds() }

func (r admitResult) print(out io.Writer, label string) {
	total := int64(len(r.lat))
	fmt.Fprintf(out, "%s: requests %d: %.0f/s (202: %d, 429: %d, other: %d, errors: %d)", label, total, r.rate(),
		r.counts[202], r.counts[429], total-r.counts[202]-r.counts[429], r.counts[0])
	if n := len(r.lat); n > 0 {
		fmt.Fprintf(out, "; latency p50 %v p99 %v max %v", r.lat[n/2].Round(time.Microsecond), r.lat[n*99/100].Round(time.Microsecond), r.lat[n-1].Round(time.Microsecond))
	}
	fmt.Fprintln(out)
}

// admitRun posts single jobs to server from clients goroutines for
// duration, to tenants prefix0 to prefix(tenants-1).
func admitRun(client *http.Client, server, prefix string, clients, tenants int, duration time.Duration) admitResult {
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
				tenant := prefix + strconv.Itoa(rand.IntN(tenants))
				body := fmt.Sprintf(`{"payload":{"worker":%d,"n":%d,"text":"your code is 123456"}}`, w, i)
				start := time.Now()
				resp, err := client.Post(server+"/v1/tenants/"+tenant+"/jobs", "application/json", strings.NewReader(body))
				if err != nil {
					counts[0].Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(start))
				counts[min(resp.StatusCode, 599)].Add(1)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	r := admitResult{duration: duration, counts: map[int]int64{}, lat: lat}
	for i := range counts {
		if n := counts[i].Load(); n > 0 {
			r.counts[i] = n
		}
	}
	return r
}

func deliverCommand() *cobra.Command {
	var d deliverRun
	c := &cobra.Command{
		Use:   "deliver",
		Short: "Queue jobs for many tenants, receive them at a recording downstream, print deliveries per second and dispatch error",
		Long: `Starts a recording downstream on --sink (the throttler's downstream url must
point at it), enqueues --per-tenant jobs for each of --tenants tenants with the
batch endpoint, waits until every job arrived, and prints deliveries per
second, dispatch error (arrival at the downstream minus the job's slot) and
any window-rule violation per tenant.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			d.out, d.errw = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return d.run()
		},
	}
	serverFlag(c, &d.server)
	c.Flags().StringVar(&d.sink, "sink", "127.0.0.1:9100", "address of the recording downstream this starts")
	c.Flags().IntVar(&d.tenants, "tenants", 1000, "tenants")
	c.Flags().IntVar(&d.perTenant, "per-tenant", 25, "jobs per tenant")
	c.Flags().DurationVar(&d.timeout, "timeout", 2*time.Minute, "give up waiting after this")
	return c
}

// deliverRun is one run of loadgen deliver: its flags, and what it learnt.
type deliverRun struct {
	server, sink       string
	tenants, perTenant int
	timeout            time.Duration
	out, errw          io.Writer

	client   *http.Client
	slots    map[string]time.Time // job id -> its slot, as the API answered
	queuedAt time.Time            // when every batch had been answered
	all      []downstreamtest.Arrival
}

func (d *deliverRun) run() error {
	if err := d.check(); err != nil {
		return err
	}
	ds, err := downstreamtest.Start(d.sink)
	if err != nil {
		return err
	}
	defer ds.Close()
	d.client = newClient(32)
	start := time.Now()
	rejected := d.enqueueAll()
	d.queuedAt = time.Now()
	want := len(d.slots)
	fmt.Fprintf(d.errw, "queued %d jobs (%d refused) in %v, waiting for deliveries\n", want, rejected, d.queuedAt.Sub(start).Round(time.Millisecond))
	waitForArrivals(ds, want, d.timeout)
	d.all = ds.All()
	fmt.Fprintf(d.out, "tenants %d x %d jobs: %d queued, %d arrived (%d distinct)\n", d.tenants, d.perTenant, want, len(d.all), len(ds.Keys()))
	d.reportThroughput()
	d.reportDispatchError()
	d.reportSample()
	byTenant := map[string][]downstreamtest.Arrival{}
	for _, a := range d.all {
		byTenant[a.Tenant] = append(byTenant[a.Tenant], a)
	}
	d.reportByPlace(byTenant)
	d.reportViolations(byTenant)
	if len(ds.Keys()) < want {
		return fmt.Errorf("only %d of %d jobs arrived within %v", len(ds.Keys()), want, d.timeout)
	}
	return nil
}

// check keeps a run on loopback and bounded.
func (d *deliverRun) check() error {
	if err := loopbackOnly(d.server); err != nil {
		return err
	}
	if err := loopbackOnly("http://" + d.sink); err != nil {
		return err
	}
	if d.tenants < 1 || d.perTenant < 1 || d.perTenant > 1000 || d.tenants*d.perTenant > 1_000_000 || d.timeout <= 0 || d.timeout > 10*time.Minute {
		return fmt.Errorf("at most 1,000,000 jobs (1000 per tenant) and a --timeout up to 10m: load runs are bounded")
	}
	return nil
}

// enqueueAll sends each tenant's jobs in one batch, 32 tenants at a time,
// keeps the slot of every job admitted, and returns how many were refused.
func (d *deliverRun) enqueueAll() int64 {
	d.slots = map[string]time.Time{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var rejected atomic.Int64
	for i := 0; i < d.tenants; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results, err := d.enqueueTenant(i)
			if err != nil {
				fmt.Fprintln(d.errw, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, r := range results {
				if r.Status != 202 {
					rejected.Add(1)
					continue
				}
				at, _ := time.Parse(time.RFC3339Nano, r.DispatchAt)
				d.slots[r.ID] = at
			}
		}()
	}
	wg.Wait()
	return rejected.Load()
}

// batchResult is what loadgen reads of one job's answer in a batch.
type batchResult struct {
	Status     int    `json:"status"`
	ID         string `json:"id"`
	DispatchAt string `json:"dispatch_at"`
}

// enqueueTenant sends tenant t<i>'s jobs in one batch.
func (d *deliverRun) enqueueTenant(i int) ([]batchResult, error) {
	var b bytes.Buffer
	b.WriteString(`{"jobs":[`)
	for j := 0; j < d.perTenant; j++ {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"payload":{"n":%d}}`, j)
	}
	b.WriteString(`]}`)
	resp, err := d.client.Post(fmt.Sprintf("%s/v1/tenants/t%d/jobs:batch", d.server, i), "application/json", &b)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Results []batchResult `json:"results"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	return out.Results, nil
}

// waitForArrivals polls the recording downstream until want distinct jobs
// arrived or timeout passed (what arrived by then is reported either way).
func waitForArrivals(ds *downstreamtest.Server, want int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for len(ds.Keys()) < want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
}

// reportThroughput prints deliveries per second, overall and in the steady
// part: once everything is queued, until the last slot (what the schedule
// asks for, against what arrived).
func (d *deliverRun) reportThroughput() {
	all := d.all
	if len(all) <= 1 {
		return
	}
	span := all[len(all)-1].At.Sub(all[0].At)
	fmt.Fprintf(d.out, "deliveries %.0f/s over %v (first to last arrival)\n", float64(len(all)-1)/span.Seconds(), span.Round(time.Millisecond))
	var lastSlot time.Time
	for _, at := range d.slots {
		lastSlot = clock.Later(lastSlot, at)
	}
	var n int
	for _, a := range all {
		if !a.At.Before(d.queuedAt) && !a.At.After(lastSlot) {
			n++
		}
	}
	var asked int
	for _, at := range d.slots {
		if !at.Before(d.queuedAt) && !at.After(lastSlot) {
			asked++
		}
	}
	if w := lastSlot.Sub(d.queuedAt); w > 0 {
		fmt.Fprintf(d.out, "steady part (all queued, until the last slot, %v): %.0f/s arrived, %.0f/s scheduled\n", w.Round(time.Millisecond), float64(n)/w.Seconds(), float64(asked)/w.Seconds())
	}
}

// reportDispatchError prints arrival minus slot: of the jobs due after all
// were queued, and of all.
func (d *deliverRun) reportDispatchError() {
	var errs, steadyErrs []time.Duration
	for _, a := range d.all {
		if slot, ok := d.slots[a.Key]; ok {
			errs = append(errs, a.At.Sub(slot))
			if slot.After(d.queuedAt) {
				steadyErrs = append(steadyErrs, a.At.Sub(slot))
			}
		}
	}
	slices.Sort(errs)
	slices.Sort(steadyErrs)
	if n := len(steadyErrs); n > 0 {
		fmt.Fprintf(d.out, "dispatch error of jobs due after all were queued (%d): p50 %v p99 %v max %v\n", n,
			steadyErrs[n/2].Round(time.Microsecond), steadyErrs[n*99/100].Round(time.Microsecond), steadyErrs[n-1].Round(time.Microsecond))
	}
	if n := len(errs); n > 0 {
		fmt.Fprintf(d.out, "dispatch error (arrival - slot): min %v p50 %v p99 %v max %v\n", errs[0].Round(time.Microsecond),
			errs[n/2].Round(time.Microsecond), errs[n*99/100].Round(time.Microsecond), errs[n-1].Round(time.Microsecond))
	}
}

// reportSample prints where the time goes, on a sample of about 300 jobs:
// slot to the throttler's write (sent_at), and the write to the arrival.
func (d *deliverRun) reportSample() {
	var toWrite, toArrive []time.Duration
	for i, a := range d.all {
		if i%max(1, len(d.all)/300) != 0 {
			continue
		}
		resp, err := d.client.Get(d.server + "/v1/jobs/" + a.Key)
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
			toWrite = append(toWrite, j.SentAt.Sub(d.slots[a.Key]))
			toArrive = append(toArrive, a.At.Sub(j.SentAt))
		}
	}
	slices.Sort(toWrite)
	slices.Sort(toArrive)
	if n := len(toWrite); n > 0 {
		fmt.Fprintf(d.out, "sample of %d: slot to write p50 %v p99 %v; write to arrival p50 %v p99 %v\n", n,
			toWrite[n/2].Round(time.Microsecond), toWrite[n*99/100].Round(time.Microsecond),
			toArrive[n/2].Round(time.Microsecond), toArrive[n*99/100].Round(time.Microsecond))
	}
}

// reportByPlace prints lateness by place in the tenant's queue (growth along
// the queue is lateness each send adds and the next inherits), and of each
// tenant's first job (due at once: any lateness carries through its backlog).
func (d *deliverRun) reportByPlace(byTenant map[string][]downstreamtest.Arrival) {
	var firstLate []time.Duration
	byPlace := make([][]time.Duration, d.perTenant)
	for _, arr := range byTenant {
		if len(arr) > 0 {
			firstLate = append(firstLate, arr[0].At.Sub(d.slots[arr[0].Key]))
		}
		for i, a := range arr {
			if i < d.perTenant {
				byPlace[i] = append(byPlace[i], a.At.Sub(d.slots[a.Key]))
			}
		}
	}
	var b strings.Builder
	for i, ds := range byPlace {
		if len(ds) == 0 || (i%4 != 0 && i != d.perTenant-1) {
			continue
		}
		slices.Sort(ds)
		fmt.Fprintf(&b, " #%d:%v", i, ds[len(ds)/2].Round(100*time.Microsecond))
	}
	fmt.Fprintf(d.out, "median dispatch error by place in queue:%s\n", b.String())
	slices.Sort(firstLate)
	if n := len(firstLate); n > 0 {
		fmt.Fprintf(d.out, "first job of each tenant: dispatch error p50 %v p99 %v\n", firstLate[n/2].Round(time.Microsecond), firstLate[n*99/100].Round(time.Microsecond))
	}
}

// reportViolations prints how many tenants broke the window rule, each
// against its own interval.
func (d *deliverRun) reportViolations(byTenant map[string][]downstreamtest.Arrival) {
	violations := 0
	for _, arr := range byTenant {
		T := d.interval(arr)
		if v := downstreamtest.WindowViolation(arr, T, 1); T > 0 && v != "" {
			if violations == 0 {
				fmt.Fprintln(d.errw, "first violation:", v)
			}
			violations++
		}
	}
	fmt.Fprintf(d.out, "tenants breaking the window rule: %d of %d\n", violations, len(byTenant))
}

// interval is a tenant's own interval, from its slots: the smallest
// difference between consecutive slots (0 with fewer than two).
func (d *deliverRun) interval(arr []downstreamtest.Arrival) time.Duration {
	var T time.Duration
	if len(arr) < 2 {
		return 0
	}
	var ss []time.Time
	for _, a := range arr {
		ss = append(ss, d.slots[a.Key])
	}
	slices.SortFunc(ss, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(ss); i++ {
		if dt := ss[i].Sub(ss[i-1]); dt > 0 && (T == 0 || dt < T) {
			T = dt
		}
	}
	return T
}
