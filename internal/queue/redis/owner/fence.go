package owner

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// FenceLua is the fence, to put in front of the Lua of every script that
// writes for an owner (FencedScript does). It takes KEYS[1], the
// partition's lease (Fence.Key), and ARGV[1], the owner's token
// (Fence.Token); the script's own keys and arguments start at KEYS[2] and
// ARGV[2]. It refuses the whole script, before anything is written, with
// the error reply "FENCED ..." unless the lease holds that token. See
// fence.lua.
//
//go:embed fence.lua
var FenceLua string

// FencedScript is a script of src with the fence in front of it.
func FencedScript(src string) *goredis.Script { return goredis.NewScript(FenceLua + src) }

// ErrFenced is a fenced write refused: the writer no longer holds the
// partition in its epoch.
var ErrFenced = errors.New("owner: write refused: the partition's lease is not the writer's (stale owner)")

// FencedError is a fenced write refused, with what the lease held
// instead ("" for nothing, or held vacant). errors.Is(err, ErrFenced).
type FencedError struct {
	Partition int
	Epoch     int64  // the writer's
	Holder    string // the lease's value when refused
}

func (e *FencedError) Error() string {
	holder := e.Holder
	if holder == "" {
		holder = "nobody"
	}
	return fmt.Sprintf("owner: write for partition %d in epoch %d refused: the lease is held by %s (stale owner)", e.Partition, e.Epoch, holder)
}

func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// Fence is what an owner's writes carry: the partition and the tenure
// they are made in (Manager.Fence gives it while the tenure lasts).
type Fence struct {
	Partition int
	Worker    string
	Epoch     int64
}

// Key is KEYS[1] of a fenced script: the partition's lease.
func (f Fence) Key() string { return leaseKey(f.Partition) }

// Token is ARGV[1] of a fenced script: the value the lease must hold.
func (f Fence) Token() string { return token(f.Worker, f.Epoch) }

// Keys is keys with the fence's key in front (KEYS of a fenced script).
func (f Fence) Keys(keys ...string) []string { return append([]string{f.Key()}, keys...) }

// Args is args with the fence's token in front (ARGV of a fenced script).
func (f Fence) Args(args ...any) []any { return append([]any{f.Token()}, args...) }

// Run runs sc, a FencedScript, with the fence's key and token in front of
// keys and args. A refused write is a *FencedError; other errors are
// go-redis's.
func (f Fence) Run(ctx context.Context, rdb goredis.Scripter, sc *goredis.Script, keys []string, args ...any) (any, error) {
	v, err := sc.Run(ctx, rdb, f.Keys(keys...), f.Args(args...)...).Result()
	return v, f.Err(err)
}

// Err turns a fenced script's refusal into a *FencedError (other errors
// and nil as they are): for callers that run fenced scripts their own way
// (in a pipeline, or through a helper of their own).
func (f Fence) Err(err error) error {
	var rerr goredis.Error
	if !goredis.HasErrorPrefix(err, "FENCED") || !errors.As(err, &rerr) {
		return err
	}
	msg := strings.TrimPrefix(rerr.Error(), "ERR ")
	holder := strings.TrimSpace(strings.TrimPrefix(msg, "FENCED"))
	return &FencedError{Partition: f.Partition, Epoch: f.Epoch, Holder: holder}
}
