package redis

import (
	"strconv"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
)

// MaxPartitions bounds P: a job id carries its partition in one byte
// (queue.NewTaggedID), so that a job is found by its id alone.
const MaxPartitions = 256

// partOf is the partition a tenant lives in (owner.PartitionOf: every
// process hashes a tenant the same way).
func (s *Store) partOf(tenant string) int { return owner.PartitionOf(tenant, s.partitions) }

// newJobID is a job id that carries its tenant's partition.
func newJobID(now time.Time, part int) string { return queue.NewTaggedID(now, byte(part)) }

// partOfID is the partition of a job id made by newJobID (false: not one).
func (s *Store) partOfID(id string) (int, bool) {
	tag, ok := queue.IDTag(id)
	if !ok || int(tag) >= s.partitions {
		return 0, false
	}
	return int(tag), true
}

// partKeys names the Redis keys of one partition. Every key carries the
// partition's hash tag (owner.KeyPrefix), so every script touches one
// Cluster slot, the partition's lease included (the fence).
type partKeys struct {
	part int
	tag  string // the prefix of every key of the partition (scripts build keys from it)
}

func keysOf(part int) partKeys { return partKeys{part: part, tag: owner.KeyPrefix(part)} }

func (k partKeys) tenant(t string) string { return k.tag + "tenant:" + t }
func (k partKeys) job(id string) string   { return k.tag + "job:" + id }
func (k partKeys) failed(t string) string { return k.tag + "failed:" + t }

// waiting and claimed index a tenant's unfinished jobs by slot (zsets: id
// -> slot, tenant time): waiting, those not claimed yet; claimed, those
// the partition's owner holds to send (a job that ended keeps its place
// until its slot has come). Admission counts from them the jobs that
// really wait (admit.lua) where its tenant's policy bounds the queue by
// them (rules.CountsWaiting); only there is the claimed set kept (claims
// and outcomes are told which tenants, and a reload that makes a tenant
// count puts its jobs being sent in: owned.recount). The owner loads its
// schedule from waiting when it takes the partition. Empty, Redis drops
// them.
func (k partKeys) waiting(t string) string { return k.tag + "waiting:" + t }

// sched indexes a tenant's jobs booked for their not_before (zset: id ->
// slot) until they are claimed: apart from waiting, as they are from the
// queue's depth (the hash's "scheduled" counts them). The owner loads
// them with waiting when it takes the partition.
func (k partKeys) sched(t string) string   { return k.tag + "sched:" + t }
func (k partKeys) claimed(t string) string { return k.tag + "claimed:" + t }

// idem is an idempotency key's key: the tenant's length first, so that no
// tenant and key pair reads as another (lib.lua's idem_key builds it the
// same way).
func (k partKeys) idem(t, key string) string {
	return k.tag + "key:" + strconv.Itoa(len(t)) + ":" + t + ":" + key
}

// idemOf is job j's idempotency key's key, or its hash's if it has none
// (scripts take a key either way).
func (k partKeys) idemOf(j queue.Job) string {
	if j.IdempotencyKey == "" {
		return k.job(j.ID)
	}
	return k.idem(j.Tenant, j.IdempotencyKey)
}

func (k partKeys) window(t string, w leaky.Window) string {
	return k.tag + "window:" + t + ":" + w.String()
}

// sent is the list of a tenant's sends made in window w, beside its list
// (rules.Record.Sent): the times its newest N attempts recorded count at.
func (k partKeys) sent(t string, w leaky.Window) string {
	return k.tag + "sent:" + t + ":" + w.String()
}

// arrivals is the list that tells the partition's owner of jobs admitted
// (and sent again): "id dispatch_at tenant", pushed by enqueue.lua in the
// same step as the job, popped in batches by the owner. Losing it loses
// nothing: an owner that takes the partition loads the waiting sets.
// active: tenants with jobs, by how many. sending: the jobs claimed and
// not yet recorded (id -> slot), which a new owner takes back (the
// claimed sets keep a job only while its slot is ahead).
func (k partKeys) arrivals() string { return k.tag + "arrivals" }
func (k partKeys) active() string   { return k.tag + "active" }
func (k partKeys) sending() string  { return k.tag + "sending" }

// recent: the tenants a claim gave a "next" (the last claim's dispatch
// time plus its cost in intervals) that still matters, whether they have
// jobs or not: tenant -> next plus the burst's tolerance. A new owner
// starts each from it with no burst credit: the old owner may have sent
// until just before (or, frozen, send late).
func (k partKeys) recent() string { return k.tag + "recent" }

// Gate lanes live under their downstream's hash tag: a send checks its
// tenant's lane and its downstream's in one script.
func gateKeys(downstream, tenant string) (tenantLane, downstreamLane string) {
	tag := "throttler:{ds:" + downstream + "}:gate"
	return tag + ":tenant:" + tenant, tag
}

// gateWindow is the list of a lane's window.
func gateWindow(lane string, w leaky.Window) string { return lane + ":w:" + w.String() }
