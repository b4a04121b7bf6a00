package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// result is one round of one engine.
type result struct {
	phase   string
	writers int
	round   int
	engine  string

	admissions int64
	elapsed    time.Duration
	p50, p99   time.Duration
	cpu        time.Duration // process user+system over the load
	commits    int64         // groups committed (the grouper's engines)
	grouped    int64
	syncs      int64 // fdatasyncs: bbolt's two per commit; pebble's WAL syncs
	size       int64 // the store's bytes after the round
	jobs       int64 // jobs in the store after the round
}

func (r result) rate() float64 { return float64(r.admissions) / r.elapsed.Seconds() }

func (r result) cpuPerAdmission() time.Duration {
	return r.cpu / time.Duration(max(r.admissions, 1))
}

func main() {
	var (
		dirFlag   = flag.String("dir", ".", "where to make the stores' temporary directory (a real disk: not tmpfs)")
		engines   = flag.String("engines", "bbolt,pebble,pebble-group", "engines, alternated in each round: bbolt, pebble (a Sync batch per writer), pebble-group (the store's committer, one Sync batch per group)")
		writers   = flag.String("writers", "16,64,128", "concurrent writers, a list")
		rounds    = flag.Int("rounds", 3, "rounds of each engine per phase and writer count")
		duration  = flag.Duration("duration", 5*time.Second, "length of a round")
		preloadN  = flag.Int("preload", 1_000_000, "jobs written before the second phase (0: no second phase)")
		tenants   = flag.Int("tenants", 1000, "tenants, taken round robin")
		emptyOnly = flag.Bool("empty", true, "run the empty-store phase")
		keep      = flag.Bool("keep", false, "keep the stores' directory")
	)
	flag.Parse()

	names := strings.Split(*engines, ",")
	var counts []int
	for _, w := range strings.Split(*writers, ",") {
		n, err := strconv.Atoi(w)
		if err != nil || n < 1 {
			fatal(fmt.Errorf("-writers: %q", w))
		}
		counts = append(counts, n)
	}
	root, err := os.MkdirTemp(*dirFlag, "engines-bench-")
	if err != nil {
		fatal(err)
	}
	if !*keep {
		cleanup = func() { os.RemoveAll(root) }
		defer cleanup()
	}
	fmt.Printf("# %s, GOMAXPROCS %d, stores in %s, %d tenants, rounds of %v\n", runtime.Version(), runtime.GOMAXPROCS(0), root, *tenants, *duration)
	fmt.Println("phase    writers round engine        adm/s   p50      p99      cpu/adm  adm/commit adm/sync store/job")

	var results []result
	run := func(phase string, w, round int, name, path string, jobs int64) result {
		e, err := open(name, path)
		if err != nil {
			fatal(err)
		}
		r := load(e, w, *tenants, *duration)
		r.phase, r.writers, r.round, r.engine = phase, w, round, name
		r.commits, r.grouped, r.syncs = e.stats()
		if err := e.close(); err != nil {
			fatal(err)
		}
		syscall.Sync() // leave no dirty pages for the next engine's round
		r.size, r.jobs = sizeOf(path), jobs+r.admissions
		results = append(results, r)
		printRow(r)
		return r
	}

	if *emptyOnly {
		for _, w := range counts {
			for round := 1; round <= *rounds; round++ {
				for i := range names {
					name := names[(i+round-1)%len(names)] // each round starts with the next engine
					path := filepath.Join(root, fmt.Sprintf("empty-%s-%d-%d", name, w, round))
					run("empty", w, round, name, path, 0)
					os.RemoveAll(path)
				}
			}
		}
	}
	if *preloadN > 0 {
		jobs := map[string]int64{}
		paths := map[string]string{}
		for _, name := range names {
			paths[name] = filepath.Join(root, "full-"+name)
			e, err := open(name, paths[name])
			if err != nil {
				fatal(err)
			}
			start := time.Now()
			if err := e.preload(*preloadN, *tenants); err != nil {
				fatal(err)
			}
			if err := e.close(); err != nil {
				fatal(err)
			}
			syscall.Sync()
			jobs[name] = int64(*preloadN)
			sz := sizeOf(paths[name])
			fmt.Printf("# preloaded %s with %d jobs in %v: %d bytes, %.0f bytes/job\n", name, *preloadN, time.Since(start).Round(time.Millisecond), sz, float64(sz)/float64(*preloadN))
		}
		phase := fmt.Sprintf("%d", *preloadN)
		for _, w := range counts {
			for round := 1; round <= *rounds; round++ {
				for i := range names {
					name := names[(i+round-1)%len(names)]
					r := run(phase, w, round, name, paths[name], jobs[name])
					jobs[name] = r.jobs
				}
			}
		}
	}
	summary(results, names)
}

func open(name, path string) (engine, error) {
	switch name {
	case "bbolt":
		return openBolt(path)
	case "pebble":
		return openPebble(path, false)
	case "pebble-group":
		return openPebble(path, true)
	}
	return nil, fmt.Errorf("unknown engine %q", name)
}

// load runs w writers for d, each admitting one job at a time round robin
// over the tenants and waiting for it to be durable, and measures the
// admissions, their latencies and the process's CPU over the load.
func load(e engine, w, tenants int, d time.Duration) result {
	runtime.GC()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		lat      = make([][]time.Duration, w)
		failures atomic.Int64
	)
	cpu0 := processCPU()
	start := time.Now()
	deadline := start.Add(d)
	for i := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, 4096)
			for {
				n := next.Add(1)
				a := newAdmission(time.Now(), int(n%int64(tenants)), n)
				t0 := time.Now()
				if err := e.admit(a); err != nil {
					failures.Add(1)
					return
				}
				t1 := time.Now()
				l = append(l, t1.Sub(t0))
				if t1.After(deadline) {
					break
				}
			}
			lat[i] = l
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	if f := failures.Load(); f > 0 {
		fatal(fmt.Errorf("%d admissions failed", f))
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return result{admissions: int64(len(all)), elapsed: elapsed, cpu: cpu, p50: quantile(all, 0.50), p99: quantile(all, 0.99)}
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// processCPU is the user and system time of the whole process (every
// thread: writers, committer, the engine's background work).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func printRow(r result) {
	perCommit, perSync := "-", "-"
	if r.commits > 0 {
		perCommit = fmt.Sprintf("%.1f", float64(r.grouped)/float64(r.commits))
	}
	if r.syncs > 0 {
		perSync = fmt.Sprintf("%.1f", float64(r.admissions)/float64(r.syncs))
	}
	fmt.Printf("%-8s %7d %5d %-12s %7.0f %-8v %-8v %-8v %-10s %-8s %.0f\n", r.phase, r.writers, r.round, r.engine,
		r.rate(), r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.cpuPerAdmission().Round(100*time.Nanosecond),
		perCommit, perSync, float64(r.size)/float64(max(r.jobs, 1)))
}

// summary prints, per phase and writer count, each round's admissions/s
// with its ratio to bbolt's in the same round, and the medians.
func summary(results []result, names []string) {
	type cell struct {
		phase   string
		writers int
	}
	var cells []cell
	by := map[cell]map[string][]result{}
	for _, r := range results {
		c := cell{r.phase, r.writers}
		if by[c] == nil {
			by[c] = map[string][]result{}
			cells = append(cells, c)
		}
		by[c][r.engine] = append(by[c][r.engine], r)
	}
	fmt.Println("\n## admissions/s per round (ratio to bbolt in the same round), median p50/p99, median CPU per admission")
	for _, c := range cells {
		fmt.Printf("\n%s, %d writers\n", c.phase, c.writers)
		base := by[c]["bbolt"]
		for _, name := range names {
			rs := by[c][name]
			var parts []string
			var rates, p50s, p99s, cpus []float64
			for i, r := range rs {
				s := fmt.Sprintf("%.0f", r.rate())
				if name != "bbolt" && i < len(base) {
					s += fmt.Sprintf(" (%.2f)", r.rate()/base[i].rate())
				}
				parts = append(parts, s)
				rates = append(rates, r.rate())
				p50s = append(p50s, float64(r.p50))
				p99s = append(p99s, float64(r.p99))
				cpus = append(cpus, float64(r.cpuPerAdmission()))
			}
			fmt.Printf("  %-12s %s | median %.0f/s, p50 %v, p99 %v, cpu/adm %v\n", name, strings.Join(parts, " / "), median(rates),
				time.Duration(median(p50s)).Round(time.Microsecond), time.Duration(median(p99s)).Round(time.Microsecond),
				time.Duration(median(cpus)).Round(100*time.Nanosecond))
		}
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

// cleanup removes the stores (unless -keep), also when fatal exits.
var cleanup = func() {}

func fatal(err error) {
	cleanup()
	fmt.Fprintln(os.Stderr, "engines:", err)
	os.Exit(1)
}
