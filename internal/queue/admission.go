package queue

import (
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// MaxCost is the largest cost a tenant of policy p can ever be admitted
// with, under its downstream's ceiling (nil: none). A ceiling spaces, it
// never refuses: only its windows bound a cost.
func MaxCost(p leaky.Policy, ceiling *leaky.Policy) int {
	most := p.MaxCost()
	if ceiling != nil {
		for _, w := range ceiling.Windows {
			most = min(most, w.N)
		}
	}
	return most
}

// CeilingDelay is the least a tenant's next job waits for its downstream's
// ceiling with ahead of the tenant's jobs before it: as if it had the
// ceiling to itself (sharing it with others who are due makes it longer).
func CeilingDelay(c *leaky.Policy, ahead int) time.Duration {
	if c == nil || ahead <= 0 {
		return 0
	}
	return time.Duration(max(0, ahead+1-c.Burst)) * c.Interval
}

// Plan is what every backend settles about a call's jobs before any of them
// reaches the bucket: a repeat of an idempotency key within the call is
// answered as its first use is, and a cost no bucket can hold is refused
// for good, unless its key was admitted before (a reload may have shrunk
// the bucket since: the job admitted then is still sent).
type Plan struct {
	// Decide lists, in order, the jobs the backend decides.
	Decide []int
	// Lookup lists the jobs refused for their cost that carry an
	// idempotency key: the backend looks the key up, and answers a stored
	// one as a repeat (Repeat) instead.
	Lookup []int
	// copyOf maps each repeat in the call to its first use.
	copyOf map[int]int
}

// Precheck plans a call of jobs for a tenant whose largest admissible cost
// is most, filling out for the jobs refused for their cost.
func Precheck(tenant string, jobs []NewJob, most, capacity int, out []Admission) Plan {
	plan := Plan{copyOf: map[int]int{}}
	first := map[string]int{} // idempotency key -> its first use in the call
	for i, nj := range jobs {
		if nj.IdempotencyKey != "" {
			if f, ok := first[nj.IdempotencyKey]; ok {
				plan.copyOf[i] = f
				continue
			}
			first[nj.IdempotencyKey] = i
		}
		if cost := max(nj.Cost, 1); cost > most {
			out[i] = CostTooLarge(tenant, cost, most, capacity)
			if nj.IdempotencyKey != "" {
				plan.Lookup = append(plan.Lookup, i)
			}
			continue
		}
		plan.Decide = append(plan.Decide, i)
	}
	return plan
}

// CostTooLarge is the answer to a job of cost for a tenant whose largest
// admissible cost is most: refused for good (422 cost_too_large).
func CostTooLarge(tenant string, cost, most, capacity int) Admission {
	return Admission{Impossible: &ImpossibleError{Tenant: tenant, Reason: ReasonCostTooLarge, Cost: cost, MaxCost: most}, Capacity: capacity}
}

// Repeat is the answer to a job whose idempotency key admitted prev: prev,
// as it was admitted.
func Repeat(prev Job, capacity int) Admission {
	return Admission{Job: prev, Duplicate: true, ExpectedDelay: prev.AdmitDelay, QueueDepth: prev.AdmitDepth, Capacity: capacity}
}

// FillRepeats answers each repeat in the call as its first use was
// answered: a duplicate of the job it admitted.
func (p Plan) FillRepeats(out []Admission) {
	for i, f := range p.copyOf {
		out[i] = out[f]
		out[i].Duplicate = out[f].Admitted()
	}
}
