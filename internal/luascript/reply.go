package luascript

import (
	"fmt"
	"time"
)

// Reply reads a script's reply (an array) item by item, checking each
// one's type. The first error sticks: every read after it gives zero, and
// DecodeList returns it.
type Reply struct {
	items []any
	next  int
	err   error
}

// DecodeList reads v, an array, with decode, which must read every item:
// items left over are an error.
func DecodeList(v any, decode func(*Reply)) error {
	l, ok := v.([]any)
	if !ok {
		return fmt.Errorf("want an array, got %T %v", v, v)
	}
	r := &Reply{items: l}
	decode(r)
	if r.err == nil && r.next < len(r.items) {
		r.err = fmt.Errorf("%d items left over", len(r.items)-r.next)
	}
	return r.err
}

// Err is the reply's first error, nil if none yet.
func (r *Reply) Err() error { return r.err }

// Fail sets err as the reply's error (a value the struct cannot take, an
// unknown code), unless it has one already.
func (r *Reply) Fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// More is whether items are left to read (and no error yet): for a reply
// whose last items are optional.
func (r *Reply) More() bool { return r.err == nil && r.next < len(r.items) }

// item is the next item, or nil and the error set if there is none.
func (r *Reply) item(want string) any {
	if r.err != nil {
		return nil
	}
	if r.next >= len(r.items) {
		r.err = fmt.Errorf("item %d (%s): missing", r.next+1, want)
		return nil
	}
	r.next++
	return r.items[r.next-1]
}

// wrong sets the error of an item v that is not what was wanted.
func (r *Reply) wrong(want string, v any) {
	r.Fail(fmt.Errorf("item %d: want %s, got %T %v", r.next, want, v, v))
}

// read reads the next item as a T, want's type.
func read[T any](r *Reply, want string) T {
	v := r.item(want)
	x, ok := v.(T)
	if !ok {
		r.wrong(want, v)
	}
	return x
}

// Int reads an integer.
func (r *Reply) Int() int64 { return read[int64](r, "an integer") }

// Str reads a string.
func (r *Reply) Str() string { return read[string](r, "a string") }

// Flag reads an integer, 1 for true (any other value is false).
func (r *Reply) Flag() bool { return r.Int() == 1 }

// Time reads a time in microseconds since 1970, 0 for the zero time.
func (r *Reply) Time() time.Time {
	if us := r.Int(); us != 0 {
		return time.UnixMicro(us)
	}
	return time.Time{}
}

// Duration reads a duration in microseconds.
func (r *Reply) Duration() time.Duration { return time.Duration(r.Int()) * time.Microsecond }

// Hash reads the rest of the reply as field-value pairs (a hash).
func (r *Reply) Hash() map[string]string {
	h := map[string]string{}
	for r.More() {
		h[r.Str()] = r.Str()
	}
	return h
}

// Rest reads the rest of the reply as strings.
func (r *Reply) Rest() []string {
	var l []string
	for r.More() {
		l = append(l, r.Str())
	}
	return l
}

// Each reads the rest of the reply as arrays, each read by decode (which
// must read all of its items).
func (r *Reply) Each(decode func(*Reply)) {
	for r.More() {
		if err := DecodeList(r.item("an array"), decode); err != nil {
			r.err = fmt.Errorf("item %d: %w", r.next, err)
		}
	}
}
