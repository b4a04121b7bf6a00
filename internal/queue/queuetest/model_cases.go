package queuetest

import "time"

// Cases the model found on both stores, shrunk, for each store's
// TestModelRegression.

// CaseBookedRetriesAndTheRate (seed 260 of a soak of seeds 201-500, on
// both stores): in token mode, two retries booked past their places fill
// the room and the rate refuses a job too. The answer was the rate's
// Retry-After (50 ms), at which the count still refused it; it is now the
// later of the two (at least 100 ms, when the first retry goes).
var CaseBookedRetriesAndTheRate = []Op{
	{Kind: OpDownstream, Answer: Answer{Kind: AnswerRetry, Backoff: 400 * time.Millisecond}},
	{Kind: OpEnqueue, Tenant: "a", Jobs: []JobSpec{{Key: "k3"}}},
	{Kind: OpEnqueue, Tenant: "a", Jobs: []JobSpec{{}}},
	{Kind: OpAdvance, D: 300 * time.Millisecond},
	{Kind: OpReload, Tenant: "a", Policy: PolicySpec{Interval: 50 * time.Millisecond, Burst: 2, Capacity: 0, Windows: []WindowSpec{{N: 3, Length: time.Second}}}},
	{Kind: OpEnqueue, Tenant: "a", Jobs: []JobSpec{{Deadline: -120 * time.Millisecond}}},
}
