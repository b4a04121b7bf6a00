package owner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

func testClient(t *testing.T) *goredis.Client {
	srv := redistest.Start(t, false)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func acquire(t *testing.T, rdb *goredis.Client, p int, worker string, lease time.Duration) acquireReply {
	t.Helper()
	var r acquireReply
	if err := acquireScript.Run(context.Background(), rdb, []string{leaseKey(p), epochKey(p)}, []any{worker, ms(lease)}, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func renewOf(t *testing.T, rdb *goredis.Client, sc *luascript.Script, p int, tok string, args ...any) bool {
	t.Helper()
	var r renewReply
	if err := sc.Run(context.Background(), rdb, []string{leaseKey(p)}, append([]any{tok}, args...), &r); err != nil {
		t.Fatal(err)
	}
	return r.OK
}

// The lease scripts one step at a time: a partition new to Redis is held
// vacant for one lease, then taken with SET NX and a new epoch; renewed
// and released only by compare; taken over with the next epoch once it
// lapsed; and a fenced write is refused, whole, to everyone but the
// holder of the lease in its epoch.
func TestLeaseScripts(t *testing.T) {
	t.Parallel()
	rdb := testClient(t)
	ctx := context.Background()
	const lease = 150 * time.Millisecond

	before := time.Now().UnixMilli()
	r := acquire(t, rdb, 3, "a", lease)
	if r.Code != acquireVacated || r.Epoch < before-1000 || r.Epoch > time.Now().UnixMilli()+1000 {
		t.Fatalf("first acquire of a partition new to Redis: %+v, want vacated with an epoch seeded from the clock (ms)", r)
	}
	seed := r.Epoch
	if r := acquire(t, rdb, 3, "b", lease); r.Code != acquireHeld || r.Holder != "" {
		t.Fatalf("acquire while vacant: %+v, want held by the vacancy", r)
	}
	testutil.WaitFor(t, 2*time.Second, "the vacancy to end", func() bool { r = acquire(t, rdb, 3, "a", lease); return r.Code == acquireTaken })
	if r.Epoch <= seed {
		t.Fatalf("epoch %d, want past the seed %d", r.Epoch, seed)
	}
	a := Fence{Partition: 3, Worker: "a", Epoch: r.Epoch}
	if r := acquire(t, rdb, 3, "b", lease); r.Code != acquireHeld || r.Holder != a.Token() {
		t.Fatalf("acquire of a held partition: %+v, want held by %s", r, a.Token())
	}

	stranger := Fence{Partition: 3, Worker: "b", Epoch: a.Epoch}
	if renewOf(t, rdb, renewScript, 3, stranger.Token(), ms(time.Minute)) {
		t.Fatal("renewed by another worker's token")
	}
	if !renewOf(t, rdb, renewScript, 3, a.Token(), ms(time.Minute)) {
		t.Fatal("not renewed by its owner")
	}
	if d := rdb.PTTL(ctx, leaseKey(3)).Val(); d < 50*time.Second {
		t.Fatalf("renewed lease has %v left, want about a minute", d)
	}

	outcomes := KeyPrefix(3) + "outcomes"
	if n, err := a.Run(ctx, rdb, countScript, []string{outcomes}); err != nil || n != int64(1) {
		t.Fatalf("the owner's fenced write: %v %v", n, err)
	}
	_, err := stranger.Run(ctx, rdb, countScript, []string{outcomes})
	var fe *FencedError
	if !errors.Is(err, ErrFenced) || !errors.As(err, &fe) || fe.Holder != a.Token() || fe.Partition != 3 {
		t.Fatalf("a stranger's fenced write: %v, want a *FencedError naming the holder %s", err, a.Token())
	}

	if renewOf(t, rdb, releaseScript, 3, stranger.Token()) {
		t.Fatal("released by another worker's token")
	}
	if !renewOf(t, rdb, releaseScript, 3, a.Token()) || rdb.Exists(ctx, leaseKey(3)).Val() != 0 {
		t.Fatal("not released by its owner")
	}
	if _, err := a.Run(ctx, rdb, countScript, []string{outcomes}); !errors.Is(err, ErrFenced) {
		t.Fatalf("a write after the release: %v, want refused", err)
	}

	// Taken over (no vacancy now: the epoch key stays), and lapsed.
	r = acquire(t, rdb, 3, "b", lease)
	b := Fence{Partition: 3, Worker: "b", Epoch: r.Epoch}
	if r.Code != acquireTaken || r.Epoch <= a.Epoch {
		t.Fatalf("takeover: %+v, want taken in an epoch past %d", r, a.Epoch)
	}
	if _, err := a.Run(ctx, rdb, countScript, []string{outcomes}); !errors.As(err, &fe) || fe.Holder != b.Token() {
		t.Fatalf("the old owner's write after the takeover: %v, want refused, naming %s", err, b.Token())
	}
	if n, _ := rdb.Get(ctx, outcomes).Int(); n != 1 {
		t.Fatalf("the refused writes wrote: count %d, want 1", n)
	}
	testutil.WaitFor(t, 2*time.Second, "b's lease to lapse", func() bool { return rdb.Exists(ctx, leaseKey(3)).Val() == 0 })
	if _, err := b.Run(ctx, rdb, countScript, []string{outcomes}); !errors.As(err, &fe) || fe.Holder != "" {
		t.Fatalf("a write after its lease lapsed, nobody holding it: %v, want refused", err)
	}
	r = acquire(t, rdb, 3, "a", lease)
	if r.Code != acquireTaken || r.Epoch <= b.Epoch {
		t.Fatalf("after the lapse: %+v, want taken in an epoch past %d", r, b.Epoch)
	}
	leases, err := ReadLeases(ctx, rdb, 4)
	if err != nil || !leases[0].Free() || leases[3].Worker != "a" || leases[3].Epoch != r.Epoch || leases[3].TTL <= 0 {
		t.Fatalf("ReadLeases: %+v %v", leases, err)
	}
}

// An acquisition whose INCR Redis lost (appendfsync everysec, killed
// within the second) does not hand its epoch out again: a new epoch is
// never below the server's clock, which has moved on since (a busy CI run
// of TestRedisRestart saw "partition 1: epoch X after epoch X").
func TestLostEpochIsNotHandedOutAgain(t *testing.T) {
	t.Parallel()
	rdb := testClient(t)
	ctx := context.Background()
	const lease = 100 * time.Millisecond

	if r := acquire(t, rdb, 5, "a", lease); r.Code != acquireVacated {
		t.Fatalf("first acquire: %+v, want vacated", r)
	}
	seed := rdb.Get(ctx, epochKey(5)).Val()
	var first acquireReply
	testutil.WaitFor(t, 2*time.Second, "the vacancy to end", func() bool { first = acquire(t, rdb, 5, "a", lease); return first.Code == acquireTaken })
	// What a restart from an AOF without the acquisition leaves: the epoch
	// key as it was before, and no lease.
	if err := rdb.Set(ctx, epochKey(5), seed, 0).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, leaseKey(5))
	testutil.WaitFor(t, 2*time.Second, "the server's clock to pass the lost epoch", func() bool {
		now, err := rdb.Time(ctx).Result()
		return err == nil && now.UnixMilli() > first.Epoch
	})
	if r := acquire(t, rdb, 5, "b", lease); r.Code != acquireTaken || r.Epoch <= first.Epoch {
		t.Fatalf("acquire after the loss: %+v, want an epoch past the lost %d", r, first.Epoch)
	}
}

// A script's reply is read into its struct with every item's type
// checked: a reply of another shape is an error naming the script and
// the item, never a zero read in silence.
func TestScriptRepliesAreChecked(t *testing.T) {
	t.Parallel()
	rdb := testClient(t)
	for _, tc := range []struct{ lua, err string }{
		{"return {1, 7, ''}", ""},
		{"return {1, 'x', ''}", "test.lua: its reply: item 2: want an integer, got string x"},
		{"return {1, 7}", "test.lua: its reply: item 3 (a string): missing"},
		{"return {1, 7, '', 4}", "test.lua: its reply: 1 items left over"},
		{"return {9, 7, ''}", "test.lua: its reply: unknown code 9"},
		{"return 7", "test.lua: its reply: want an array, got int64 7"},
	} {
		var r acquireReply
		err := luascript.New("test.lua", tc.lua).Run(context.Background(), rdb, nil, nil, &r)
		switch {
		case tc.err == "" && (err != nil || r.Code != 1 || r.Epoch != 7):
			t.Errorf("%s: %+v %v", tc.lua, r, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want %q", tc.lua, err, tc.err)
		}
	}
}

// PartitionOf is FNV-1a and stable (these values must never change: they place
// tenants in Redis) and spreads tenants evenly; each partition has a tag
// of its own, and every key of a partition carries it.
func TestPartitionOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tenant  string
		p, want int
	}{{"acme", 32, 15}, {"", 32, 5}, {"tenant-1", 32, 11}, {"+4915112345678", 64, 50}, {"acme", 7, 5}} { // FNV-1a, checked against a reference implementation
		if got := PartitionOf(tc.tenant, tc.p); got != tc.want {
			t.Errorf("PartitionOf(%q, %d) = %d, want %d", tc.tenant, tc.p, got, tc.want)
		}
	}
	const P, n = 32, 32000
	counts := make([]int, P)
	for i := range n {
		counts[PartitionOf(fmt.Sprintf("tenant-%d", i), P)]++
	}
	for p, c := range counts {
		if c < n/P*8/10 || c > n/P*12/10 {
			t.Errorf("partition %d has %d of %d tenants, want about %d", p, c, n, n/P)
		}
	}
	tags := map[string]bool{}
	for p := range 100 {
		tag := "{" + Tag(p) + "}"
		if tags[tag] {
			t.Fatalf("tag %s twice", tag)
		}
		tags[tag] = true
		for _, k := range []string{leaseKey(p), epochKey(p), KeyPrefix(p) + "x", (Fence{Partition: p}).Key()} {
			if strings.Count(k, "{") != 1 || !strings.Contains(k, tag) {
				t.Errorf("key %s of partition %d: want its one hash tag %s", k, p, tag)
			}
		}
	}
}
