package owner

import (
	"hash/fnv"
	"strconv"
)

// PartitionOf is the partition of tenant among p: FNV-1a of its name,
// modulo p. Stable across processes, versions and restarts (every process
// must hash a tenant to the same partition), so never change it.
func PartitionOf(tenant string, p int) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(p))
}

// Tag is partition p's hash tag, without its braces. Every key of the
// partition carries {Tag(p)}, so that one partition lives in one Cluster
// slot and a script may touch all of them; an asynq queue named Tag(p)
// (its keys are asynq:{Tag(p)}:...) lands in the same slot.
func Tag(p int) string { return "throttler-p" + strconv.Itoa(p) }

// KeyPrefix is the prefix of every key of partition p, hash tag included:
// the store builds its partition keys on it.
func KeyPrefix(p int) string { return "throttler:{" + Tag(p) + "}:" }

// leaseKey holds the partition's lease: the owner's token (see token),
// expiring Lease after its last renewal. Empty: held vacant (acquire.lua).
func leaseKey(p int) string { return KeyPrefix(p) + "lease" }

// epochKey counts the partition's tenures. It never expires: an epoch is
// never handed out twice while Redis keeps its data.
func epochKey(p int) string { return KeyPrefix(p) + "epoch" }

// The keys every worker shares live under a tag of their own (one slot,
// so that members.lua touches both).
const metaPrefix = "throttler:{throttler-owner}:"

// partitionsKey records P (a string); workersKey is the live workers (a
// zset: worker id -> when its heartbeat runs out, ms of Redis's clock).
const (
	partitionsKey = metaPrefix + "partitions"
	workersKey    = metaPrefix + "workers"
)

// WorkersKey is workersKey, for a test that must tell a worker's
// heartbeat from its other commands.
const WorkersKey = workersKey

// LeaseKey is partition p's lease (a string: "worker:epoch", "" while held
// vacant, none while free) and EpochKey its epoch, for a script of the
// partition that must know whether it has an owner (admission).
func LeaseKey(p int) string { return leaseKey(p) }
func EpochKey(p int) string { return epochKey(p) }
