package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The tests of partitioned ownership on Redis, with real processes: one
// API, workers each with a downstream URL of
// its own path on one recording downstream (so every arrival names the
// worker that sent it), P = 13 partitions with one tenant each at 10/s,
// kept busy by a feeder, and the leases read from Redis every few
// milliseconds while work flows.

const (
	ownerP     = 13
	ownerT     = 100 * time.Millisecond // each tenant at 10/s
	ownerLease = time.Second            // redis_lease in ownerConfig
)

// Three workers share the partitions, counts within one; a fourth gets its
// share within seconds; one stopped with SIGTERM hands over with no repeat;
// one killed with kill -9 is taken over after its lease, repeating only the
// jobs it was sending, with the same Idempotency-Key. Throughout, every
// arrival was sent by its partition's lease holder of the moment, every
// tenant is spaced at least T - 2 ms, and no tenant with jobs waiting goes
// longer than the lease plus a second without a send.
func TestRedisOwnershipBalancesAndHandsOver(t *testing.T) {
	testutil.SkipShort(t, "process test: throttler workers on one Redis, stopped and killed")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	r := startOwnerRig(t, 30*time.Millisecond)
	w1, w2, w3 := r.worker("w1"), r.worker("w2"), r.worker("w3")
	r.feed()

	began := time.Now()
	counts := r.awaitBalanced("three workers", 10*time.Second, w1, w2, w3)
	t.Logf("three workers balanced %v after they started: %v", time.Since(began).Round(time.Millisecond), counts)
	r.steady("three workers", w1, w2, w3)

	joined := time.Now()
	w4 := r.worker("w4")
	counts = r.awaitBalanced("a fourth worker", 10*time.Second, w1, w2, w3, w4)
	joinTook := time.Since(joined)
	t.Logf("a fourth worker had its share %v after it was started (%v after it listened): %v",
		joinTook.Round(time.Millisecond), time.Since(w4.listening).Round(time.Millisecond), counts)
	if joinTook > 5*time.Second {
		t.Errorf("a fourth worker had its share %v after it was started, want within a few seconds", joinTook)
	}
	r.steady("four workers", w1, w2, w3, w4)

	termed := time.Now()
	w2.sigterm(t)
	counts = r.awaitBalanced("after SIGTERM", 10*time.Second, w1, w3, w4)
	termTook := time.Since(termed)
	t.Logf("SIGTERM: exited %v after the signal, its partitions owned again %v after it: %v",
		w2.exited.Sub(termed).Round(time.Millisecond), termTook.Round(time.Millisecond), counts)
	r.steady("after SIGTERM", w1, w3, w4)

	killedHeld := r.heldBy(w3)
	killed := time.Now()
	w3.kill9(t)
	counts = r.awaitBalanced("after kill -9", 10*time.Second, w1, w4)
	t.Logf("kill -9: partitions owned again %v after it: %v", time.Since(killed).Round(time.Millisecond), counts)
	r.steady("after kill -9", w1, w4)

	r.finish()
	all := r.arrivals()

	// The partitions: one owner each, the lease holder.
	r.checkLeases()
	r.checkSenders(all, nil)
	if f := r.longestFree(joined, joined.Add(joinTook)); f > ownerLease {
		t.Errorf("a partition was free for %v while a fourth worker joined: a clean handover starts the next owner at once", f)
	}
	if f := r.longestFree(termed, termed.Add(termTook)); f > ownerLease {
		t.Errorf("a partition was free for %v after SIGTERM: a clean handover starts the next owner at once", f)
	}
	t.Logf("longest a partition was free: while w4 joined %v, after SIGTERM %v",
		r.longestFree(joined, joined.Add(joinTook)).Round(time.Millisecond), r.longestFree(termed, termed.Add(termTook)).Round(time.Millisecond))
	var takeovers []time.Duration
	for _, p := range killedHeld {
		at, ok := r.firstOwnedOtherThan(p, w3, killed)
		if !ok {
			t.Fatalf("partition %d of the killed worker never taken over", p)
		}
		takeovers = append(takeovers, at.Sub(killed))
	}
	slices.Sort(takeovers)
	t.Logf("kill -9: its %d partitions taken over %v to %v after the kill (lease %v)", len(killedHeld),
		takeovers[0].Round(time.Millisecond), takeovers[len(takeovers)-1].Round(time.Millisecond), ownerLease)
	if last := takeovers[len(takeovers)-1]; last > ownerLease+2*time.Second {
		t.Errorf("the killed worker's partitions were taken over %v after the kill, want within the lease + 2 s", last)
	}
	for _, s := range r.leases.all() {
		for _, l := range s.leases {
			if w := r.byID(l.Worker); w == w3 && s.at.After(killed.Add(ownerLease+50*time.Millisecond)) {
				t.Fatalf("partition %d still leased to the killed worker %v after the kill (lease %v)", l.Partition, s.at.Sub(killed), ownerLease)
			}
		}
	}

	// The jobs: each arrived once, but those the killed worker was sending.
	// Sending until it was dead, not until the test began to kill it: a
	// request it wrote in between arrives after killed (a quiet CI run saw
	// one 1 ms after).
	jobs, repeats := eachRepeat(all, func(f, a sentBy) {
		switch {
		case !f.At.Before(w3.exited) || f.worker != w3 || a.At.Before(killed):
			t.Fatalf("job %s of %s arrived at %v from %s and again at %v from %s: only a job the killed worker was sending (at %v) may repeat",
				a.Key, a.Tenant, r.rel(f.At), f.worker.name, r.rel(a.At), a.worker.name, r.rel(killed))
		case killed.Sub(f.At) > time.Second:
			t.Fatalf("job %s repeated after the kill, first sent %v before it: not a send under way at the kill", a.Key, killed.Sub(f.At))
		}
	})
	t.Logf("%d arrivals of %d jobs; %d repeats, all of jobs the killed worker was sending, with the same Idempotency-Key; none after SIGTERM or the join",
		len(all), jobs, repeats)

	r.checkTiming(all, nil)
}

// A worker frozen (SIGSTOP) past its lease loses its partitions to the
// other; continued (SIGCONT), its writes are refused by the epoch (the
// fence), and it sends nothing more in the tenure it lost: only a request
// already past its last check when it froze may go out when it runs again
// (the bound that remains, measured here), and its job goes again from the
// new owner with the same Idempotency-Key.
func TestRedisStaleOwnerIsFenced(t *testing.T) {
	testutil.SkipShort(t, "process test: a throttler worker frozen and continued")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	// Answers take 250 ms: the frozen worker has requests in flight, whose
	// outcomes it tries to record when it runs again.
	r := startOwnerRig(t, 250*time.Millisecond)
	w1, w2 := r.worker("w1"), r.worker("w2")
	r.feed()
	r.awaitBalanced("two workers", 10*time.Second, w1, w2)
	r.steady("two workers", w1, w2)

	held := r.heldBy(w1)
	tenants := map[string]bool{}
	for _, p := range held {
		tenants[r.tenants[p]] = true
	}
	stopped := time.Now()
	if err := w1.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	counts := r.awaitBalanced("w2 alone, w1 frozen", 10*time.Second, w2)
	took := time.Since(stopped)
	// The new owner sends the frozen worker's tenants: three arrivals each.
	since := time.Now()
	testutil.WaitFor(t, 10*time.Second, "w2 sends the frozen worker's tenants", func() bool {
		n := map[string]int{}
		for _, a := range r.arrivals() {
			if a.worker == w2 && a.At.After(since) {
				n[a.Tenant]++
			}
		}
		for tenant := range tenants {
			if n[tenant] < 3 {
				return false
			}
		}
		return true
	})
	continued := time.Now()
	if err := w1.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("w1 frozen %v; its %d partitions owned by w2 %v after the freeze: %v", continued.Sub(stopped).Round(time.Millisecond),
		len(held), took.Round(time.Millisecond), counts)

	// It learns it lost every partition of the tenure it froze in, and its
	// writes are refused.
	testutil.WaitFor(t, 10*time.Second, "w1 learns it lost its partitions", func() bool {
		lost := map[int]bool{}
		for _, e := range w1.logsSince(continued, "lost a partition") {
			lost[int(e.num("partition"))] = true
		}
		for _, p := range held {
			if !lost[p] {
				return false
			}
		}
		return true
	})
	var learned time.Time
	for _, e := range w1.logsSince(continued, "lost a partition") {
		if e.at.After(learned) {
			learned = e.at
		}
	}
	testutil.WaitFor(t, 10*time.Second, "w1's writes refused by the fence", func() bool {
		return len(w1.fenced(continued)) > 0
	})
	counts = r.awaitBalanced("two workers again", 10*time.Second, w1, w2)
	r.steady("two workers again", w1, w2)
	r.finish()
	all := r.arrivals()

	// What the frozen worker sent once it ran again, before it took any
	// partition anew: the requests past their check when it froze.
	again := time.Time{}
	for _, e := range w1.logsSince(continued, "acquired a partition") {
		if again.IsZero() || e.at.Before(again) {
			again = e.at
		}
	}
	stale := map[int]bool{}
	var late []sentBy
	for i, a := range all {
		if a.worker != w1 || a.At.Before(stopped) || (!again.IsZero() && !a.At.Before(again)) {
			continue
		}
		if a.At.Before(continued) {
			if a.At.Sub(stopped) > 20*time.Millisecond {
				t.Fatalf("w1 sent %s at %v, frozen since %v", a.Key, r.rel(a.At), r.rel(stopped))
			}
			continue // written as the signal came
		}
		stale[i] = true
		late = append(late, a)
		if !tenants[a.Tenant] {
			t.Fatalf("w1 sent %s of %s after SIGCONT, a tenant it did not own when it froze", a.Key, a.Tenant)
		}
		if d := a.At.Sub(continued); d > ownerLease {
			t.Fatalf("w1 sent %s of %s %v after SIGCONT, in a tenure it had lost: only a request already past its check may go, at once", a.Key, a.Tenant, d)
		}
	}
	if len(late) > len(tenants) {
		t.Fatalf("w1 sent %d requests after SIGCONT: at most one per tenant (a request past its check at the freeze)", len(late))
	}
	for _, a := range late {
		near := time.Duration(1 << 62)
		for _, b := range all {
			if b.Tenant == a.Tenant && b.Key != a.Key {
				near = min(near, absDur(b.At.Sub(a.At)))
			}
		}
		t.Logf("the bound that remains: w1 sent %s of %s %v after SIGCONT (past its check when it froze); the tenant's nearest other arrival %v from it",
			a.Key, a.Tenant, a.At.Sub(continued).Round(time.Microsecond), near.Round(time.Microsecond))
	}
	fenced := w1.fenced(continued)
	// Its writes: the outcomes of the requests in flight at the freeze
	// (their answers came while it was stopped) and the jobs it had
	// claimed and not sent, given back.
	t.Logf("after SIGCONT w1 learned it lost its %d partitions within %v; %d of its writes refused by the fence; %d requests past their check at the freeze went out (the bound: one per tenant, %d tenants)",
		len(held), learned.Sub(continued).Round(time.Millisecond), len(fenced), len(late), len(tenants))
	kinds := map[string]int{}
	for _, e := range fenced {
		kinds[e.msg()]++
	}
	for msg, n := range kinds {
		t.Logf("  %d x %q", n, msg)
	}
	if len(fenced) > 0 {
		t.Logf("  for one: %v", fenced[0].logLine["err"])
	}

	// Repeats: only of jobs the frozen worker was sending.
	jobs, repeats := eachRepeat(all, func(f, a sentBy) {
		if f.worker != w1 || f.At.After(continued) || stopped.Sub(f.At) > time.Second {
			t.Fatalf("job %s arrived at %v from %s and again at %v from %s: only a job the frozen worker was sending may repeat",
				a.Key, r.rel(f.At), f.worker.name, r.rel(a.At), a.worker.name)
		}
	})
	t.Logf("%d arrivals of %d jobs; %d repeats, all of jobs w1 was sending when it froze, with the same Idempotency-Key", len(all), jobs, repeats)

	r.checkLeases()
	r.checkSenders(all, stale)
	r.checkTiming(all, stale)
}

// eachRepeat calls f with each arrival of a job that arrived before, and
// the job's first arrival; it returns how many jobs arrived and how many
// arrivals were repeats.
func eachRepeat(all []sentBy, f func(first, again sentBy)) (jobs, repeats int) {
	first := map[string]sentBy{}
	for _, a := range all {
		if f0, seen := first[a.Key]; seen {
			repeats++
			f(f0, a)
		} else {
			first[a.Key] = a
		}
	}
	return len(first), repeats
}

// ownerRig is one test's Redis, API, workers, downstream, feeder and
// lease watcher.
type ownerRig struct {
	t       *testing.T
	srv     *redistest.Server
	rdb     *goredis.Client
	ds      *downstreamtest.Server
	api     *process
	tenants []string // the tenant of each partition
	began   time.Time
	leases  *leaseWatch
	fd      *jobFeeder

	mu      sync.Mutex
	sent    []sentBy
	workers []*ownerWorker
}

// sentBy is one arrival at the downstream and the worker that sent it.
type sentBy struct {
	downstreamtest.Arrival
	worker *ownerWorker
}

// ownerWorker is one `throttler serve --role worker` with its own downstream
// path.
type ownerWorker struct {
	name      string
	p         *process
	listening time.Time
	exited    time.Time // zero while it runs
	killed    bool      // by kill -9: its leases outlive it by a lease
}

// startOwnerRig starts Redis, the downstream (answering after answer) and
// the API process, and finds a tenant for each partition.
func startOwnerRig(t *testing.T, answer time.Duration) *ownerRig {
	r := &ownerRig{t: t, srv: redistest.Start(t, false), ds: downstreamtest.New(t), began: time.Now()}
	r.rdb = goredis.NewClient(&goredis.Options{Addr: r.srv.Addr})
	t.Cleanup(func() { r.rdb.Close() })
	r.tenants = tenantPerPartition(ownerP)
	r.ds.Answer(func(w http.ResponseWriter, req *http.Request) {
		a := sentBy{Arrival: downstreamtest.Arrival{At: downstreamtest.ArrivalTime(req), Key: req.Header.Get("Idempotency-Key"),
			Tenant: req.Header.Get("X-Throttler-Tenant"), Attempt: req.Header.Get("X-Throttler-Attempt")}}
		r.mu.Lock()
		for _, wk := range r.workers {
			if req.URL.Path == "/"+wk.name {
				a.worker = wk
			}
		}
		r.sent = append(r.sent, a)
		r.mu.Unlock()
		select {
		case <-time.After(answer):
		case <-req.Context().Done():
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	r.api = startProcess(t, r.config("api"), "--role", "api")
	r.leases = watchLeases(t, r.rdb)
	return r
}

// config writes a config whose downstream is the recording one at /path.
func (r *ownerRig) config(path string) string {
	p := filepath.Join(r.t.TempDir(), "config.toml")
	full := fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
shutdown_timeout = "5s"
[store]
backend = "redis"
redis_url = %q
redis_partitions = %d
redis_lease = %q
[downstreams.test]
url = %q
timeout = "5s"
[tenant_defaults]
rate = "10/s"
capacity = 200
`, r.srv.URL(), ownerP, ownerLease.String(), r.ds.URL+"/"+path)
	if err := os.WriteFile(p, []byte(full), 0o600); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// worker starts a worker sending to /name.
func (r *ownerRig) worker(name string) *ownerWorker {
	w := &ownerWorker{name: name}
	r.mu.Lock()
	r.workers = append(r.workers, w)
	r.mu.Unlock()
	w.p = startProcess(r.t, r.config(name), "--role", "worker")
	w.listening = time.Now()
	return w
}

// byID is the worker whose owner id names its process (ids are
// host-pid-random).
func (r *ownerRig) byID(id string) *ownerWorker {
	parts := strings.Split(id, "-")
	if len(parts) < 3 {
		return nil
	}
	pid, err := strconv.Atoi(parts[len(parts)-2])
	if err != nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		if w.p.cmd.Process.Pid == pid {
			return w
		}
	}
	return nil
}

func (r *ownerRig) arrivals() []sentBy {
	r.mu.Lock()
	out := slices.Clone(r.sent)
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b sentBy) int { return a.At.Compare(b.At) })
	return out
}

// rel is at as time since the rig started, for messages.
func (r *ownerRig) rel(at time.Time) time.Duration { return at.Sub(r.began).Round(time.Millisecond) }

// counts is how many partitions each worker holds in leases, and whether
// every partition is held by one of live.
func (r *ownerRig) counts(leases []owner.Lease, live ...*ownerWorker) (map[string]int, bool) {
	n := map[string]int{}
	all := true
	for _, l := range leases {
		w := r.byID(l.Worker)
		if w == nil || !slices.Contains(live, w) {
			all = false
			continue
		}
		n[w.name]++
	}
	return n, all
}

// awaitBalanced waits until the live workers hold every partition, each
// its fair share (package owner: P/N each, the remainder one each to the
// first ids), and returns the counts.
func (r *ownerRig) awaitBalanced(what string, timeout time.Duration, live ...*ownerWorker) map[string]int {
	r.t.Helper()
	ids := make([]string, len(live))
	for i, w := range live {
		ids[i] = w.id(r.t)
	}
	slices.Sort(ids)
	share := map[string]int{}
	for i, id := range ids {
		share[r.byID(id).name] = ownerP / len(ids)
		if i < ownerP%len(ids) {
			share[r.byID(id).name]++
		}
	}
	var n map[string]int
	testutil.WaitFor(r.t, timeout, fmt.Sprintf("%s: every partition owned by the live workers, shares %v", what, share), func() bool {
		leases, err := owner.ReadLeases(context.Background(), r.rdb, ownerP)
		if err != nil {
			return false
		}
		var all bool
		n, all = r.counts(leases, live...)
		return all && maps.Equal(n, share)
	})
	return n
}

// steady lets work flow with the live workers as they are (five arrivals
// of every tenant), and checks that meanwhile every lease read showed every
// partition held by one of them, counts within one.
func (r *ownerRig) steady(what string, live ...*ownerWorker) {
	r.t.Helper()
	from := time.Now()
	base := map[string]int{}
	for _, a := range r.arrivals() {
		base[a.Tenant]++
	}
	testutil.WaitFor(r.t, 10*time.Second, what+": five arrivals of every tenant", func() bool {
		n := map[string]int{}
		for _, a := range r.arrivals() {
			n[a.Tenant]++
		}
		for _, tenant := range r.tenants {
			if n[tenant]-base[tenant] < 5 {
				return false
			}
		}
		return true
	})
	to := time.Now()
	for _, w := range live {
		select {
		case <-w.p.done:
			r.t.Fatalf("%s: %s exited by itself:\n%s", what, w.name, w.p.logs())
		default:
		}
	}
	reads := 0
	for _, s := range r.leases.all() {
		if s.at.Before(from) || s.at.After(to) {
			continue
		}
		reads++
		n, all := r.counts(s.leases, live...)
		lo, hi := ownerP, 0
		for _, c := range n {
			lo, hi = min(lo, c), max(hi, c)
		}
		if !all || len(n) != len(live) || hi-lo > 1 {
			var story strings.Builder
			for _, l := range s.leases {
				if w := r.byID(l.Worker); w == nil || !slices.Contains(live, w) {
					story.WriteString("\n" + r.holders(l.Partition))
				}
			}
			r.t.Fatalf("%s (from %v to %v): the leases at %v: %v (counts %v), want every partition held by one of the live workers, counts within one%s",
				what, r.rel(from), r.rel(to), r.rel(s.at), s.leases, n, story.String())
		}
	}
	r.t.Logf("%s: %v of work, %d lease reads, every partition held by one live worker, counts within one", what, to.Sub(from).Round(time.Millisecond), reads)
}

// heldBy lists the partitions w holds now.
func (r *ownerRig) heldBy(w *ownerWorker) []int {
	leases, err := owner.ReadLeases(context.Background(), r.rdb, ownerP)
	if err != nil {
		r.t.Fatal(err)
	}
	var ps []int
	for _, l := range leases {
		if r.byID(l.Worker) == w {
			ps = append(ps, l.Partition)
		}
	}
	return ps
}

// firstOwnedOtherThan is the first lease read after since that shows p
// held by a worker other than w.
func (r *ownerRig) firstOwnedOtherThan(p int, w *ownerWorker, since time.Time) (time.Time, bool) {
	for _, s := range r.leases.all() {
		if l := s.leases[p]; s.at.After(since) && l.Worker != "" && r.byID(l.Worker) != w {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// longestFree is the longest any partition was seen free (no lease)
// between from and to.
func (r *ownerRig) longestFree(from, to time.Time) time.Duration {
	var longest time.Duration
	freeSince := map[int]time.Time{}
	for _, s := range r.leases.all() {
		if s.at.Before(from) || s.at.After(to) {
			continue
		}
		for _, l := range s.leases {
			if l.Worker == "" {
				if _, ok := freeSince[l.Partition]; !ok {
					freeSince[l.Partition] = s.at
				}
				longest = max(longest, s.at.Sub(freeSince[l.Partition]))
			} else {
				delete(freeSince, l.Partition)
			}
		}
	}
	return longest
}

// checkLeases checks every lease read: each held lease names one of the
// test's workers, never one after it exited, and a partition's epoch
// never goes back and grows whenever its holder changes.
func (r *ownerRig) checkLeases() {
	r.t.Helper()
	type last struct {
		w     *ownerWorker
		epoch int64
	}
	seen := map[int]last{}
	all := r.leases.all()
	for _, s := range all {
		for _, l := range s.leases {
			if l.Worker == "" {
				continue
			}
			w := r.byID(l.Worker)
			switch {
			case w == nil:
				r.t.Fatalf("partition %d leased to %q, not a worker of the test", l.Partition, l.Worker)
			case !w.killed && !w.exited.IsZero() && s.at.After(w.exited):
				r.t.Fatalf("partition %d leased to %s at %v, after it exited at %v", l.Partition, w.name, r.rel(s.at), r.rel(w.exited))
			}
			prev, ok := seen[l.Partition]
			if ok && (l.Epoch < prev.epoch || (prev.w != w && l.Epoch == prev.epoch)) {
				r.t.Fatalf("partition %d: epoch %d of %s after epoch %d of %s", l.Partition, l.Epoch, w.name, prev.epoch, prev.w.name)
			}
			seen[l.Partition] = last{w, l.Epoch}
		}
	}
	r.t.Logf("%d lease reads, every %v or so: one holder per partition, epochs only grow", len(all), r.leases.every)
}

// checkSenders checks that every arrival (but those of skip) was sent by
// the holder of its tenant's partition in a lease read just before or
// after it (two reads each side).
func (r *ownerRig) checkSenders(all []sentBy, skip map[int]bool) {
	r.t.Helper()
	samples := r.leases.all()
	for i, a := range all {
		if skip[i] {
			continue
		}
		if a.worker == nil {
			r.t.Fatalf("arrival %s at %v from no worker of the test", a.Key, r.rel(a.At))
		}
		p := owner.PartitionOf(a.Tenant, ownerP)
		j, _ := slices.BinarySearchFunc(samples, a.At, func(s leaseSample, at time.Time) int { return s.at.Compare(at) })
		ok := false
		for k := max(j-2, 0); k < min(j+2, len(samples)); k++ {
			if r.byID(samples[k].leases[p].Worker) == a.worker {
				ok = true
			}
		}
		if !ok {
			r.t.Fatalf("%s sent %s of %s (partition %d) at %v, and no lease read about then shows it the partition's holder", a.worker.name, a.Key, a.Tenant, p, r.rel(a.At))
		}
	}
	r.t.Logf("every one of %d arrivals was sent by the holder of its partition's lease at the time", len(all)-len(skip))
}

// checkTiming checks, for every tenant (leaving out the arrivals of skip):
// the window rule at T (so no two closer than T - 2 ms), and no gap longer
// than the lease + 1 s while it had jobs waiting.
func (r *ownerRig) checkTiming(all []sentBy, skip map[int]bool) {
	r.t.Helper()
	accepted := r.fd.acceptedTimes()
	minGap, maxGap, minHandover, handovers := time.Duration(1<<62), time.Duration(0), time.Duration(1<<62), 0
	for _, tenant := range r.tenants {
		var as []downstreamtest.Arrival
		delivered := map[string]bool{}
		var waitingGap time.Duration
		var prev sentBy
		for i, a := range all {
			if a.Tenant != tenant || skip[i] {
				continue
			}
			if n := len(as); n > 0 {
				gap := a.At.Sub(as[n-1].At)
				minGap = min(minGap, gap)
				if prev.worker != a.worker {
					minHandover = min(minHandover, gap)
					handovers++
				}
				if acceptedBefore(accepted[tenant], as[n-1].At) > len(delivered) {
					waitingGap = max(waitingGap, gap)
				}
			}
			as = append(as, a.Arrival)
			prev = a
			delivered[a.Key] = true
		}
		maxGap = max(maxGap, waitingGap)
		if v := downstreamtest.WindowViolation(as, ownerT, 1); v != "" {
			r.t.Fatalf("%s\n%s", v, r.tenantStory(all, tenant, skip))
		}
		if waitingGap > ownerLease+time.Second {
			r.t.Errorf("%s: %v without a send while it had jobs waiting, want at most the lease + 1 s", tenant, waitingGap)
		}
	}
	r.t.Logf("every tenant: the closest two arrivals %v apart (T = %v); of the %d pairs from two workers (a handover) the closest %v; the longest gap with jobs waiting %v (lease %v)",
		minGap.Round(10*time.Microsecond), ownerT, handovers, minHandover.Round(10*time.Microsecond), maxGap.Round(time.Millisecond), ownerLease)
}

// tenantStory says, for a test that failed on tenant's timing, who sent
// each of its arrivals and who held its partition when.
func (r *ownerRig) tenantStory(all []sentBy, tenant string, skip map[int]bool) string {
	var b strings.Builder
	b.WriteString("its arrivals, by sender:")
	for i, a := range all {
		if a.Tenant == tenant && !skip[i] {
			name := "no worker"
			if a.worker != nil {
				name = a.worker.name
			}
			fmt.Fprintf(&b, "\n  +%-12v %s %s", a.At.Sub(r.began).Round(10*time.Microsecond), a.Key, name)
		}
	}
	b.WriteString("\nits " + r.holders(owner.PartitionOf(tenant, ownerP)))
	return b.String()
}

// holders says who held partition p when, from the lease reads: for a
// test that failed on it.
func (r *ownerRig) holders(p int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "partition %d's holders (lease reads):", p)
	var was owner.Lease
	for _, s := range r.leases.all() {
		l := s.leases[p]
		if l.Worker != was.Worker || l.Epoch != was.Epoch {
			name := "nobody"
			if w := r.byID(l.Worker); w != nil {
				name = w.name
			}
			fmt.Fprintf(&b, "\n  +%-12v %s epoch %d", s.at.Sub(r.began).Round(10*time.Microsecond), name, l.Epoch)
			was = l
		}
	}
	return b.String()
}

// acceptedBefore counts the jobs accepted (answered) before at.
func acceptedBefore(accepted []time.Time, at time.Time) int {
	n := 0
	for _, t := range accepted {
		if t.Before(at) {
			n++
		}
	}
	return n
}

// feed starts the feeder, 20 jobs per tenant at once and 10 a second
// after, until finish.
func (r *ownerRig) feed() {
	r.fd = startJobFeeder(r.api.base, r.tenants, 20, 10)
	r.t.Cleanup(r.fd.stop)
}

// finish stops the feeder and waits until every job accepted has arrived;
// a repeat would come soon after.
func (r *ownerRig) finish() {
	r.t.Helper()
	r.fd.stop()
	if err := r.fd.err; err != nil {
		r.t.Fatal(err)
	}
	ids := r.fd.ids()
	missing := func() []string {
		seen := map[string]bool{}
		for _, a := range r.arrivals() {
			seen[a.Key] = true
		}
		var out []string
		for _, id := range ids {
			if !seen[id] {
				out = append(out, id)
			}
		}
		return out
	}
	for deadline := time.Now().Add(30 * time.Second); len(missing()) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			// Say where the jobs are, for whoever looks into it.
			left := missing()
			var b strings.Builder
			for _, id := range left[:min(len(left), 10)] {
				_, _, job := call(r.t, "GET", r.api.base+"/v1/jobs/"+id, "")
				fmt.Fprintf(&b, "\n  %s: %v", id, job)
			}
			r.t.Fatalf("every accepted job delivered: not within 30s; %d of %d not, the first:%s", len(left), len(ids), b.String())
		}
	}
	nothingMoreWithin(500 * time.Millisecond)
	accepted := map[string]bool{}
	for _, id := range ids {
		accepted[id] = true
	}
	for _, a := range r.arrivals() {
		if !accepted[a.Key] {
			r.t.Fatalf("delivered Idempotency-Key %q that was never accepted", a.Key)
		}
	}
	r.leases.stop()
	if err := r.leases.err; err != nil {
		r.t.Fatalf("reading the leases: %v", err)
	}
	for _, tenant := range r.tenants {
		_, _, ten := call(r.t, "GET", r.api.base+"/v1/tenants/"+tenant, "")
		if ten["queue_depth"] != 0.0 || ten["in_flight"] != 0.0 {
			r.t.Fatalf("%s after every job arrived: %v", tenant, ten)
		}
	}
}

// id is w's owner id, from the line it logs when it joins.
func (w *ownerWorker) id(t *testing.T) string {
	t.Helper()
	var id string
	testutil.WaitFor(t, 5*time.Second, w.name+" joins the partition owners", func() bool {
		for _, e := range w.logsSince(time.Time{}, "joined the partition owners") {
			id, _ = e.logLine["worker"].(string)
		}
		return id != ""
	})
	return id
}

// sigterm stops w cleanly and waits for its exit (status 0).
func (w *ownerWorker) sigterm(t *testing.T) {
	t.Helper()
	if err := w.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-w.p.done
	if err := w.p.cmd.Wait(); err != nil {
		t.Fatalf("%s exit after SIGTERM: %v\n%s", w.name, err, w.p.logs())
	}
	w.exited = time.Now()
}

// kill9 kills w as a crash would.
func (w *ownerWorker) kill9(t *testing.T) {
	t.Helper()
	w.p.kill9(t)
	w.killed, w.exited = true, time.Now()
}

// logLine is one line of a process's JSON log.
type logLine map[string]any

func (e logLine) msg() string { s, _ := e["msg"].(string); return s }

func (e logLine) num(key string) float64 { f, _ := e[key].(float64); return f }

// logsSince is w's log lines from since on whose message begins with msg.
func (w *ownerWorker) logsSince(since time.Time, msg string) []timedLogLine {
	var out []timedLogLine
	for _, line := range strings.Split(w.p.logs(), "\n") {
		var e logLine
		if json.Unmarshal([]byte(line), &e) != nil || !strings.HasPrefix(e.msg(), msg) {
			continue
		}
		s, _ := e["time"].(string)
		at, err := time.Parse(time.RFC3339Nano, s)
		if err == nil && !at.Before(since) {
			out = append(out, timedLogLine{logLine: e, at: at})
		}
	}
	return out
}

type timedLogLine struct {
	logLine
	at time.Time
}

// fenced is w's log lines since since of writes the fence refused.
func (w *ownerWorker) fenced(since time.Time) []timedLogLine {
	var out []timedLogLine
	for _, e := range w.logsSince(since, "") {
		if err, _ := e.logLine["err"].(string); strings.Contains(err, "(stale owner)") {
			out = append(out, e)
		}
	}
	return out
}

// tenantPerPartition names one tenant for each of p partitions.
func tenantPerPartition(p int) []string {
	out := make([]string, p)
	left := p
	for i := 0; left > 0; i++ {
		name := "tenant-" + strconv.Itoa(i)
		if q := owner.PartitionOf(name, p); out[q] == "" {
			out[q] = name
			left--
		}
	}
	return out
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// tickLoop calls step at once and then every tick, in a goroutine, until
// stop is called or step returns false.
type tickLoop struct {
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func startTickLoop(every time.Duration, step func() bool) *tickLoop {
	l := &tickLoop{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for step() {
			select {
			case <-l.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return l
}

func (l *tickLoop) stop() {
	l.once.Do(func() { close(l.quit) })
	<-l.done
}

// leaseWatch reads every partition's lease over and over while a test
// runs.
type leaseWatch struct {
	*tickLoop
	every time.Duration
	mu    sync.Mutex
	reads []leaseSample
	err   error
}

// leaseSample is one read of the leases, at the middle of its round trip.
type leaseSample struct {
	at     time.Time
	leases []owner.Lease
}

func watchLeases(t *testing.T, rdb *goredis.Client) *leaseWatch {
	w := &leaseWatch{every: 5 * time.Millisecond}
	w.tickLoop = startTickLoop(w.every, func() bool {
		sent := time.Now()
		leases, err := owner.ReadLeases(context.Background(), rdb, ownerP)
		got := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		if err != nil && w.err == nil {
			w.err = err
		}
		if err == nil {
			w.reads = append(w.reads, leaseSample{at: sent.Add(got.Sub(sent) / 2), leases: leases})
		}
		return true
	})
	t.Cleanup(w.stop)
	return w
}

func (w *leaseWatch) all() []leaseSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.reads)
}

// jobFeeder enqueues jobs for each tenant through the API: first jobs at
// once, then perSecond a second each, in batches, until stopped.
type jobFeeder struct {
	*tickLoop
	mu       sync.Mutex
	accepted map[string][]time.Time // per tenant, when each job's 202 came back
	all      []string
	err      error
}

func startJobFeeder(base string, tenants []string, first, perSecond int) *jobFeeder {
	f := &jobFeeder{accepted: map[string][]time.Time{}}
	began := time.Now()
	sent := map[string]int{}
	f.tickLoop = startTickLoop(200*time.Millisecond, func() bool {
		want := first + int(time.Since(began).Seconds()*float64(perSecond))
		for _, tenant := range tenants {
			if n := want - sent[tenant]; n > 0 {
				ids, err := enqueueBatch(base, tenant, n)
				now := time.Now()
				f.mu.Lock()
				if err != nil && f.err == nil {
					f.err = err
				}
				for range ids {
					f.accepted[tenant] = append(f.accepted[tenant], now)
				}
				f.all = append(f.all, ids...)
				f.mu.Unlock()
				if err != nil {
					return false
				}
				sent[tenant] += n
			}
		}
		return true
	})
	return f
}

func (f *jobFeeder) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.all)
}

func (f *jobFeeder) acceptedTimes() map[string][]time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]time.Time{}
	for k, v := range f.accepted {
		out[k] = slices.Clone(v)
	}
	return out
}

// enqueueBatch enqueues n jobs for tenant in one batch, each of which must
// be accepted, and returns their ids.
func enqueueBatch(base, tenant string, n int) ([]string, error) {
	var b bytes.Buffer
	b.WriteString(`{"jobs":[`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"payload":{"n":%d}}`, i)
	}
	b.WriteString("]}")
	resp, err := httpClient.Post(base+"/v1/tenants/"+tenant+"/jobs:batch", "application/json", &b)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("batch for %s: %d %v", tenant, resp.StatusCode, err)
	}
	var ids []string
	for _, res := range out.Results {
		id, _ := res["id"].(string)
		if res["status"] != float64(http.StatusAccepted) || id == "" {
			return ids, fmt.Errorf("batch for %s: a job answered %v", tenant, res)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
