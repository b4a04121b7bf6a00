package main

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
)

// policiesCommand gives many tenants a policy each through the API, then
// measures admissions to them against admissions to tenants the file alone
// sets, on the same server, round after round.
func policiesCommand() *cobra.Command {
	var server, body, token, store string
	var clients, tenants, rounds, pid int
	var duration time.Duration
	c := &cobra.Command{
		Use:   "policies",
		Short: "Give --tenants tenants a policy each (PUT /v1/tenants/{t}/policy), then compare admissions to them with file-only tenants",
		Long: `PUTs --body as the policy of tenants p0 to p(N-1) from --clients keep-alive
clients and prints how long that took; then runs --rounds rounds, each
admitting single jobs for --duration to tenants p0.. (with a policy) and
f0.. (the file's policy alone), each client taking turns between the two,
so that both see the same moments of the machine (a stall of the store
hits both alike); it prints what an admission costs each, as the ratio of
their mean latencies (above 1: a tenant with a policy costs less). With --pid and --store, prints the server's resident
memory and the store's size before and after the PUTs, per tenant.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := loopbackOnly(server); err != nil {
				return err
			}
			if tenants < 1 || tenants > 1_000_000 || clients < 1 || clients > 4096 || rounds < 1 || rounds > 10 || duration <= 0 || duration > 2*time.Minute {
				return fmt.Errorf("--tenants 1 to 1000000, --clients 1 to 4096, --rounds 1 to 10, --duration up to 2m: load runs are bounded")
			}
			out := cmd.OutOrStdout()
			client := newClient(clients)
			rss0, size0 := rssOf(pid), sizeOf(store)
			took, failed := putPolicies(client, server, token, body, clients, tenants)
			if failed > 0 {
				return fmt.Errorf("%d of %d policies not set", failed, tenants)
			}
			fmt.Fprintf(out, "%d policies set in %v: %.0f/s\n", tenants, took.Round(time.Millisecond), float64(tenants)/took.Seconds())
			if pid > 0 || store != "" {
				rss1, size1 := rssOf(pid), sizeOf(store)
				fmt.Fprintf(out, "resident %d -> %d bytes (%.0f B per tenant); store %d -> %d bytes (%.0f B per tenant)\n",
					rss0, rss1, float64(rss1-rss0)/float64(tenants), size0, size1, float64(size1-size0)/float64(tenants))
			}
			var ratios []string
			for i := 1; i <= rounds; i++ {
				p, f := admitTurns(client, server, clients, tenants, duration)
				p.print(out, fmt.Sprintf("round %d with a policy", i))
				f.print(out, fmt.Sprintf("round %d file only   ", i))
				if p.mean() > 0 {
					ratios = append(ratios, fmt.Sprintf("%.2f", float64(f.mean())/float64(p.mean())))
				}
			}
			fmt.Fprintf(out, "admissions with a policy / file only (inverse mean latency) by round: %s\n", strings.Join(ratios, " / "))
			return nil
		},
	}
	serverFlag(c, &server)
	c.Flags().StringVar(&body, "body", `{"plan":"pro"}`, "the policy each tenant is given")
	c.Flags().StringVar(&token, "token", "", "an admin token, if the server has tokens")
	c.Flags().StringVar(&store, "store", "", "the server's embedded store file, to measure")
	c.Flags().IntVar(&pid, "pid", 0, "the server's process id, to measure its resident memory")
	c.Flags().IntVar(&tenants, "tenants", 100_000, "tenants given a policy (and file-only tenants admitted to)")
	c.Flags().IntVar(&clients, "clients", 64, "concurrent keep-alive clients")
	c.Flags().IntVar(&rounds, "rounds", 3, "rounds of admissions")
	c.Flags().DurationVar(&duration, "duration", 8*time.Second, "how long each half of a round runs (at most 2m)")
	return c
}

// putPolicies PUTs body as the policy of p0..p(n-1); it returns how long
// that took and how many were not set.
func putPolicies(client *http.Client, server, token, body string, clients, n int) (time.Duration, int) {
	var next, failed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				req, _ := http.NewRequest(http.MethodPut, server+"/v1/tenants/p"+strconv.FormatInt(i, 10)+"/policy", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), int(failed.Load())
}

// rssOf is a process's resident memory in bytes (0: unknown).
func rssOf(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// sizeOf is a file's size (0: unknown).
func sizeOf(path string) int64 {
	if path == "" {
		return 0
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// admitTurns posts single jobs from clients goroutines for duration, each
// taking turns between a tenant with a policy (p0..) and one without
// (f0..): the two results, each over the whole duration.
func admitTurns(client *http.Client, server string, clients, tenants int, duration time.Duration) (withPolicy, fileOnly admitResult) {
	var mu sync.Mutex
	res := [2]admitResult{{duration: duration, counts: map[int]int64{}}, {duration: duration, counts: map[int]int64{}}}
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			var lat [2][]time.Duration
			counts := [2]map[int]int64{{}, {}}
			for i := 0; time.Now().Before(deadline); i++ {
				kind := i % 2
				tenant := [2]string{"p", "f"}[kind] + strconv.Itoa(rand.IntN(tenants))
				body := fmt.Sprintf(`{"payload":{"worker":%d,"n":%d,"text":"your code is 123456"}}`, w, i)
				start := time.Now()
				resp, err := client.Post(server+"/v1/tenants/"+tenant+"/jobs", "application/json", strings.NewReader(body))
				if err != nil {
					counts[kind][0]++
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat[kind] = append(lat[kind], time.Since(start))
				counts[kind][min(resp.StatusCode, 599)]++
			}
			mu.Lock()
			defer mu.Unlock()
			for k := range 2 {
				res[k].lat = append(res[k].lat, lat[k]...)
				for code, n := range counts[k] {
					res[k].counts[code] += n
				}
			}
		})
	}
	wg.Wait()
	for k := range 2 {
		slices.Sort(res[k].lat)
	}
	return res[0], res[1]
}

// mean is the mean latency of r's answers.
func (r admitResult) mean() time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	var sum time.Duration
	for _, l := range r.lat {
		sum += l
	}
	return sum / time.Duration(len(r.lat))
}
