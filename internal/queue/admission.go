package queue

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
