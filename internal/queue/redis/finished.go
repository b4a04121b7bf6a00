package redis

import (
	"context"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/queue"
)

// finishedChannel is where the processes on one Redis tell each other which
// jobs reached a final state (ids, space-separated): the worker that writes
// it is rarely the API process a client waits on (GET /v1/jobs/{id}?wait).
// A notice is a hint to read the job, never the state itself, so one that
// names a job of another deployment on the same server costs a read.
const finishedChannel = "throttler:finished"

// finishedNotices is the store's side of Store.WatchFinish: its own
// watchers, fed by a subscription to finishedChannel, which starts on the
// first watch. Every write of a final state publishes the job's id in the
// same step (lib.lua's tell_finished, and finishByRule's transaction).
type finishedNotices struct {
	watchers queue.Finishes

	subOnce   sync.Once
	sub       *goredis.PubSub
	closeOnce sync.Once
}

// WatchFinish implements queue.Store. The first watch subscribes
// and waits for Redis to confirm it (a second at most), so that a final
// state written after the caller's next read is not missed.
func (s *Store) WatchFinish(id string) (<-chan struct{}, func()) {
	s.notices.subOnce.Do(func() {
		sub := s.rdb.Subscribe(context.Background(), finishedChannel)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := sub.Receive(ctx); err != nil {
			// Not confirmed yet: go-redis goes on trying; watchers meanwhile
			// fall back on reading the job now and then.
			s.log.Warn("cannot subscribe to jobs' final states yet; ?wait reads jobs again every second meanwhile", "err", err)
		}
		s.notices.sub = sub
		go func() {
			for m := range sub.Channel() {
				for _, id := range strings.Fields(m.Payload) {
					s.notices.watchers.Notify(id)
				}
			}
		}()
	})
	return s.notices.watchers.Watch(id)
}

// closeNotices ends the subscription (once: Close may be called again).
func (s *Store) closeNotices() {
	n := &s.notices
	n.closeOnce.Do(func() {
		n.subOnce.Do(func() {}) // no subscription after Close
		if n.sub != nil {
			_ = n.sub.Close()
		}
	})
}
