// Package metrics owns throttler's Prometheus metrics: their names, their
// labels, and the rule that keeps the series count bounded (a tenant label
// only for tenants named in config; every other tenant is "_other").
// Queue depth and expected delay are read from the store at scrape time,
// through the two reads of TenantReader. Recent (recent.go) keeps the last
// minutes of the same numbers, in memory and bounded, for the status page.
package metrics

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/throttler-dev/throttler/internal/queue"
)

// OtherTenants is the tenant label of every tenant not named in config: a
// million dynamic tenants must not make a million series.
const OtherTenants = "_other"

// Labels says how a tenant is labelled: its downstream, and its own name
// only if it is named in config.
type Labels func(tenant string) (downstream, tenantLabel string)

// Metrics are the service's metrics, on a registry it owns.
type Metrics struct {
	Registry *prometheus.Registry

	accepted, rejected, delivered, failed, retried *prometheus.CounterVec
	expired                                        *prometheus.CounterVec
	attempts, pushbacks, announced                 *prometheus.CounterVec
	policyChanges                                  *prometheus.CounterVec
	callbacks                                      *prometheus.CounterVec
	dispatchError, queueWait, latency              *prometheus.HistogramVec
	labels                                         Labels
	breakers                                       atomic.Pointer[func() map[string]bool]
	store                                          TenantReader
	perDownstream                                  *prometheus.Registry // attempts, pushbacks and announced holds alone, for Recent
	recent                                         atomic.Pointer[Recent]
	latencies                                      sync.Map // downstream -> *atomic.Int64: RecentLatency's average (ns)
}

// latencyWeight is the weight of each attempt's latency in RecentLatency's
// moving average: about the last 10 attempts.
const latencyWeight = 0.2

func (m *Metrics) noteLatency(ds string, d time.Duration) {
	v, ok := m.latencies.Load(ds)
	if !ok {
		v, _ = m.latencies.LoadOrStore(ds, new(atomic.Int64))
	}
	avg := v.(*atomic.Int64)
	for {
		old := avg.Load()
		next := int64(d)
		if old != 0 {
			next = old + int64(latencyWeight*float64(int64(d)-old))
		}
		if avg.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// RecentLatency is how long downstream took to answer lately, from write
// to answer, as this process's attempts saw it (a moving average); false
// if this process has sent it nothing (an API-only process).
func (m *Metrics) RecentLatency(downstream string) (time.Duration, bool) {
	v, ok := m.latencies.Load(downstream)
	if !ok {
		return 0, false
	}
	return time.Duration(v.(*atomic.Int64).Load()), true
}

// TenantReader is what the metrics read from the store, at scrape time:
// the busy tenants, and each named tenant (shown busy or not). Every
// queue.Store is one.
type TenantReader interface {
	Tenants(ctx context.Context, offset, limit int) ([]queue.TenantStatus, error)
	Tenant(ctx context.Context, tenant string) (queue.TenantStatus, error)
}

var _ TenantReader = queue.Store(nil)

// New registers every metric on a new registry. store, labels and named
// (the tenants named in config, always shown) feed the scrape-time gauges.
func New(store TenantReader, labels Labels, named func() []string) *Metrics {
	reg := prometheus.NewRegistry()
	tl := []string{"downstream", "tenant"}
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: name, Help: help}, append(append([]string(nil), tl...), extra...))
	}
	// Buckets from 100 µs to ~100 s: dispatch error lives at the low end,
	// queue wait anywhere.
	buckets := prometheus.ExponentialBuckets(0.0001, 2.5, 16)
	hist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "throttler", Name: name, Help: help, Buckets: buckets}, []string{"downstream"})
	}
	m := &Metrics{
		Registry:  reg,
		labels:    labels,
		store:     store,
		accepted:  counter("jobs_accepted_total", "Jobs admitted (202)."),
		rejected:  counter("jobs_rejected_total", "Jobs refused, by reason: 429 queue_full, rate_limited; 422 would_expire, cost_too_large.", "reason"),
		delivered: counter("jobs_delivered_total", "Jobs the downstream took (2xx)."),
		failed:    counter("jobs_failed_total", "Jobs that ended failed (permanent error or last attempt)."),
		retried:   counter("jobs_retried_total", "Attempts that will be tried again."),
		expired:   counter("jobs_expired_total", "Jobs whose deadline came before they could be sent (never sent)."),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "attempts_total",
			Help: "Requests to downstreams, by answer class (2xx, 3xx, 4xx, 429, 5xx, timeout, connection_error)."}, []string{"downstream", "class"}),
		announced: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "announced_holds_total",
			Help: "Answers whose rate limit fields said no room was left until a reset (rate_limit_headers): the tenant was held until then."}, []string{"downstream"}),
		policyChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "policy_changes_total",
			Help: "Tenants' policies set (set) or dropped (drop) through this process's API (PUT and DELETE /v1/tenants/{t}/policy)."}, []string{"change"}),
		pushbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "pushbacks_total",
			Help: "Answers that paused a tenant to wait as the downstream asked (429, or 503 with Retry-After)."}, []string{"downstream"}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "callbacks_total",
			Help: "Attempts at callbacks to producers (DESIGN.md 6b), by outcome: delivered (2xx), retry (will be tried again), failed (given up)."}, []string{"outcome"}),
		dispatchError: hist("dispatch_error_seconds", "When a request was written, minus the job's slot."),
		queueWait:     hist("queue_wait_seconds", "When a job's first attempt was written, minus when it was accepted."),
		latency:       hist("downstream_latency_seconds", "From writing a request to its answer (or error)."),
	}
	reg.MustRegister(m.accepted, m.rejected, m.delivered, m.failed, m.retried, m.expired, m.attempts, m.pushbacks, m.announced, m.policyChanges, m.callbacks, m.dispatchError, m.queueWait, m.latency,
		&queueCollector{store: store, labels: labels, named: named}, breakerCollector{m})
	if sp, ok := store.(queue.Space); ok {
		reg.MustRegister(spaceCollector{sp})
	}
	if o, ok := store.(queue.Ownership); ok {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "throttler", Name: "redis_partitions_held",
				Help: "Partitions this process holds (sends the tenants of). Summed over the live processes, it is throttler_redis_partitions when every tenant has a sender."},
				func() float64 { held, _ := o.Held(); return float64(held) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "throttler", Name: "redis_partitions",
				Help: "P, the partitions tenants hash onto (store.redis_partitions)."},
				func() float64 { _, partitions := o.Held(); return float64(partitions) }),
		)
	}
	m.perDownstream = prometheus.NewRegistry()
	m.perDownstream.MustRegister(m.attempts, m.pushbacks, m.announced)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Rare events start at 0 for the tenants named in config, so a rate()
	// or an alert on them has a series before the first one happens.
	for _, outcome := range []string{"delivered", "retry", "failed"} {
		m.callbacks.WithLabelValues(outcome)
	}
	m.policyChanges.WithLabelValues("set")
	m.policyChanges.WithLabelValues("drop")
	for _, name := range named() {
		ds, tl := labels(name)
		m.expired.WithLabelValues(ds, tl)
		m.failed.WithLabelValues(ds, tl)
	}
	return m
}

// WatchBreakers reads the circuit breakers' state (open or not, by
// downstream) at scrape time.
func (m *Metrics) WatchBreakers(open func() map[string]bool) { m.breakers.Store(&open) }

var breakerDesc = prometheus.NewDesc("throttler_breaker_open", "1 while a downstream's circuit breaker stops its sends.", []string{"downstream"}, nil)

type breakerCollector struct{ m *Metrics }

func (c breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- breakerDesc }

func (c breakerCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.breakers.Load()
	if f == nil {
		return
	}
	for ds, open := range (*f)() {
		v := 0.0
		if open {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, v, ds)
	}
}

// Admitted counts the answers of one enqueue call.
func (m *Metrics) Admitted(tenant string, out []queue.Admission) {
	ds, tl := m.labels(tenant)
	for _, a := range out {
		switch {
		case a.Rejected != nil:
			m.rejected.WithLabelValues(ds, tl, a.Rejected.Reason).Inc()
		case a.Impossible != nil:
			m.rejected.WithLabelValues(ds, tl, a.Impossible.Reason).Inc()
		case !a.Duplicate:
			m.accepted.WithLabelValues(ds, tl).Inc()
		}
	}
}

// Callback counts one attempt at a callback by its outcome: delivered,
// retry or failed.
func (m *Metrics) Callback(outcome string) { m.callbacks.WithLabelValues(outcome).Inc() }

// Attempt records one attempt and how it ended.
func (m *Metrics) Attempt(j queue.Job, o queue.Outcome, class string, latency time.Duration) {
	ds, tl := m.labels(j.Tenant)
	if class != "" {
		m.attempts.WithLabelValues(ds, class).Inc()
	}
	if pushedBack(o) {
		m.pushbacks.WithLabelValues(ds).Inc()
	}
	if !o.SentAt.IsZero() {
		m.dispatchError.WithLabelValues(ds).Observe(max(0, o.SentAt.Sub(j.DispatchAt)).Seconds())
		if j.Attempts == 1 {
			m.queueWait.WithLabelValues(ds).Observe(max(0, o.SentAt.Sub(j.EnqueuedAt)).Seconds())
		}
		m.latency.WithLabelValues(ds).Observe(latency.Seconds())
		if class != "" {
			m.noteLatency(ds, latency)
		}
	}
	switch o.Result {
	case queue.Succeeded:
		m.delivered.WithLabelValues(ds, tl).Inc()
	case queue.Failed:
		m.failed.WithLabelValues(ds, tl).Inc()
	case queue.Retry:
		m.retried.WithLabelValues(ds, tl).Inc()
	case queue.Expired:
		m.Expired(j)
	}
}

// Announced counts an answer of job's downstream whose rate limit fields
// held its tenant until a reset.
func (m *Metrics) Announced(j queue.Job) {
	ds, _ := m.labels(j.Tenant)
	m.announced.WithLabelValues(ds).Inc()
}

// PolicyChanged counts a tenant's policy set ("set") or dropped ("drop")
// through the API.
func (m *Metrics) PolicyChanged(change string) { m.policyChanges.WithLabelValues(change).Inc() }

// pushedBack reports an answer that asked the tenant to wait: the job is
// retried and its tenant paused (a failed probe of an open breaker pauses
// too, but its answer is a 5xx without Retry-After, or none).
func pushedBack(o queue.Outcome) bool {
	return o.Result == queue.Retry && !o.PauseUntil.IsZero() && (o.Status == 429 || o.Status == 503)
}

// Expired counts a job that expired before it could be sent.
func (m *Metrics) Expired(j queue.Job) {
	ds, tl := m.labels(j.Tenant)
	m.expired.WithLabelValues(ds, tl).Inc()
}

var (
	depthDesc = prometheus.NewDesc("throttler_queue_depth", "Jobs admitted and not yet handed to the downstream.", []string{"downstream", "tenant"}, nil)
	delayDesc = prometheus.NewDesc("throttler_expected_delay_seconds", "How long a job admitted now would wait (for _other: the longest).", []string{"downstream", "tenant"}, nil)
	inFlDesc  = prometheus.NewDesc("throttler_in_flight", "Jobs being sent.", []string{"downstream", "tenant"}, nil)
	pauseDesc = prometheus.NewDesc("throttler_tenants_paused", "Tenants paused now (by the downstream's Retry-After, the circuit breaker, or an operator).", []string{"downstream", "tenant"}, nil)
)

// queueCollector reads depth and delay from the store at scrape time
// rather than mirroring them in gauges.
type queueCollector struct {
	store  TenantReader
	labels Labels
	named  func() []string
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- depthDesc
	ch <- delayDesc
	ch <- inFlDesc
	ch <- pauseDesc
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tenants, err := c.store.Tenants(ctx, 0, 0)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(depthDesc, err)
		return
	}
	type key struct{ ds, tenant string }
	type agg struct {
		depth, inFlight, paused int
		delay                   time.Duration
	}
	sums := map[key]*agg{}
	// Named tenants are always shown, busy or not; the list below has only
	// the busy ones.
	busy := map[string]bool{}
	for _, t := range tenants {
		busy[t.Tenant] = true
	}
	for _, name := range c.named() {
		if busy[name] {
			continue
		}
		st, err := c.store.Tenant(ctx, name)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(depthDesc, err)
			return
		}
		tenants = append(tenants, st)
	}
	for _, t := range tenants {
		ds, tl := c.labels(t.Tenant)
		k := key{ds, tl}
		a := sums[k]
		if a == nil {
			a = &agg{}
			sums[k] = a
		}
		a.depth += t.QueueDepth
		a.inFlight += t.InFlight
		if t.Paused {
			a.paused++
		}
		a.delay = max(a.delay, t.ExpectedDelay)
	}
	for k, a := range sums {
		ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, float64(a.depth), k.ds, k.tenant)
		ch <- prometheus.MustNewConstMetric(inFlDesc, prometheus.GaugeValue, float64(a.inFlight), k.ds, k.tenant)
		ch <- prometheus.MustNewConstMetric(delayDesc, prometheus.GaugeValue, a.delay.Seconds(), k.ds, k.tenant)
		ch <- prometheus.MustNewConstMetric(pauseDesc, prometheus.GaugeValue, float64(a.paused), k.ds, k.tenant)
	}
}

var (
	storeFullDesc = prometheus.NewDesc("throttler_store_full", "1 while the store's disk has less room than store.reserve: new jobs are refused (507 store_full), deliveries go on.", nil, nil)
	storeFreeDesc = prometheus.NewDesc("throttler_store_free_bytes", "Room left to the store: its filesystem's free bytes and the pages its file has free for reuse.", nil, nil)
)

// spaceCollector reads a store's room at scrape time (queue.Space).
type spaceCollector struct{ store queue.Space }

func (c spaceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- storeFullDesc
	ch <- storeFreeDesc
}

func (c spaceCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.store.Room()
	full := 0.0
	if st.Full {
		full = 1
	}
	ch <- prometheus.MustNewConstMetric(storeFullDesc, prometheus.GaugeValue, full)
	ch <- prometheus.MustNewConstMetric(storeFreeDesc, prometheus.GaugeValue, float64(max(st.Free, 0)))
}
