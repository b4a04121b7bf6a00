package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress shows how a run goes on stderr: a bar redrawn in place on a
// terminal, a plain line every second otherwise.
type progress struct {
	mode  string // bar, lines or none
	w     io.Writer
	start time.Time

	mu    sync.Mutex
	st    progressState
	stop  chan struct{}
	ended sync.WaitGroup
}

type progressState struct {
	phase              string // sending, delivering
	total              int
	accepted, rejected int
	retrying           int
	waiting            bool
	delivered, failed  int
	lastErr            string
}

func newProgress(mode string, w io.Writer, total int) *progress {
	if mode == "auto" {
		mode = "lines"
		if f, ok := w.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				mode = "bar"
			}
		}
	}
	p := &progress{mode: mode, w: w, start: time.Now(), st: progressState{phase: "sending", total: total}, stop: make(chan struct{})}
	if mode == "bar" || mode == "lines" {
		every := time.Second
		if mode == "bar" {
			every = 200 * time.Millisecond
		}
		p.ended.Add(1)
		go func() {
			defer p.ended.Done()
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-p.stop:
					return
				case <-t.C:
					p.draw(false)
				}
			}
		}()
	}
	return p
}

func (p *progress) set(f func(*progressState)) {
	p.mu.Lock()
	f(&p.st)
	p.mu.Unlock()
}

func (p *progress) done() {
	if p.mode != "bar" && p.mode != "lines" {
		return
	}
	close(p.stop)
	p.ended.Wait()
	p.draw(true)
}

func (p *progress) draw(last bool) {
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	elapsed := time.Since(p.start)
	var line string
	if st.phase == "delivering" {
		line = fmt.Sprintf("delivered %d/%d, failed %d", st.delivered, st.total, st.failed)
	} else {
		rate := float64(st.accepted) / max(elapsed.Seconds(), 0.001)
		eta := "-"
		if left := st.total - st.accepted - st.rejected; rate > 0 && left > 0 {
			eta = (time.Duration(float64(left) / rate * float64(time.Second))).Round(time.Second).String()
		}
		line = fmt.Sprintf("accepted %d/%d, refused %d, retrying %d, %.1f/s, ETA %s", st.accepted, st.total, st.rejected, st.retrying, rate, eta)
		if st.waiting {
			line += " (waiting for Retry-After)"
		}
		if st.lastErr != "" {
			line += "; last error: " + st.lastErr
		}
	}
	if p.mode == "bar" {
		const width = 24
		done := st.accepted + st.rejected
		if st.phase == "delivering" {
			done = st.delivered + st.failed
		}
		filled := 0
		if st.total > 0 {
			filled = min(width, done*width/st.total)
		}
		bar := "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "] "
		end := ""
		if last {
			end = "\n"
		}
		fmt.Fprintf(p.w, "\r\x1b[K%s%s%s", bar, line, end)
		return
	}
	fmt.Fprintln(p.w, line)
}
