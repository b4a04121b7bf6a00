package luascript

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/redistest"
)

// sample is a test reply: an integer, a time, a duration, a flag, a
// string, then a hash.
type sample struct {
	N    int64
	At   time.Time
	Wait time.Duration
	OK   bool
	S    string
	H    map[string]string
}

func (s *sample) Decode(r *Reply) {
	s.N = r.Int()
	s.At = r.Time()
	s.Wait = r.Duration()
	s.OK = r.Flag()
	s.S = r.Str()
	s.H = r.Hash()
	if s.N > 7 {
		r.Fail(errors.New("unknown code"))
	}
}

// Every item's type is checked, and the first error sticks: a reply of
// another shape is an error naming the item, never a zero read in
// silence or a panic.
func TestDecodeListChecksEveryItem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reply any
		err   string
	}{
		{[]any{int64(7), int64(1_000_000), int64(1500), int64(1), "x", "f", "v"}, ""},
		{[]any{int64(7), int64(0), int64(0), int64(0), ""}, ""},
		{[]any{int64(7), "late", int64(0), int64(0), ""}, "item 2: want an integer, got string late"},
		{[]any{int64(7), int64(0)}, "item 3 (an integer): missing"},
		{[]any{int64(7), int64(0), int64(0), int64(0), "", "f"}, "item 7 (a string): missing"},
		{[]any{int64(9), int64(0), int64(0), int64(0), ""}, "unknown code"},
		{[]any{int64(9), "x"}, "item 2: want an integer, got string x"}, // the first error sticks
		{int64(7), "want an array, got int64 7"},
	} {
		var s sample
		err := DecodeList(tc.reply, s.Decode)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.reply, err)
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("%v: %v, want %q", tc.reply, err, tc.err)
		}
	}
	var s sample
	if err := DecodeList([]any{int64(7), int64(1_000_000), int64(1500), int64(1), "x", "f", "v"}, s.Decode); err != nil ||
		!s.At.Equal(time.Unix(1, 0)) || s.Wait != 1500*time.Microsecond || !s.OK || s.S != "x" || s.H["f"] != "v" {
		t.Errorf("decoded %+v %v", s, err)
	}
	if err := DecodeList([]any{int64(7), int64(0), int64(0), int64(0), ""}, s.Decode); err != nil || !s.At.IsZero() || s.OK {
		t.Errorf("0 is the zero time: %+v %v", s, err)
	}
}

// lists is a reply of arrays of strings.
type lists [][]string

func (l *lists) Decode(r *Reply) {
	r.Each(func(r *Reply) { *l = append(*l, r.Rest()) })
}

func TestEachAndRest(t *testing.T) {
	t.Parallel()
	var l lists
	if err := DecodeList([]any{[]any{"a", "b"}, []any{}, []any{"c"}}, l.Decode); err != nil || len(l) != 3 || l[0][1] != "b" || l[2][0] != "c" {
		t.Errorf("%v %v", l, err)
	}
	l = nil
	if err := DecodeList([]any{[]any{"a"}, []any{"b", int64(1)}}, l.Decode); err == nil || err.Error() != "item 2: item 2: want a string, got int64 1" {
		t.Errorf("an array with a wrong item: %v", err)
	}
	if err := DecodeList([]any{"a"}, l.Decode); err == nil || err.Error() != "item 1: want an array, got string a" {
		t.Errorf("an item not an array: %v", err)
	}
}

// code is a reply of one integer.
type code struct{ N int64 }

func (c *code) Decode(r *Reply) { c.N = r.Int() }

// Against a real Redis: Run and RunInt name the script in a reply's
// error; a script that cannot run is queue.ErrUnavailable; RunEach (and
// RunEachInto) runs a batch in one pipeline, loading the script again
// where Redis lost it.
func TestRunAgainstRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, false)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()

	var c code
	if err := New("ok.lua", "return {tonumber(ARGV[1])}").Run(ctx, rdb, nil, []any{7}, &c); err != nil || c.N != 7 {
		t.Errorf("Run: %+v %v", c, err)
	}
	if err := New("ok.lua", "return 1").Run(ctx, rdb, nil, nil, nil); err != nil {
		t.Errorf("Run with no decoder: %v", err)
	}
	if err := New("short.lua", "return {}").Run(ctx, rdb, nil, nil, &c); err == nil || err.Error() != "short.lua: its reply: item 1 (an integer): missing" {
		t.Errorf("a short reply: %v", err)
	}
	if n, err := New("int.lua", "return 3").RunInt(ctx, rdb, nil, nil); err != nil || n != 3 {
		t.Errorf("RunInt: %d %v", n, err)
	}
	if _, err := New("int.lua", "return 'x'").RunInt(ctx, rdb, nil, nil); err == nil || err.Error() != "int.lua: its reply: want an integer, got string x" {
		t.Errorf("RunInt of a string: %v", err)
	}
	if err := New("bad.lua", "return redis.call('NOSUCHCOMMAND')").Run(ctx, rdb, nil, nil, nil); !errors.Is(err, queue.ErrUnavailable) {
		t.Errorf("a script that fails: %v, want ErrUnavailable", err)
	}

	sc := New("each.lua", "return {tonumber(ARGV[1]) * 2}")
	for round := range 2 { // the first round has never loaded it; the second after a flush
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		calls := []Call{{Args: []any{1}}, {Args: []any{2}}, {Args: []any{"x"}}}
		got := make([]code, len(calls))
		errs := sc.RunEach(ctx, rdb, calls, []Decoder{&got[0], &got[1], &got[2]})
		if errs[0] != nil || errs[1] != nil || got[0].N != 2 || got[1].N != 4 {
			t.Errorf("round %d: %+v %v", round, got, errs)
		}
		if !errors.Is(errs[2], queue.ErrUnavailable) {
			t.Errorf("round %d: a call that fails: %v, want ErrUnavailable", round, errs[2])
		}
	}
	if got, errs := RunEachInto[code](ctx, sc, rdb, []Call{{Args: []any{3}}, {Args: []any{"x"}}}); errs[0] != nil || got[0].N != 6 || !errors.Is(errs[1], queue.ErrUnavailable) {
		t.Errorf("RunEachInto: %+v %v", got, errs)
	}

	srv.Kill()
	if err := New("ok.lua", "return 1").Run(ctx, rdb, nil, nil, nil); !errors.Is(err, queue.ErrUnavailable) {
		t.Errorf("Redis away: %v, want ErrUnavailable", err)
	}
}
