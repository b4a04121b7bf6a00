package queue

import "context"

// sendCheckKey carries a store's last word on a send in a handler's ctx.
type sendCheckKey struct{}

// WithSendCheck is ctx carrying check, which a handler asks right before
// it writes a request (MaySend): a store whose right to send can lapse
// (a Redis partition's owner whose lease ran out) says no there, as late
// as it can be asked.
func WithSendCheck(ctx context.Context, check func() bool) context.Context {
	return context.WithValue(ctx, sendCheckKey{}, check)
}

// MaySend is whether the store that handed over ctx's job still lets it
// be written (true if it set no check). False: write nothing and return
// Released.
func MaySend(ctx context.Context) bool {
	check, _ := ctx.Value(sendCheckKey{}).(func() bool)
	return check == nil || check()
}
