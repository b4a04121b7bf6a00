package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

// timersCommand measures the machine, not the throttler: how late a Go
// timer wakes here. The dispatcher waits for each send's slot on a timer,
// and a send that wakes late makes the rest of its tenant's queue as late
// (the gate never sends early, so nothing catches up), so this is the floor
// under `loadgen deliver`'s dispatch error. (The gate sleeps the last 2 ms
// of a wait more precisely than a timer: see clock.SleepPrecise.)
func timersCommand() *cobra.Command {
	var goroutines int
	var interval, duration time.Duration
	c := &cobra.Command{
		Use:   "timers",
		Short: "How late timers wake on this machine: the floor under deliver's dispatch error",
		Long: `Starts --goroutines goroutines, each waking on a timer every --interval (spread
evenly over it, as that many tenants' sends are), for --duration, and prints
how late the wake-ups were: p50, p99, max, and how many were later than
1.5 ms and than 5 ms. The defaults wake 500 times a second,
as 100 tenants at 5/s send. Run it beside nothing else to see the machine
alone, or during a deliver run to see it loaded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if goroutines < 1 || goroutines > 10_000 || interval < time.Millisecond || duration <= 0 || duration > 10*time.Minute {
				return fmt.Errorf("--goroutines 1-10000, --interval at least 1ms, --duration up to 10m: runs are bounded")
			}
			timerLateness(cmd.OutOrStdout(), goroutines, interval, duration)
			return nil
		},
	}
	c.Flags().IntVar(&goroutines, "goroutines", 100, "goroutines waking on timers")
	c.Flags().DurationVar(&interval, "interval", 200*time.Millisecond, "each goroutine's time between wake-ups")
	c.Flags().DurationVar(&duration, "duration", 10*time.Second, "how long to measure")
	return c
}

// timerLateness runs the wake-ups and prints their lateness; it returns
// how many it measured.
func timerLateness(out io.Writer, goroutines int, interval, duration time.Duration) int {
	start := time.Now().Add(interval)
	end := start.Add(duration)
	var mu sync.Mutex
	var late []time.Duration
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			var mine []time.Duration
			for slot := start.Add(interval * time.Duration(g) / time.Duration(goroutines)); slot.Before(end); slot = slot.Add(interval) {
				time.Sleep(time.Until(slot))
				mine = append(mine, time.Since(slot))
			}
			mu.Lock()
			late = append(late, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(late)
	n := len(late)
	if n == 0 {
		return 0
	}
	over := func(d time.Duration) int { return n - sort.Search(n, func(i int) bool { return late[i] > d }) }
	fmt.Fprintf(out, "%d wake-ups (%d goroutines every %v for %v): late p50 %v p99 %v max %v; later than 1.5 ms: %d (%.2f%%), than 5 ms: %d (%.2f%%)\n",
		n, goroutines, interval, duration, late[n/2].Round(time.Microsecond), late[n*99/100].Round(time.Microsecond), late[n-1].Round(time.Microsecond),
		over(1500*time.Microsecond), 100*float64(over(1500*time.Microsecond))/float64(n), over(5*time.Millisecond), 100*float64(over(5*time.Millisecond))/float64(n))
	return n
}
