package redis

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a Consume started (asynq's servers, the renewer, the
// recoverer, the sweeper) is gone once it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
