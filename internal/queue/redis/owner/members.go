package owner

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/luascript"

	goredis "github.com/redis/go-redis/v9"
)

var (
	//go:embed members.lua
	membersLua    string
	membersScript = luascript.New("members.lua", membersLua)
)

// PartitionsError is a process configured with another partition count
// than the one its Redis records. Every process on one Redis must hash
// tenants alike, so it may not start.
type PartitionsError struct {
	Configured int    // this process's
	Recorded   int    // Redis's
	Key        string // where Redis records it
}

func (e *PartitionsError) Error() string {
	return fmt.Sprintf("owner: this process is configured with %d partitions, but its Redis records %d (key %s): "+
		"every process on one Redis must use the same count. Configure %d partitions; "+
		"or, to change the count, stop every throttler process, let the queues empty, and delete that key "+
		"(a new count moves every tenant to another partition)",
		e.Configured, e.Recorded, e.Key, e.Recorded)
}

// membersReply is members.lua's answer.
type membersReply struct {
	Recorded int64
	Live     []string // sorted (members sorts them)
}

func (m *membersReply) Decode(r *luascript.Reply) {
	m.Recorded = r.Int()
	m.Live = r.Rest()
}

// members runs members.lua: worker "" only records or checks p.
func members(ctx context.Context, rdb goredis.UniversalClient, p int, worker string, ttl time.Duration) (membersReply, error) {
	var rep membersReply
	err := membersScript.Run(ctx, rdb, []string{partitionsKey, workersKey}, []any{p, worker, ms(ttl)}, &rep)
	slices.Sort(rep.Live)
	return rep, err
}

// RecordPartitions records p as its Redis's partition count if none is
// recorded yet, and is a *PartitionsError if another is: for a process
// that hashes tenants onto partitions without running a Manager (one
// that only admits jobs). Manager.Start does the same.
func RecordPartitions(ctx context.Context, rdb goredis.UniversalClient, p int) error {
	if p < 1 {
		return fmt.Errorf("owner: %d partitions: want at least 1", p)
	}
	rep, err := members(ctx, rdb, p, "", time.Millisecond)
	if err != nil {
		return err
	}
	return checkPartitions(p, rep.Recorded)
}

func checkPartitions(p int, recorded int64) error {
	if recorded != int64(p) {
		return &PartitionsError{Configured: p, Recorded: int(recorded), Key: partitionsKey}
	}
	return nil
}

// shareOf is worker id's fair share of p partitions among the live
// workers (sorted): p/N each, the remainder one each to the first workers
// by id, so every worker computes the same shares from the same list and
// they sum to p. A worker not in the list (it has not joined, or its count
// differs from Redis's) gets none.
func shareOf(id string, live []string, p int) int {
	i, ok := slices.BinarySearch(live, id)
	if !ok {
		return 0
	}
	share := p / len(live)
	if i < p%len(live) {
		share++
	}
	return share
}
