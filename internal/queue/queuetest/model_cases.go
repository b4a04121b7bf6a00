package queuetest

import "time"

// Cases the model found on both stores, shrunk, for each store's
// TestModelRegression.

// CaseBookedRetriesAndTheRate (seed 260 of a soak of seeds 201-500, open
// on both stores): in token mode, two retries booked past their places
// fill the room and the rate refuses a job too; the answer is the rate's
// Retry-After (50 ms) where the model wants the count's (at least
// 100 ms). docs/RELIABILITY.md has it.
var CaseBookedRetriesAndTheRate = []Op{
	{Kind: OpDownstream, Answer: Answer{Kind: AnswerRetry, Backoff: 400 * time.Millisecond}},
	{Kind: OpEnqueue, Tenant: "a", Jobs: []JobSpec{{Key: "k3"}}},
	{Kind: OpEnqueue, Tenant: "a", Jobs: []JobSpec{{}}},
	{Kind: OpAdvance, D: 300 * time.Millisecond},
	{Kind: OpReload, Tenant: "a", Policy: PolicySpec{Interval: 50 * time.Millisecond, Burst: 2, Capacity: 0, Windows: []WindowSpec{{N: 3, Length: time.Second}}}},
	{Kind: OpEnqueue, Tenant: "a", Jobs: []JobSpec{{Deadline: -120 * time.Millisecond}}},
}
