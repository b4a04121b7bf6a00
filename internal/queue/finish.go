package queue

import "sync"

// Finishes is the watchers of jobs' final states in one process. A store
// calls Notify once a job's final state is durable (or it heard so from
// another process); a watch costs nothing while nobody waits.
type Finishes struct {
	mu       sync.Mutex
	watchers map[string]map[chan struct{}]struct{}
}

// Watch is Store.WatchFinish.
func (f *Finishes) Watch(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	if f.watchers == nil {
		f.watchers = map[string]map[chan struct{}]struct{}{}
	}
	w := f.watchers[id]
	if w == nil {
		w = map[chan struct{}]struct{}{}
		f.watchers[id] = w
	}
	w[ch] = struct{}{}
	f.mu.Unlock()
	return ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if w, ok := f.watchers[id]; ok {
			delete(w, ch)
			if len(w) == 0 {
				delete(f.watchers, id)
			}
		}
	}
}

// Notify wakes every watcher of job id.
func (f *Finishes) Notify(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.watchers[id] {
		close(ch)
	}
	delete(f.watchers, id)
}
