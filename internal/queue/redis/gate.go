package redis

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"throttler/internal/leaky"
	"throttler/internal/luascript"
	"throttler/internal/queue"
)

var (
	//go:embed gate.lua
	gateLua string
	//go:embed gatehold.lua
	gateHoldLua string

	gateScript     = newScript("gate.lua", gateLua, false)
	gateHoldScript = newScript("gatehold.lua", gateHoldLua, false)
)

// gate.lua's codes.
const (
	gateGo   = 0
	gateWait = 1
	gateHeld = 2
)

// gateReply is gate.lua's answer.
type gateReply struct {
	Code      int64
	Wait      time.Duration
	HeldUntil time.Time
	// Grant is a go's grant, as gate.lua takes it back: each lane's TAT
	// before and after it, and its time (raw microseconds).
	Grant [5]int64
}

func (g *gateReply) Decode(r *luascript.Reply) {
	g.Code = r.Int()
	g.Wait = r.Duration()
	g.HeldUntil = r.Time()
	for i := range g.Grant {
		g.Grant[i] = r.Int()
	}
	if g.Code < gateGo || g.Code > gateHeld {
		r.Fail(fmt.Errorf("unknown code %d", g.Code))
	}
}

// PassGate implements queue.SharedGate: the gate of a downstream ceiling,
// which spans partitions (its tenants' owners may be other workers), one
// atomic check per send right before it is written (gate.lua). A tenant
// whose downstream has no ceiling needs none: its partition's owner alone
// sends for it and paces it in process, so it goes at once.
func (s *Store) PassGate(ctx context.Context, r queue.GateRequest) (queue.GateAnswer, error) {
	if r.Ceiling == nil {
		return noGate(ctx)
	}
	lane, dsLane := gateKeys(r.Downstream, r.Tenant)
	var dsT, dsTau int64
	var dsWindows []leaky.Window
	if r.Ceiling != nil {
		dsT, dsTau, dsWindows = usCeil(r.Ceiling.Interval), usCeil(r.Ceiling.Tolerance()), r.Ceiling.Windows
	}
	keys := []string{lane, dsLane}
	args := []any{s.now(), usCeil(r.Policy.Interval), usCeil(r.Policy.Tolerance()),
		dsT, dsTau, max(r.Cost, 1), r.Slack.Microseconds(), s.idle.Milliseconds(), len(r.Policy.Windows), len(dsWindows)}
	for _, w := range r.Policy.Windows {
		keys = append(keys, gateWindow(lane, w))
		args = append(args, w.N, usCeil(w.Length))
	}
	for _, w := range dsWindows {
		keys = append(keys, gateWindow(dsLane, w))
		args = append(args, w.N, usCeil(w.Length))
	}
	return s.passGate(ctx, keys, args, nil)
}

// noGate is the answer of a tenant with no ceiling: go, and asked again
// (the dispatcher asks again when it could not write within its budget of
// the answer, as on a busy machine), go again, without a round trip. Its
// Again must not be nil: the dispatcher calls it.
func noGate(context.Context) (queue.GateAnswer, error) {
	return queue.GateAnswer{Again: noGate}, nil
}

// passGate asks gate.lua with args, and giveBack (a grant to give back
// first, or nil).
func (s *Store) passGate(ctx context.Context, keys []string, args, giveBack []any) (queue.GateAnswer, error) {
	var g gateReply
	if err := gateScript.Run(ctx, s.rdb, keys, append(args[:len(args):len(args)], giveBack...), &g); err != nil {
		return queue.GateAnswer{}, err
	}
	switch g.Code {
	case gateWait:
		return queue.GateAnswer{Wait: g.Wait}, nil
	case gateHeld:
		return queue.GateAnswer{HeldUntil: g.HeldUntil}, nil
	}
	again := func(ctx context.Context) (queue.GateAnswer, error) {
		// The same question, and this grant to take back: one round trip.
		back := []any{"again"}
		for _, v := range g.Grant {
			back = append(back, v)
		}
		return s.passGate(ctx, keys, args, back)
	}
	return queue.GateAnswer{Again: again}, nil
}

// holdLanes holds a tenant's gate lane (and its downstream's) after a
// pushback, so that sends other processes already hold stop too.
func (s *Store) holdLanes(ctx context.Context, tenant string, until time.Time, downstreamToo bool) error {
	ds, ceiling := s.ceiling(tenant)
	lane, dsLane := gateKeys(ds, tenant)
	p := s.policy(tenant)
	if err := gateHoldScript.Run(ctx, s.rdb, []string{lane}, []any{"until", micros(until), usCeil(p.Tolerance()), s.idle.Milliseconds()}, nil); err != nil {
		return err
	}
	if downstreamToo && ceiling != nil {
		return gateHoldScript.Run(ctx, s.rdb, []string{dsLane}, []any{"until", micros(until), usCeil(ceiling.Tolerance()), s.idle.Milliseconds()}, nil)
	}
	return nil
}
