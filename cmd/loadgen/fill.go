package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
)

// fillCommand queues many jobs fast (batches) so that admissions and memory
// can be measured at a fill level.
func fillCommand() *cobra.Command {
	var server, pprofURL string
	var jobs, tenants, batch, conc int
	c := &cobra.Command{
		Use:   "fill",
		Short: "Queue --jobs jobs over --tenants tenants with the batch endpoint; print the server's memory per waiting job",
		Long: `Queues --jobs jobs spread over --tenants tenants in batches of --batch, with
--concurrency requests in flight (the tenants must have room: run the server
with a slow rate and a deep queue). With --pprof (the server's
--pprof-listen address) it forces a garbage collection in the server before
and after, reads the Go heap and the resident set from the server's /metrics,
and prints both per job admitted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := loopbackOnly(server); err != nil {
				return err
			}
			if pprofURL != "" {
				if err := loopbackOnly(pprofURL); err != nil {
					return err
				}
			}
			if jobs < 1 || jobs > 5_000_000 || tenants < 1 || batch < 1 || batch > 1000 || conc < 1 || conc > 64 {
				return fmt.Errorf("--jobs 1 to 5,000,000, --batch 1 to 1000, --concurrency 1 to 64: load runs are bounded")
			}
			out := cmd.OutOrStdout()
			client := newClient(conc)
			var before memFigures
			if pprofURL != "" {
				var err error
				if before, err = serverMemory(client, server, pprofURL); err != nil {
					return err
				}
			}
			start := time.Now()
			admitted, refused, err := fill(client, server, jobs, tenants, batch, conc)
			took := time.Since(start)
			fmt.Fprintf(out, "fill: %d admitted, %d refused in %v (%.0f/s)\n", admitted, refused, took.Round(time.Millisecond), float64(admitted)/took.Seconds())
			if err != nil {
				return err
			}
			if pprofURL != "" && admitted > 0 {
				after, err := serverMemory(client, server, pprofURL)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "server after GC: heap %d MB (%+.0f B per job admitted), RSS %d MB (%+.0f B per job admitted)\n",
					after.heap>>20, float64(after.heap-before.heap)/float64(admitted), after.rss>>20, float64(after.rss-before.rss)/float64(admitted))
			}
			return nil
		},
	}
	serverFlag(c, &server)
	c.Flags().StringVar(&pprofURL, "pprof", "", "the server's profile address (throttler serve --pprof-listen), e.g. http://127.0.0.1:6060")
	c.Flags().IntVar(&jobs, "jobs", 100_000, "jobs to queue")
	c.Flags().IntVar(&tenants, "tenants", 1000, "tenants to spread them over")
	c.Flags().IntVar(&batch, "batch", 1000, "jobs per batch request")
	c.Flags().IntVar(&conc, "concurrency", 4, "batch requests in flight")
	return c
}

// fill sends jobs in batches, tenants in turn.
func fill(client *http.Client, server string, jobs, tenants, batch, conc int) (admitted, refused int64, err error) {
	var a, r atomic.Int64
	var firstErr atomic.Value
	next := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range next {
				if err := fillBatch(client, server, n, batch, tenants, &a, &r); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	for n := 0; n*batch < jobs && firstErr.Load() == nil; n++ {
		next <- n
	}
	close(next)
	wg.Wait()
	if e, ok := firstErr.Load().(error); ok {
		err = e
	}
	return a.Load(), r.Load(), err
}

func fillBatch(client *http.Client, server string, n, batch, tenants int, admitted, refused *atomic.Int64) error {
	var b bytes.Buffer
	b.WriteString(`{"jobs":[`)
	for j := range batch {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"payload":{"batch":%d,"n":%d,"text":"your code is 123456"}}`, n, j)
	}
	b.WriteString(`]}`)
	resp, err := client.Post(fmt.Sprintf("%s/v1/tenants/t%d/jobs:batch", server, n%tenants), "application/json", &b)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("batch %d: %s: %s", n, resp.Status, body)
	}
	ok := int64(bytes.Count(body, []byte(`"status":202`)))
	admitted.Add(ok)
	refused.Add(int64(batch) - ok)
	return nil
}

// memFigures is what fill reads of the server's memory.
type memFigures struct{ heap, rss int64 }

// serverMemory forces a collection in the server (the heap profile's gc=1)
// and reads its live heap and resident set from /metrics.
func serverMemory(client *http.Client, server, pprofURL string) (memFigures, error) {
	resp, err := client.Get(pprofURL + "/debug/pprof/heap?gc=1")
	if err != nil {
		return memFigures{}, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp, err = client.Get(server + "/metrics")
	if err != nil {
		return memFigures{}, err
	}
	defer resp.Body.Close()
	var m memFigures
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch name {
		case "go_memstats_heap_alloc_bytes":
			m.heap = int64(v)
		case "process_resident_memory_bytes":
			m.rss = int64(v)
		}
	}
	if m.heap == 0 {
		return m, fmt.Errorf("%s/metrics has no go_memstats_heap_alloc_bytes", server)
	}
	return m, sc.Err()
}
