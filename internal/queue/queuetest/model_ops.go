package queuetest

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// OpKind is what one step of a model run does.
type OpKind int

const (
	// OpEnqueue enqueues Jobs for Tenant in one call (a batch if more than one).
	OpEnqueue OpKind = iota + 1
	// OpCancel cancels a job chosen by Pick (see Op.Pick).
	OpCancel
	// OpRetry retries (Store.Retry) a job chosen by Pick.
	OpRetry
	// OpHold and OpResume are an operator's pause and resume of Tenant.
	OpHold
	OpResume
	// OpAdvance moves the clock D ahead, stopping at every moment the
	// store or the model waits for.
	OpAdvance
	// OpDownstream sets how the downstream answers every write from now on.
	OpDownstream
	// OpReload changes Tenant's policy to Policy (the PolicyFunc reads it).
	OpReload
	// OpCrash kills the process now (what the store has committed is all
	// that is left) and restarts it D later.
	OpCrash
	// OpCrashOnWrite kills the process at the next write, after the
	// request is written and before its outcome is recorded; it restarts
	// at once.
	OpCrashOnWrite
	// OpStale stops the process (SIGSTOP) past its lease; another takes
	// over D later, and then the stopped one wakes (ModelDriver.Freeze).
	OpStale
)

// Op is one step of a model run. Ops are plain data: a failing run prints
// its (shrunk) list as Go code that a regression test replays.
type Op struct {
	Kind   OpKind
	Tenant string
	Jobs   []JobSpec
	// Pick chooses the job of OpCancel and OpRetry: an even Pick counts
	// among the jobs the op applies to (waiting ones for a cancel, failed
	// ones for a retry), an odd one among all jobs admitted so far; Pick/2
	// modulo their number. So a pick stays valid when a shrink drops steps.
	Pick   int
	D      time.Duration
	Answer Answer
	Policy PolicySpec
}

// JobSpec is one job of an OpEnqueue.
type JobSpec struct {
	Cost int    // 0 or 1: one slot
	Key  string // idempotency key ("" none)
	// Deadline is relative to the time of the enqueue (0: none; negative:
	// already past).
	Deadline time.Duration
	// NotBefore is relative to the time of the enqueue (0: none): the job
	// is not sent before then (booked there, past its place in the queue).
	NotBefore time.Duration
}

// AnswerKind is how the downstream answers a write.
type AnswerKind int

const (
	AnswerOK        AnswerKind = iota // 200
	AnswerPushback                    // 429 with Retry-After
	AnswerRetry                       // 503 without Retry-After: retried after a backoff
	AnswerPermanent                   // 400: the job fails for good
	AnswerTimeout                     // no answer within the attempt's timeout
)

// Answer is the downstream's behaviour.
type Answer struct {
	Kind AnswerKind
	// N: Pushback: Retry-After is N times the longest interval the tenant
	// has had (so a pushback never asks for a resend sooner than the
	// schedule's spacing: that is the dispatcher's gate's job).
	N int
	// Backoff: Retry and Timeout: the next attempt no sooner than this
	// after the answer.
	Backoff time.Duration
	// Timeout: Timeout: how long the attempt waits for an answer that
	// never comes.
	Timeout time.Duration
}

// PolicySpec is a tenant's policy in a model run.
type PolicySpec struct {
	Interval time.Duration
	Burst    int
	Capacity int
	Windows  []WindowSpec
	// MaxScheduled bounds the jobs booked for their not_before (0: none).
	MaxScheduled int
	// MaxInFlight caps the tenant's attempts in flight (0: none).
	MaxInFlight int
}

// WindowSpec is a window of a PolicySpec: at most N sends in any Length.
type WindowSpec struct {
	N      int
	Length time.Duration
}

// The model's grid: every time the store is asked about, every slot and
// every write falls on a multiple of modelGrid from T0; deadlines fall
// modelDeadlineOff after one. The store hands a job over at most its lead
// (10 ms here) before its slot, so nothing the test looks at depends on
// how fast goroutines run.
const (
	modelGrid        = 50 * time.Millisecond
	modelLead        = 10 * time.Millisecond
	modelDeadlineOff = 20 * time.Millisecond
)

// modelTenants are the tenants of a model run.
var modelTenants = []string{"a", "b"}

var defaultModelPolicy = PolicySpec{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 3}

// modelPolicies are what a reload picks from: leaky, token, both, and with
// windows.
var modelPolicies = []PolicySpec{
	{Interval: 50 * time.Millisecond, Burst: 1, Capacity: 3},
	{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 0},
	{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 2, MaxScheduled: 2},
	{Interval: 150 * time.Millisecond, Burst: 1, Capacity: 4},
	{Interval: 50 * time.Millisecond, Burst: 3, Capacity: 0, MaxInFlight: 1},
	{Interval: 100 * time.Millisecond, Burst: 2, Capacity: 0},
	{Interval: 100 * time.Millisecond, Burst: 2, Capacity: 2, MaxInFlight: 2},
	{Interval: 50 * time.Millisecond, Burst: 1, Capacity: 3, Windows: []WindowSpec{{N: 3, Length: time.Second}}},
	{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 2, Windows: []WindowSpec{{N: 2, Length: 500 * time.Millisecond}}, MaxScheduled: 3},
	{Interval: 50 * time.Millisecond, Burst: 2, Capacity: 0, Windows: []WindowSpec{{N: 3, Length: time.Second}}},
	{Interval: 50 * time.Millisecond, Burst: 1, Capacity: 4, MaxInFlight: 1},
}

// GenerateOps is the deterministic random sequence of seed: steps ops,
// after one reload per tenant that sets its first policy.
func GenerateOps(seed uint64, steps int) []Op {
	r := rand.New(rand.NewPCG(seed, 0x7468726f74746c65))
	pick := func(n int) int { return r.IntN(n) }
	var ops []Op
	pol := map[string]PolicySpec{}
	// A repeat of a key is the same request again: same cost.
	sent := map[string]JobSpec{}
	job := func(tn string) JobSpec {
		j := genJob(r, pol[tn])
		if first, ok := sent[tn+"/"+j.Key]; ok && j.Key != "" {
			j.Cost = first.Cost
		} else if j.Key != "" {
			sent[tn+"/"+j.Key] = j
		}
		return j
	}
	for _, tn := range modelTenants {
		p := modelPolicies[pick(len(modelPolicies))]
		pol[tn] = p
		ops = append(ops, Op{Kind: OpReload, Tenant: tn, Policy: p})
	}
	for len(ops) < steps+len(modelTenants) {
		tn := modelTenants[pick(len(modelTenants))]
		var op Op
		switch x := pick(100); {
		case x < 30:
			op = Op{Kind: OpEnqueue, Tenant: tn, Jobs: []JobSpec{job(tn)}}
		case x < 38:
			n := 2 + pick(4)
			op = Op{Kind: OpEnqueue, Tenant: tn}
			for range n {
				op.Jobs = append(op.Jobs, job(tn))
			}
		case x < 62:
			k := 1 + pick(6)
			if pick(8) == 0 {
				k = 10 + pick(30)
			}
			op = Op{Kind: OpAdvance, D: time.Duration(k) * modelGrid}
		case x < 70:
			op = Op{Kind: OpDownstream, Answer: genAnswer(r)}
		case x < 75:
			op = Op{Kind: OpCancel, Pick: pick(1000)}
		case x < 80:
			op = Op{Kind: OpRetry, Pick: pick(1000)}
		case x < 83:
			op = Op{Kind: OpHold, Tenant: tn}
		case x < 87:
			op = Op{Kind: OpResume, Tenant: tn}
		case x < 91:
			p := modelPolicies[pick(len(modelPolicies))]
			pol[tn] = p
			op = Op{Kind: OpReload, Tenant: tn, Policy: p}
		case x < 96:
			var down time.Duration
			if pick(3) == 0 {
				down = time.Duration(1+pick(6)) * modelGrid
			}
			op = Op{Kind: OpCrash, D: down}
			if pick(3) == 0 {
				op.Kind = OpStale
			}
		default:
			op = Op{Kind: OpCrashOnWrite}
		}
		ops = append(ops, op)
	}
	return ops
}

// genJob makes a job for a tenant of policy p.
func genJob(r *rand.Rand, p PolicySpec) JobSpec {
	var j JobSpec
	if len(p.Windows) == 0 && r.IntN(5) == 0 {
		j.Cost = 2 + r.IntN(p.Capacity+p.Burst) // sometimes more than fits: cost_too_large
	}
	if r.IntN(10) < 3 {
		j.Key = fmt.Sprintf("k%d", r.IntN(6))
	}
	switch x := r.IntN(20); {
	case x < 3:
		j.Deadline = time.Duration(1+r.IntN(12))*modelGrid + modelDeadlineOff
	case x < 4:
		j.Deadline = -modelDeadlineOff - time.Duration(r.IntN(3))*modelGrid
	}
	if r.IntN(5) == 0 {
		j.NotBefore = time.Duration(1+r.IntN(30)) * modelGrid
	}
	return j
}

func genAnswer(r *rand.Rand) Answer {
	// Timeouts hold their attempts open: a fifth of the answers, so that
	// caps on attempts in flight bind.
	switch x := r.IntN(20); {
	case x < 7:
		return Answer{Kind: AnswerOK}
	case x < 11:
		return Answer{Kind: AnswerPushback, N: 1 + r.IntN(4)}
	case x < 14:
		return Answer{Kind: AnswerRetry, Backoff: time.Duration(1+r.IntN(8)) * modelGrid}
	case x < 16:
		return Answer{Kind: AnswerPermanent}
	default:
		return Answer{Kind: AnswerTimeout, Timeout: time.Duration(1+r.IntN(4)) * modelGrid, Backoff: time.Duration(1+r.IntN(4)) * modelGrid}
	}
}

// GoString prints an op as a Go composite literal of package queuetest.
func (o Op) GoString() string {
	var b strings.Builder
	b.WriteString("{Kind: " + o.Kind.String())
	if o.Tenant != "" {
		fmt.Fprintf(&b, ", Tenant: %q", o.Tenant)
	}
	if len(o.Jobs) > 0 {
		b.WriteString(", Jobs: []queuetest.JobSpec{")
		for i, j := range o.Jobs {
			if i > 0 {
				b.WriteString(", ")
			}
			var f []string
			if j.Cost != 0 {
				f = append(f, fmt.Sprintf("Cost: %d", j.Cost))
			}
			if j.Key != "" {
				f = append(f, fmt.Sprintf("Key: %q", j.Key))
			}
			if j.Deadline != 0 {
				f = append(f, "Deadline: "+goDuration(j.Deadline))
			}
			if j.NotBefore != 0 {
				f = append(f, "NotBefore: "+goDuration(j.NotBefore))
			}
			b.WriteString("{" + strings.Join(f, ", ") + "}")
		}
		b.WriteString("}")
	}
	if o.Kind == OpCancel || o.Kind == OpRetry {
		fmt.Fprintf(&b, ", Pick: %d", o.Pick)
	}
	if o.D != 0 {
		b.WriteString(", D: " + goDuration(o.D))
	}
	if o.Kind == OpDownstream {
		a := o.Answer
		fmt.Fprintf(&b, ", Answer: queuetest.Answer{Kind: queuetest.%s", a.Kind)
		if a.N != 0 {
			fmt.Fprintf(&b, ", N: %d", a.N)
		}
		if a.Backoff != 0 {
			b.WriteString(", Backoff: " + goDuration(a.Backoff))
		}
		if a.Timeout != 0 {
			b.WriteString(", Timeout: " + goDuration(a.Timeout))
		}
		b.WriteString("}")
	}
	if o.Kind == OpReload {
		p := o.Policy
		fmt.Fprintf(&b, ", Policy: queuetest.PolicySpec{Interval: %s, Burst: %d, Capacity: %d", goDuration(p.Interval), p.Burst, p.Capacity)
		if len(p.Windows) > 0 {
			b.WriteString(", Windows: []queuetest.WindowSpec{")
			for i, w := range p.Windows {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "{N: %d, Length: %s}", w.N, goDuration(w.Length))
			}
			b.WriteString("}")
		}
		if p.MaxScheduled != 0 {
			fmt.Fprintf(&b, ", MaxScheduled: %d", p.MaxScheduled)
		}
		if p.MaxInFlight != 0 {
			fmt.Fprintf(&b, ", MaxInFlight: %d", p.MaxInFlight)
		}
		b.WriteString("}")
	}
	b.WriteString("}")
	return b.String()
}

// String is a compact form for logs.
func (o Op) String() string {
	switch o.Kind {
	case OpEnqueue:
		var js []string
		for _, j := range o.Jobs {
			s := "job"
			if j.Cost > 1 {
				s += fmt.Sprintf(" cost %d", j.Cost)
			}
			if j.Key != "" {
				s += " key " + j.Key
			}
			if j.Deadline != 0 {
				s += fmt.Sprintf(" deadline %+v", j.Deadline)
			}
			if j.NotBefore != 0 {
				s += fmt.Sprintf(" not before %+v", j.NotBefore)
			}
			js = append(js, s)
		}
		return fmt.Sprintf("enqueue %s [%s]", o.Tenant, strings.Join(js, ", "))
	case OpCancel, OpRetry:
		return fmt.Sprintf("%s pick %d", strings.ToLower(strings.TrimPrefix(o.Kind.String(), "queuetest.Op")), o.Pick)
	case OpHold, OpResume:
		return fmt.Sprintf("%s %s", strings.ToLower(strings.TrimPrefix(o.Kind.String(), "queuetest.Op")), o.Tenant)
	case OpAdvance:
		return fmt.Sprintf("advance %v", o.D)
	case OpDownstream:
		a := o.Answer
		switch a.Kind {
		case AnswerPushback:
			return fmt.Sprintf("downstream 429 retry-after %d intervals", a.N)
		case AnswerRetry:
			return fmt.Sprintf("downstream 503 backoff %v", a.Backoff)
		case AnswerPermanent:
			return "downstream 400"
		case AnswerTimeout:
			return fmt.Sprintf("downstream timeout after %v, backoff %v", a.Timeout, a.Backoff)
		}
		return "downstream 200"
	case OpReload:
		return fmt.Sprintf("reload %s %s", o.Tenant, o.Policy)
	case OpCrash:
		return fmt.Sprintf("crash, restart after %v", o.D)
	case OpCrashOnWrite:
		return "crash at the next write"
	case OpStale:
		return fmt.Sprintf("stop past the lease (SIGSTOP), another process after %v, then wake", o.D)
	case 0:
		return "final drain"
	}
	return fmt.Sprintf("op %d", o.Kind)
}

func (p PolicySpec) String() string {
	s := fmt.Sprintf("T=%v burst=%d capacity=%d", p.Interval, p.Burst, p.Capacity)
	for _, w := range p.Windows {
		s += fmt.Sprintf(" window=%d/%v", w.N, w.Length)
	}
	return s
}

func (k OpKind) String() string {
	names := map[OpKind]string{OpEnqueue: "OpEnqueue", OpCancel: "OpCancel", OpRetry: "OpRetry", OpHold: "OpHold", OpResume: "OpResume", OpAdvance: "OpAdvance", OpDownstream: "OpDownstream", OpReload: "OpReload", OpCrash: "OpCrash", OpCrashOnWrite: "OpCrashOnWrite", OpStale: "OpStale"}
	if n, ok := names[k]; ok {
		return "queuetest." + n
	}
	return fmt.Sprintf("queuetest.OpKind(%d)", int(k))
}

func (k AnswerKind) String() string {
	switch k {
	case AnswerOK:
		return "AnswerOK"
	case AnswerPushback:
		return "AnswerPushback"
	case AnswerRetry:
		return "AnswerRetry"
	case AnswerPermanent:
		return "AnswerPermanent"
	case AnswerTimeout:
		return "AnswerTimeout"
	}
	return fmt.Sprintf("AnswerKind(%d)", int(k))
}

// goDuration prints d as a Go expression.
func goDuration(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	switch {
	case d%time.Second == 0:
		return fmt.Sprintf("%s%d * time.Second", neg, d/time.Second)
	case d%time.Millisecond == 0:
		return fmt.Sprintf("%s%d * time.Millisecond", neg, d/time.Millisecond)
	}
	return fmt.Sprintf("%s%d", neg, int64(d))
}

// FormatOps prints ops as a Go slice literal, one op a line.
func FormatOps(ops []Op) string {
	var b strings.Builder
	b.WriteString("[]queuetest.Op{\n")
	for _, o := range ops {
		b.WriteString("\t" + o.GoString() + ",\n")
	}
	b.WriteString("}")
	return b.String()
}
