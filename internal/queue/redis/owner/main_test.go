package owner

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a Manager started (renewer, balancer, watchdog, drains)
// is gone once Stop returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
