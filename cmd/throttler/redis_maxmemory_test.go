package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// DESIGN.md 6c on Redis: a Redis at its maxmemory (noeviction) refuses
// writes, and admission answers 507 store_full with Retry-After and a
// message that names maxmemory, not 503 "cannot be reached" (Redis
// answers; a client retrying at once would only be refused again). What
// was accepted before is kept and delivered, and admissions come back by
// themselves once Redis has room (maxmemory raised). Before, every
// admission was 503 store_unavailable.
func TestRedisMaxmemoryRefusesAdmissions507(t *testing.T) {
	testutil.SkipShort(t, "process test: throttler processes on a redis-server at its maxmemory")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	srv := redistest.Start(t, false)
	// A lease long enough that a busy machine (the race detector, other
	// tests) loses none: a lost one sends jobs again, with their key, and
	// this test counts every arrival. The Redis has seen its partitions,
	// so none is held vacant for that lease first.
	srv.SeenPartitions(t, 4)
	ds := downstreamtest.New(t)
	file := filepath.Join(t.TempDir(), "config.toml")
	cfg := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[store]\nbackend = \"redis\"\nredis_url = %q\nredis_lease = \"5s\"\nredis_partitions = 4\n"+
		"[downstreams.test]\nurl = %q\ntimeout = \"2s\"\n[tenant_defaults]\nrate = \"5/s\"\ncapacity = 50\n", srv.URL(), ds.URL+"/send")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, file)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	ctx := context.Background()

	accepted := map[string]bool{}
	post := func() (int, http.Header, map[string]any) {
		st, h, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", `{"payload":{"n":1}}`)
		if st == http.StatusAccepted {
			accepted[body["id"].(string)] = true
		}
		return st, h, body
	}
	// A backlog of 2 s at 5/s, so jobs wait in Redis through the refusal.
	for range 10 {
		if st, _, body := post(); st != http.StatusAccepted {
			t.Fatalf("enqueue before maxmemory: %d %v", st, body)
		}
	}

	// Redis full: maxmemory below what it holds, nothing to evict.
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		st, h, body := post()
		msg, _ := body["message"].(string)
		if st != http.StatusInsufficientStorage || body["error"] != "store_full" || !strings.Contains(msg, "maxmemory") || h.Get("Retry-After") == "" {
			t.Fatalf("enqueue %d on a Redis at its maxmemory: %d %v (Retry-After %q), want 507 store_full naming maxmemory, with Retry-After", i, st, body, h.Get("Retry-After"))
		}
		if i == 0 {
			t.Logf("answered %d, Retry-After %s: %s", st, h.Get("Retry-After"), msg)
		}
	}
	// Reads go on: a job accepted before is still there.
	for id := range accepted {
		if st, _, body := call(t, "GET", p.base+"/v1/jobs/"+id, ""); st != http.StatusOK {
			t.Fatalf("GET a job accepted before, Redis at its maxmemory: %d %v", st, body)
		}
		break
	}

	// Room again: admissions come back with no restart.
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "an admission accepted once maxmemory is raised", func() bool {
		st, _, _ := post()
		return st == http.StatusAccepted
	})
	for range 3 {
		if st, _, body := post(); st != http.StatusAccepted {
			t.Fatalf("enqueue after maxmemory raised: %d %v", st, body)
		}
	}

	// Nothing lost: every job accepted arrives, once, at the tenant's rate.
	testutil.WaitFor(t, 20*time.Second, "every accepted job delivered", func() bool {
		keys := ds.Keys()
		for id := range accepted {
			if keys[id] == 0 {
				return false
			}
		}
		return true
	})
	for key, n := range ds.Keys() {
		if !accepted[key] {
			t.Errorf("key %s arrived but was never accepted", key)
		}
		if n != 1 {
			t.Errorf("key %s arrived %d times", key, n)
		}
	}
	downstreamtest.CheckWindows(t, ds.All(), 200*time.Millisecond, 1)
	t.Logf("%d jobs accepted around the refusal, all delivered", len(accepted))
}
