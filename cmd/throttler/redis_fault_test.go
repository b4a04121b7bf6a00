package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	goredis "github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// Faults between the workers and Redis: the API
// talks to Redis directly, two workers through a TCP proxy of the test's
// own (toxiproxy as a library, on loopback). Jobs flow for several tenants
// while the proxy adds 50 ms each way for a few seconds, then cuts every
// connection and refuses new ones for 3 s (three leases of 1 s: the
// workers lose every partition), then lets them through again. Checked:
// every accepted job succeeds; every arrival's Idempotency-Key was
// accepted, and a key arrives twice only if its first attempt was sent
// before the workers could have known they had lost their leases; every
// tenant's spacing at the downstream holds (T - 2 ms); and a job accepted
// a second after the cut ends arrives when its expected_delay_ms said.
func TestRedisFaultsBetweenWorkerAndRedis(t *testing.T) {
	testutil.SkipShort(t, "process test: throttler processes through seconds of faults between them and Redis")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	srv := redistest.Start(t, false)
	px := startToxiproxy(t, srv.Addr)
	ds := downstreamtest.New(t)
	const (
		T        = 100 * time.Millisecond
		lease    = time.Second // redisConfig's
		feedGap  = 200 * time.Millisecond
		latency  = 50 * time.Millisecond
		cutFor   = 3 * time.Second
		tenantsN = 4
	)
	body := "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 200\n"
	direct := redisConfig(t, srv.URL(), "standalone", body, ds)
	proxied := redisConfig(t, "redis://"+px.Listen+"/0", "standalone", body, ds)
	api := startProcess(t, direct, "--role", "api")
	workers := []*process{startProcess(t, proxied, "--role", "worker"), startProcess(t, proxied, "--role", "worker")}

	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	// epochs is each partition's lease epoch, or nil while one has no
	// owner.
	epochs := func() []int64 {
		ls, err := owner.ReadLeases(context.Background(), rdb, owner.PartitionsDefault)
		if err != nil {
			return nil
		}
		var out []int64
		for _, l := range ls {
			if l.Worker == "" {
				return nil
			}
			out = append(out, l.Epoch)
		}
		return out
	}
	ownedByWorkers := func() bool { return epochs() != nil }
	testutil.WaitFor(t, 20*time.Second, "every partition owned", atMostEvery(50*time.Millisecond, ownedByWorkers))
	for _, w := range workers {
		testutil.WaitFor(t, 10*time.Second, "a worker ready", atMostEvery(50*time.Millisecond, func() bool {
			st, _, _ := call(t, "GET", w.base+"/readyz", "")
			return st == http.StatusOK
		}))
	}

	tenants := make([]string, tenantsN)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("fault-%d", i)
	}
	// The feed: each tenant a job every feedGap (half its rate), every
	// third with an Idempotency-Key of the client's, from now until a
	// while after the cut ends.
	feed := newFeeder(api.base)
	began := time.Now()
	latencyAt := began.Add(2 * time.Second)
	cutAt := latencyAt.Add(3 * time.Second)
	restoreAt := cutAt.Add(cutFor)
	probeAt := restoreAt.Add(time.Second)
	feedEnd := restoreAt.Add(2 * time.Second)
	var feeding sync.WaitGroup
	feeding.Add(1)
	go func() {
		defer feeding.Done()
		for n, at := 0, began; at.Before(feedEnd); n, at = n+1, at.Add(feedGap) {
			arriveAt(at)
			for _, tn := range tenants {
				key := ""
				if n%3 == 0 {
					key = fmt.Sprintf("client-%s-%d", tn, n)
				}
				feed.enqueue(tn, key)
			}
		}
	}()

	arriveAt(latencyAt)
	before := epochs()
	px.addLatency(t, latency)
	arriveAt(cutAt)
	// 100 ms a round trip is well inside the lease: no partition changed
	// hands.
	if during := epochs(); before == nil || !slices.Equal(before, during) {
		t.Errorf("leases before the latency %v, at its end %v: want the same owners and epochs", before, during)
	}
	px.removeLatency(t)
	px.cut(t)
	cutDone := time.Now()
	arriveAt(restoreAt)
	px.restore(t)
	restored := time.Now()
	t.Logf("latency at +%v, cut at +%v (took %v), restored at +%v",
		latencyAt.Sub(began).Round(time.Millisecond), cutAt.Sub(began).Round(time.Millisecond),
		cutDone.Sub(cutAt).Round(time.Millisecond), restored.Sub(began).Round(time.Millisecond))

	// A second after the cut ends: a probe to a tenant that had no jobs,
	// and one to each tenant of the feed.
	arriveAt(probeAt)
	probes := map[string]probe{}
	// What Redis holds of each tenant's schedule around the probes' admission
	// (slots relative to the restore), logged only if a probe misses its
	// promise: a busy CI run saw two probes promised one interval too soon
	// after a takeover that took a job back, and no run since.
	var schedules strings.Builder
	dump := func(when string) {
		for _, tn := range tenants {
			pfx := owner.KeyPrefix(owner.PartitionOf(tn, owner.PartitionsDefault))
			h := rdb.HGetAll(context.Background(), pfx+"tenant:"+tn).Val()
			rel := func(us string) string {
				v, _ := strconv.ParseFloat(us, 64)
				return time.UnixMicro(int64(v)).Sub(restored).Round(time.Millisecond).String()
			}
			var w, c []string
			for _, z := range rdb.ZRangeWithScores(context.Background(), pfx+"waiting:"+tn, 0, -1).Val() {
				w = append(w, rel(fmt.Sprint(int64(z.Score))))
			}
			for _, z := range rdb.ZRangeWithScores(context.Background(), pfx+"claimed:"+tn, 0, -1).Val() {
				c = append(c, rel(fmt.Sprint(int64(z.Score))))
			}
			fmt.Fprintf(&schedules, "\n  %s, %s: tat %s, next %s, depth %s, in flight %s; waiting %v; claimed %v", when, tn, rel(h["tat"]), rel(h["next"]), h["depth"], h["inflight"], w, c)
		}
	}
	dump("before the probes")
	for _, tn := range append([]string{"fault-quiet"}, tenants...) {
		p := feed.probe(t, tn)
		probes[p.id] = p
	}
	dump("after them")
	feeding.Wait()
	if errs := feed.errors(); len(errs) > 0 {
		t.Fatalf("%d enqueues failed; the first: %s", len(errs), errs[0])
	}
	ids := feed.ids()
	for id := range probes {
		ids = append(ids, id)
	}
	t.Logf("%d jobs accepted (%d with a client's Idempotency-Key, each answered once)", len(ids), feed.keyed)
	waitAllSucceeded(t, api.base, ids, 40*time.Second)
	nothingMoreWithin(3 * T) // a late repeat would come now

	all := ds.All()
	accepted := map[string]bool{}
	for _, id := range ids {
		accepted[id] = true
	}
	first := map[string]time.Time{}
	var repeats []string
	for _, a := range all {
		if !accepted[a.Key] {
			t.Fatalf("delivered Idempotency-Key %q that was never accepted", a.Key)
		}
		at, seen := first[a.Key]
		if !seen {
			first[a.Key] = a.At
			continue
		}
		repeats = append(repeats, a.Key)
		t.Logf("repeat of %s (%s): first sent at +%v (cut at +%v), again at +%v", a.Key, a.Tenant,
			at.Sub(began).Round(time.Millisecond), cutAt.Sub(began).Round(time.Millisecond), a.At.Sub(began).Round(time.Millisecond))
		// A send written in the cut is one the worker had claimed before
		// it, written while it still held the lease by its own clock (at
		// most a lease after its last renewal, which was before the cut).
		if at.After(cutAt.Add(lease)) || a.At.Before(restoreAt) {
			t.Errorf("%s repeated: first at +%v, again at +%v; only a job in flight at the cut may repeat, after the cut",
				a.Key, at.Sub(began), a.At.Sub(began))
		}
	}
	for _, id := range ids {
		if first[id].IsZero() {
			t.Fatalf("job %s succeeded but never reached the downstream", id)
		}
	}

	var afterCut time.Duration
	for _, a := range all {
		if a.At.After(restoreAt) {
			afterCut = a.At.Sub(restored)
			break
		}
	}
	t.Logf("%d arrivals, %d repeats (same Idempotency-Key); first delivery %v after the cut ended", len(all), len(repeats), afterCut.Round(time.Millisecond))
	for _, tn := range tenants {
		of := ds.Of(tn)
		var gap time.Duration
		closest := time.Hour
		for i := 1; i < len(of); i++ {
			gap = max(gap, of[i].At.Sub(of[i-1].At))
			closest = min(closest, of[i].At.Sub(of[i-1].At))
		}
		var slow time.Duration // the longest gap with the latency on
		for i := 1; i < len(of); i++ {
			if of[i-1].At.After(latencyAt) && of[i].At.Before(cutAt) {
				slow = max(slow, of[i].At.Sub(of[i-1].At))
			}
		}
		t.Logf("%s: %d arrivals, the longest gap %v (%v with 50 ms each way), the closest pair %v",
			tn, len(of), gap.Round(time.Millisecond), slow.Round(time.Millisecond), closest.Round(10*time.Microsecond))
		downstreamtest.CheckWindows(t, of, T, 1)
		// No tenant waits much past the cut: the partitions are taken
		// again within a lease of it ending.
		if gap > cutFor+lease+time.Second {
			t.Errorf("%s: a gap of %v, more than the cut (%v) plus a lease plus a second", tn, gap, cutFor)
		}
	}

	// Honest delay again a second after the cut: each probe arrives when
	// its expected_delay_ms said, within DESIGN.md's max(50 ms, 5%). The
	// promise counts on the sends ahead of it going one interval apart;
	// a send the worker wrote late (a gap over T + 2 ms while the probe
	// waited behind a backlog: the worker was not given the CPU, with
	// other tests' benchmarks on the same two cores) moves every send
	// after it, the probe's too, and is the sender's, not the promise's.
	// A lag the sends carried into the probe's admission is the same: the
	// first send after the answer, later than the time the schedule gave
	// it (its dispatch_at; a busy CI run's were 100-136 ms apart at T =
	// 100 ms, 71 ms behind by the probe). So lateness is judged less those
	// stalls and that lag (both logged); earliness as it is. The promise
	// counts from the decision, which came somewhere between the request
	// and its answer (a busy CI run's took 100 ms): lateness is counted
	// from the answer, earliness from the request.
	for id, p := range probes {
		arrived := first[id]
		got := arrived.Sub(p.sent)
		tol := max(50*time.Millisecond, p.promised/20)
		of := ds.Of(p.tenant)
		stalls := stalls(of, p.sent, arrived, T)
		carried := behind(of, p.answered, id, func(key string) (time.Time, bool) { return dispatchAtOf(jobState(t, api.base, key)) })
		off, late := got-p.promised, arrived.Sub(p.answered)-p.promised
		t.Logf("probe %s: promised %v, arrived %v after the request, %v after the answer (%+v; the sends ahead of it stalled %v, and were %v behind their schedule when it was admitted)",
			p.tenant, p.promised, got.Round(time.Millisecond), arrived.Sub(p.answered).Round(time.Millisecond), late.Round(time.Millisecond), stalls.Round(time.Millisecond), carried.Round(time.Millisecond))
		if late-stalls-carried > tol || -off > tol {
			var b strings.Builder
			for _, a := range of {
				if a.At.After(restoreAt) {
					fmt.Fprintf(&b, "\n  +%v %s attempt %s", a.At.Sub(restored).Round(100*time.Microsecond), a.Key, a.Attempt)
				}
			}
			t.Errorf("probe %s (%s) accepted %v after the cut ended: promised %v, arrived after %v, the sends ahead of it stalled %v and were %v behind (tolerance %v); its tenant's arrivals after the cut:%s\nthe schedules in Redis:%s",
				p.tenant, id, p.sent.Sub(restored).Round(time.Millisecond), p.promised, got.Round(time.Millisecond), stalls.Round(time.Millisecond), carried.Round(time.Millisecond), tol, b.String(), schedules.String())
		}
	}
	for _, w := range workers {
		select {
		case <-w.done:
			t.Errorf("a worker exited:\n%s", w.logs())
		default:
		}
		if logs := w.logs(); !strings.Contains(logs, "lost a partition") {
			t.Errorf("a worker never logged losing a partition in a 3 s cut:\n%s", logs)
		}
	}
}

// proxy is a toxiproxy proxy in the test's process, on a loopback port.
type proxy struct {
	*toxiproxy.Proxy
}

// startToxiproxy forwards a free loopback port to upstream; it stops when
// the test ends.
func startToxiproxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "redis", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return &proxy{p}
}

// addLatency delays every chunk d, each way.
func (p *proxy) addLatency(t *testing.T, d time.Duration) {
	t.Helper()
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name":"latency-%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, stream, d.Milliseconds())
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			t.Fatal(err)
		}
	}
}

func (p *proxy) removeLatency(t *testing.T) {
	t.Helper()
	for _, stream := range []string{"upstream", "downstream"} {
		if err := p.Toxics.RemoveToxic(context.Background(), "latency-"+stream); err != nil {
			t.Fatal(err)
		}
	}
}

// cut closes every connection through the proxy and refuses new ones
// (its port no longer listens) until restore.
func (p *proxy) cut(t *testing.T) { p.Stop() }

// restore listens again on the same port.
func (p *proxy) restore(t *testing.T) {
	t.Helper()
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
}

// feeder enqueues jobs from a goroutine and keeps what came back.
type feeder struct {
	base  string
	mu    sync.Mutex
	got   []string
	errs  []string
	keyed int
}

func newFeeder(base string) *feeder { return &feeder{base: base} }

type probe struct {
	id, tenant     string
	sent, answered time.Time // the request's start, its answer's
	promised       time.Duration
}

// post enqueues one job for tenant (with key as its Idempotency-Key
// unless empty) and returns the answer.
func (f *feeder) post(tenant, key string) (int, map[string]any, error) {
	req, err := http.NewRequest("POST", f.base+"/v1/tenants/"+tenant+"/jobs", bytes.NewBufferString(`{"payload":{}}`))
	if err != nil {
		return 0, nil, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	err = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m, err
}

func (f *feeder) enqueue(tenant, key string) {
	st, m, err := f.post(tenant, key)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil || st != http.StatusAccepted {
		f.errs = append(f.errs, fmt.Sprintf("%s: %d %v %v", tenant, st, m, err))
		return
	}
	f.got = append(f.got, m["id"].(string))
	if key == "" {
		return
	}
	// A repeat of the key is the same job, answered 200.
	st2, m2, err := f.post(tenant, key)
	if err != nil || st2 != http.StatusOK || m2["id"] != m["id"] {
		f.errs = append(f.errs, fmt.Sprintf("%s: the repeat of key %s: %d %v %v, want 200 and id %v", tenant, key, st2, m2, err, m["id"]))
		return
	}
	f.keyed++
}

func (f *feeder) probe(t *testing.T, tenant string) probe {
	t.Helper()
	sent := time.Now()
	st, m, err := f.post(tenant, "")
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("probe %s: %d %v %v", tenant, st, m, err)
	}
	return probe{id: m["id"].(string), tenant: tenant, sent: sent, answered: time.Now(), promised: time.Duration(m["expected_delay_ms"].(float64) * float64(time.Millisecond))}
}

func (f *feeder) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func (f *feeder) errors() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.errs)
}
