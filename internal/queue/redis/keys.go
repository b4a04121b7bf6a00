package redis

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"throttler/internal/leaky"
	"throttler/internal/queue"
)

// Shards is how many asynq queues a Redis-backed throttler spreads its
// tenants over. A tenant's state, its jobs and their asynq tasks share one
// hash tag (the queue's name), so every script touches one Cluster slot;
// several shards spread the load over a Cluster's masters. Changing it
// re-homes every tenant: it is fixed.
const Shards = 8

// shardOf is the shard a tenant lives in.
func shardOf(tenant string) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % Shards)
}

// queueName is the asynq queue of a shard, and its hash tag.
func queueName(shard int) string { return fmt.Sprintf("throttler-%d", shard) }

// newJobID is a job id that carries its tenant's shard (queue.NewTaggedID),
// so a job is found by its id alone.
func newJobID(now time.Time, shard int) string { return queue.NewTaggedID(now, byte(shard)) }

// shardOfID is the shard of a job id made by newJobID (false: not one).
func shardOfID(id string) (int, bool) {
	tag, ok := queue.IDTag(id)
	if !ok || int(tag) >= Shards {
		return 0, false
	}
	return int(tag), true
}

// shardKeys names the Redis keys of one shard. Every key carries the
// shard's hash tag, the same as its asynq queue's keys.
type shardKeys struct {
	shard int
	tag   string // the prefix of every key of the shard (scripts build keys from it)
}

func keysOf(shard int) shardKeys {
	return shardKeys{shard: shard, tag: "throttler:{" + queueName(shard) + "}:"}
}

func (k shardKeys) tenant(t string) string { return k.tag + "tenant:" + t }
func (k shardKeys) job(id string) string   { return k.tag + "job:" + id }
func (k shardKeys) failed(t string) string { return k.tag + "failed:" + t }

// waiting and claimed index a tenant's unfinished jobs by slot (zsets: id
// -> slot, tenant time): waiting, those not claimed yet; claimed, those a
// worker holds to send. Admission counts from them the jobs that really
// wait (admit.lua). Empty, Redis drops them.
func (k shardKeys) waiting(t string) string { return k.tag + "waiting:" + t }
func (k shardKeys) claimed(t string) string { return k.tag + "claimed:" + t }

// idem is an idempotency key's key: the tenant's length first, so that no
// tenant and key pair reads as another (lib.lua's idem_key builds it the
// same way).
func (k shardKeys) idem(t, key string) string {
	return k.tag + "key:" + strconv.Itoa(len(t)) + ":" + t + ":" + key
}

// idemOf is job j's idempotency key's key, or its hash's if it has none
// (scripts take a key either way).
func (k shardKeys) idemOf(j queue.Job) string {
	if j.IdempotencyKey == "" {
		return k.job(j.ID)
	}
	return k.idem(j.Tenant, j.IdempotencyKey)
}

func (k shardKeys) window(t string, w leaky.Window) string {
	return k.tag + "window:" + t + ":" + w.String()
}

// handoff: jobs admitted and not yet known to be asynq tasks (a process
// can die between the two); active: tenants with jobs, by how many;
// inflight: jobs being sent, by when their worker's lease ends.
func (k shardKeys) handoff() string  { return k.tag + "handoff" }
func (k shardKeys) active() string   { return k.tag + "active" }
func (k shardKeys) inflight() string { return k.tag + "inflight" }

// task is asynq's key of a task of the shard's queue (asynq:{queue}:t:<id>):
// read only, to see whether a task exists.
func (k shardKeys) task(id string) string { return "asynq:{" + queueName(k.shard) + "}:t:" + id }

// Gate lanes live under their downstream's hash tag: a send checks its
// tenant's lane and its downstream's in one script.
func gateKeys(downstream, tenant string) (tenantLane, downstreamLane string) {
	tag := "throttler:{ds:" + downstream + "}:gate"
	return tag + ":tenant:" + tenant, tag
}

// gateWindow is the list of a lane's window.
func gateWindow(lane string, w leaky.Window) string { return lane + ":w:" + w.String() }
