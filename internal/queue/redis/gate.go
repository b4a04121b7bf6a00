package redis

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
)

var (
	//go:embed gate.lua
	gateLua string
	//go:embed gatehold.lua
	gateHoldLua string
	//go:embed gateconfirm.lua
	gateConfirmLua string

	gateScript        = newScript("gate.lua", gateLua, false)
	gateHoldScript    = newScript("gatehold.lua", gateHoldLua, false)
	gateConfirmScript = newScript("gateconfirm.lua", gateConfirmLua, false)
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
		return goAtOnce(ctx)
	}
	lane, dsLane := gateKeys(r.Downstream, r.Tenant)
	dsT, dsTau, dsWindows := usCeil(r.Ceiling.Interval), usCeil(r.Ceiling.Tolerance()), r.Ceiling.Windows
	keys := []string{lane, dsLane}
	args := []any{s.now(), usCeil(r.Policy.Interval), usCeil(r.Policy.Tolerance()),
		dsT, dsTau, max(r.Cost, 1), s.idle.Milliseconds(), len(r.Policy.Windows), len(dsWindows)}
	for _, w := range r.Policy.Windows {
		keys = append(keys, gateWindow(lane, w))
		args = append(args, w.N, usCeil(w.Length))
	}
	for _, w := range dsWindows {
		keys = append(keys, gateWindow(dsLane, w))
		args = append(args, w.N, usCeil(w.Length))
	}
	confirmArgs := []any{usCeil(r.Policy.Interval), dsT, max(r.Cost, 1)}
	return s.passGate(ctx, keys, args, confirmArgs, nil)
}

// goAtOnce is the gate's go for a send it does not gate, without a round
// trip. Like every go it has Again, which the dispatcher calls when the
// go came back later than it may use one (its goroutine was descheduled
// between asking and writing): there is nothing to give back, and it is
// go again.
func goAtOnce(context.Context) (queue.GateAnswer, error) {
	return queue.GateAnswer{Again: goAtOnce}, nil
}

// passGate asks gate.lua with args, and giveBack (a grant to give back
// first, or nil); confirmArgs are gateconfirm.lua's last arguments.
func (s *Store) passGate(ctx context.Context, keys []string, args, confirmArgs, giveBack []any) (queue.GateAnswer, error) {
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
		// The same question asked now, and this grant to take back: one
		// round trip. Asked as of now, not as of the first question: the
		// new grant's time is where its Confirm counts the write from
		// (the sender counts from when it asked again), and a grant
		// dated at the first question would put the write, and the next
		// send after it, that much too early.
		now := slices.Clone(args)
		now[0] = s.now()
		back := []any{"again"}
		for _, v := range g.Grant {
			back = append(back, v)
		}
		return s.passGate(ctx, keys, now, confirmArgs, back)
	}
	confirm := func(ctx context.Context, wroteAfter time.Duration, written bool) error {
		w := "0"
		if written {
			w = "1"
		}
		return gateConfirmScript.Run(ctx, s.rdb, keys[:2], append([]any{g.Grant[4], usCeil(wroteAfter), w}, confirmArgs...), nil)
	}
	return queue.GateAnswer{Again: again, Confirm: confirm}, nil
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
