package owner

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
)

var (
	//go:embed acquire.lua
	acquireLua string
	//go:embed renew.lua
	renewLua string
	//go:embed release.lua
	releaseLua string

	acquireScript = luascript.New("acquire.lua", acquireLua)
	renewScript   = luascript.New("renew.lua", renewLua)
	releaseScript = luascript.New("release.lua", releaseLua)
)

// token is a lease's value: the worker and the epoch of its tenure. The
// epoch goes last (worker ids may hold colons).
func token(worker string, epoch int64) string {
	return worker + ":" + strconv.FormatInt(epoch, 10)
}

// parseToken splits a lease's value; false for "" (held vacant) or a
// value this package did not write.
func parseToken(v string) (worker string, epoch int64, ok bool) {
	i := strings.LastIndexByte(v, ':')
	if i <= 0 {
		return "", 0, false
	}
	epoch, err := strconv.ParseInt(v[i+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return v[:i], epoch, true
}

// acquire.lua's codes.
const (
	acquireHeld    = 0
	acquireTaken   = 1
	acquireVacated = 2
)

// acquireReply is acquire.lua's answer.
type acquireReply struct {
	Code   int64
	Epoch  int64
	Holder string
}

func (a *acquireReply) Decode(r *luascript.Reply) {
	a.Code = r.Int()
	a.Epoch = r.Int()
	a.Holder = r.Str()
	if a.Code < acquireHeld || a.Code > acquireVacated {
		r.Fail(fmt.Errorf("unknown code %d", a.Code))
	}
}

// renewReply is renew.lua's (and release.lua's) answer.
type renewReply struct {
	OK     bool
	Holder string // not OK: the lease's value ("" none, or vacant)
}

func (rr *renewReply) Decode(r *luascript.Reply) {
	rr.OK = r.Int() == 1
	if !rr.OK && r.More() {
		rr.Holder = r.Str()
	}
}

// ms is d in whole milliseconds, at least 1: Redis's PX unit.
func ms(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// Lease is one partition's lease as Redis holds it now (ReadLeases).
type Lease struct {
	Partition int
	// Worker and Epoch: its owner and tenure; "" and 0 when free or
	// vacant.
	Worker string
	Epoch  int64
	// Vacant: held by nobody for one lease after Redis first saw the
	// partition (or lost its keys); see acquire.lua.
	Vacant bool
	// TTL: how long the lease has left if its owner stops renewing (0
	// when free).
	TTL time.Duration
}

// Free is whether nobody holds the lease: a worker may take it.
func (l Lease) Free() bool { return l.Worker == "" && !l.Vacant }

// ReadLeases reads the lease of each of p partitions, in one round trip
// (one per node on a Cluster), for operators, status pages and tests. It
// reads only; the answer is as of the read.
func ReadLeases(ctx context.Context, rdb goredis.UniversalClient, p int) ([]Lease, error) {
	gets := make([]*goredis.StringCmd, p)
	ttls := make([]*goredis.DurationCmd, p)
	pipe := rdb.Pipeline()
	for i := range p {
		gets[i] = pipe.Get(ctx, leaseKey(i))
		ttls[i] = pipe.PTTL(ctx, leaseKey(i))
	}
	_, _ = pipe.Exec(ctx)
	out := make([]Lease, p)
	for i := range p {
		out[i].Partition = i
		v, err := gets[i].Result()
		if errors.Is(err, goredis.Nil) {
			continue
		}
		if err != nil {
			return nil, queue.Unavailable(err)
		}
		if w, e, ok := parseToken(v); ok {
			out[i].Worker, out[i].Epoch = w, e
		} else {
			out[i].Vacant = true
		}
		if d, err := ttls[i].Result(); err == nil && d > 0 {
			out[i].TTL = d
		}
	}
	return out, nil
}

// freePartitions lists the partitions no lease holds, and those held
// vacant with how long their vacancy has left, read in one round trip
// (GET and PTTL: the balancer's cheap look).
func freePartitions(ctx context.Context, rdb goredis.UniversalClient, p int) (free []int, vacant map[int]time.Duration, err error) {
	gets := make([]*goredis.StringCmd, p)
	ttls := make([]*goredis.DurationCmd, p)
	pipe := rdb.Pipeline()
	for i := range p {
		gets[i] = pipe.Get(ctx, leaseKey(i))
		ttls[i] = pipe.PTTL(ctx, leaseKey(i))
	}
	_, _ = pipe.Exec(ctx)
	for i, g := range gets {
		v, err := g.Result()
		switch {
		case errors.Is(err, goredis.Nil):
			free = append(free, i)
		case err != nil:
			return nil, nil, queue.Unavailable(err)
		case v == "":
			if d, err := ttls[i].Result(); err == nil && d > 0 {
				if vacant == nil {
					vacant = map[int]time.Duration{}
				}
				vacant[i] = d
			}
		}
	}
	return free, vacant, nil
}
