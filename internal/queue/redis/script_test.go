package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/luascript"
)

// pair is a test reply: an integer, then a time.
type pair struct {
	N  int64
	At time.Time
}

func (p *pair) Decode(r *luascript.Reply) {
	p.N = r.Int()
	p.At = r.Time()
}

// A script's reply is read into its struct with every item's type checked:
// a reply of another shape is an error naming the script and the item,
// never a zero read in silence or a panic.
func TestScriptRepliesAreChecked(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	for _, tc := range []struct {
		lua, err string
	}{
		{"return {7, 1000000}", ""},
		{"return {7, 'late'}", "test.lua: its reply: item 2: want an integer, got string late"},
		{"return {7}", "test.lua: its reply: item 2 (an integer): missing"},
		{"return {7, 1, 2}", "test.lua: its reply: 1 items left over"},
		{"return 7", "test.lua: its reply: want an array, got int64 7"},
	} {
		var p pair
		err := newScript("test.lua", tc.lua, false).Run(ctx, rdb, nil, nil, &p)
		switch {
		case tc.err == "" && (err != nil || p.N != 7 || !p.At.Equal(time.Unix(1, 0))):
			t.Errorf("%s: %+v %v", tc.lua, p, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want %q", tc.lua, err, tc.err)
		}
	}
	var l takeoverReply
	err := newScript("test.lua", "return {1000000, 0, {'a', 0, 0, 0, 0}, {'b', 0, 0}}", false).Run(ctx, rdb, nil, nil, &l)
	if err == nil || !strings.Contains(err.Error(), "item 4: item 4 (an integer): missing") {
		t.Errorf("a list of arrays, one short: %v", err)
	}
}
