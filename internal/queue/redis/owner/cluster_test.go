package owner

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/testutil"
)

// On a Cluster of three masters every script touches one slot (a
// partition's keys share its tag; the workers' keys theirs): the managers
// share the partitions, spread over the masters, and hand them over with
// fenced writes, as on one Redis.
func TestOnACluster(t *testing.T) {
	testutil.SkipShort(t, "starts a Cluster of redis-servers, which takes seconds")
	t.Parallel()
	e := newClusterEnv(t, 8)
	a, b := e.start("a", nil), e.start("b", nil)
	e.waitSteady("two managers to share the partitions", 10*time.Second, a, b)
	cc := e.rdb.(*goredis.ClusterClient)
	nodes := map[string]int{}
	for p := range e.P {
		node, err := cc.MasterForKey(context.Background(), leaseKey(p))
		if err != nil {
			t.Fatal(err)
		}
		nodes[node.Options().Addr]++
	}
	t.Logf("8 partitions on %d masters: %v", len(nodes), nodes)
	if len(nodes) < 2 {
		t.Errorf("every partition on one master: %v", nodes)
	}
	b.Stop()
	e.waitSteady("a to take b's partitions", 5*time.Second, a)
}
