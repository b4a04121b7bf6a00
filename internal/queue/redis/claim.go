package redis

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/rules"
)

var (
	//go:embed claim.lua
	claimLua    string
	claimScript = newScript("claim.lua", owner.FenceLua+claimLua, true)
	//go:embed recount.lua
	recountLua    string
	recountScript = newScript("recount.lua", owner.FenceLua+recountLua, false)
)

// claim.lua's codes.
const (
	claimDrop    = 0 // the job is gone, done, or being sent already
	claimNotYet  = 1
	claimed      = 2
	claimExpired = 3
	claimHeld    = 5 // its tenant is held by an operator
)

// claimReply is claim.lua's answer for one job.
type claimReply struct {
	Code       int64
	Wait       time.Duration
	DispatchAt time.Time
	Attempts   int
	Job        map[string]string // claimed: the job's hash
}

func (c *claimReply) Decode(r *luascript.Reply) {
	c.Code = r.Int()
	c.Wait = r.Duration()
	c.DispatchAt = r.Time()
	c.Attempts = int(r.Int())
	c.Job = r.Hash()
	if c.Code < claimDrop || c.Code > claimHeld || c.Code == 4 {
		r.Fail(fmt.Errorf("unknown code %d", c.Code))
	}
}

// claimReplies is claim.lua's whole answer: the time it decided at, and
// one reply per job.
type claimReplies struct {
	Now  time.Time
	Jobs []claimReply
}

func (c *claimReplies) Decode(r *luascript.Reply) {
	c.Now = r.Time()
	r.Each(func(r *luascript.Reply) {
		var one claimReply
		one.Decode(r)
		c.Jobs = append(c.Jobs, one)
	})
}

// heldRecheck is how soon the job of a held tenant looks again: a resume
// on another process is seen within it.
const heldRecheck = time.Second

// claimBatch claims the jobs due within horizon among due, for the owner
// of partition k under fence f.
func (s *Store) claimBatch(ctx context.Context, f owner.Fence, k partKeys, due []*entry, horizon time.Duration) (claimReplies, error) {
	args := []any{f.Token(), s.scriptNow(), horizon.Microseconds(), s.retain.Milliseconds(), heldRecheck.Microseconds(), k.tag, s.idle.Milliseconds(), usCeil(s.clockMargin())}
	for _, e := range due {
		p := s.policy(e.tenant)
		args = append(args, e.id, e.tenant, usCeil(p.Interval), usCeil(p.Tolerance()), flag(rules.CountsWaiting(p)))
	}
	var r claimReplies
	err := claimScript.Run(ctx, s.rdb, []string{f.Key(), k.active(), k.sending()}, args, &r)
	if err != nil {
		return r, f.Err(err)
	}
	if len(r.Jobs) != len(due) {
		return r, fmt.Errorf("claim.lua: %d replies for %d jobs", len(r.Jobs), len(due))
	}
	return r, nil
}

// claimedJob is the job of a claim: its hash, as the attempt sees it.
func claimedJob(r claimReply) queue.Job {
	j := jobFromHash(r.Job)
	j.State, j.Attempts, j.DispatchAt = queue.StateDispatching, r.Attempts, r.DispatchAt
	return j
}
