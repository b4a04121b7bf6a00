package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/simulate"
	"github.com/throttler-dev/throttler/internal/testutil"
)

func TestSimulateTables(t *testing.T) {
	t.Parallel()
	for _, sc := range []string{"window-edge", "burst", "retry-storm"} {
		out, errOut, err := runCLI(t, nil, "simulate", "--scenario", sc)
		if err != nil {
			t.Fatalf("%s: %v %s", sc, err, errOut)
		}
		golden(t, "simulate-"+sc+".golden", out)
	}
	out, _, err := runCLI(t, nil, "simulate", "--scenario", "retry-storm", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []struct {
			Algorithm string `json:"algorithm"`
			Attempts  int    `json:"attempts"`
			Honour    int    `json:"attempts_honouring_retry_after"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Results) != 5 {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	for _, r := range doc.Results {
		if r.Honour == 0 || r.Attempts <= r.Honour {
			t.Fatalf("%+v", r)
		}
	}
}

func TestSimulateInputErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	os.WriteFile(bad, []byte("0\n0.5\nsoon\n"), 0o600)
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"simulate"}, "--trace FILE or --scenario"},
		{[]string{"simulate", "--scenario", "tsunami"}, "unknown scenario"},
		{[]string{"simulate", "--trace", bad}, "line 3"},
		{[]string{"simulate", "--trace", filepath.Join(dir, "none.csv")}, "no such file"},
		{[]string{"simulate", "--scenario", "burst", "--rate", "fast"}, "--rate"},
		{[]string{"simulate", "--scenario", "burst", "--tenant", "x"}, "go together"},
	} {
		_, errOut, err := runCLI(t, nil, c.args...)
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(errOut, c.msg) {
			t.Fatalf("%v: err %v, stderr %q; want exit 2 saying %q", c.args, err, errOut, c.msg)
		}
	}
}

// --svg draws valid XML with a lane per algorithm, that a browser renders.
func TestSimulateSVG(t *testing.T) {
	testutil.SkipShort(t, "browser test: headless Chromium")
	dir := os.Getenv("THROTTLER_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	os.MkdirAll(dir, 0o755)
	svg := filepath.Join(dir, "simulate-window-edge.svg")
	if _, errOut, err := runCLI(t, nil, "simulate", "--scenario", "window-edge", "--svg", svg); err != nil {
		t.Fatal(err, errOut)
	}
	raw, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(raw))
	lanes := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not valid XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "g" {
			lanes++
		}
	}
	if lanes != 5 {
		t.Fatalf("%d lanes, want 5", lanes)
	}
	bin := chromium(t)
	shot := filepath.Join(dir, "simulate-window-edge.png")
	headless(t, bin, "file://"+svg, "--screenshot="+shot, "--window-size=1000,760", "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) || len(png) < 10_000 {
		t.Fatalf("screenshot %s: %v (%d bytes)", shot, err, len(png))
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
}

// The simulator predicts the service: an arrival trace replayed against a
// real server (embedded store, real clock) gets the decisions `simulate
// --config` gives for the arrival times the server decided as of (each
// arrival plus the start lag the server added to it then), apart from
// arrivals within a few milliseconds of a decision boundary.
func TestSimulatorAgreesWithTheService(t *testing.T) {
	ds := downstreamtest.New(t)
	// lag-probe is always prompt: its answer's expected delay is the
	// start lag the service adds to an arrival at that moment.
	const tenantCfg = "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 5\nburst = 2\n[tenants.lag-probe]\nrate = \"1000/s\"\nburst = 100\ncapacity = 0\n"
	file := writeConfig(t, tenantCfg, ds)
	base := startServer(t, file)

	// Bursts and quiet spells: some jobs wait, some are refused.
	rng := rand.New(rand.NewPCG(7, 7))
	var plan []time.Duration
	at := 50 * time.Millisecond
	for len(plan) < 60 {
		if rng.IntN(4) == 0 {
			for range 6 {
				plan = append(plan, at)
			}
		}
		plan = append(plan, at)
		at += time.Duration(rng.IntN(250)) * time.Millisecond
	}
	start := time.Now()
	accepted := make([]bool, len(plan))
	answers := make([]map[string]any, len(plan)) // what the service said, for a disagreement
	// The service decides a job as of its arrival, now plus the start lag
	// it measures (a send's time to start), which moves with the
	// machine's load (a busy CI run's went from 10 to 100 ms); and never
	// as of earlier than the tenant's job before (bolt's tenant.arrived).
	// A job of the always-prompt lag-probe tenant just before and just
	// after each one is promised that lag then; the job was decided
	// somewhere between its request and its answer, with a lag between
	// the two probes'. That reach (lo to hi, plus the lag's rounding to
	// whole milliseconds) is where the simulator may place it. (On the
	// client's times alone it was off by the lag's spread: a busy CI
	// run's job 38 was decided 35 ms after it arrived.)
	lo := make([]time.Duration, len(plan))
	hi := make([]time.Duration, len(plan))
	lagMin, lagMax := time.Hour, time.Duration(0)
	lagNow := func() time.Duration {
		st, _, probe := call(t, "POST", base+"/v1/tenants/lag-probe/jobs", `{"payload":0}`)
		if st != 202 {
			t.Fatalf("lag probe: %d %v", st, probe)
		}
		lag := time.Duration(probe["expected_delay_ms"].(float64)) * time.Millisecond
		lagMin, lagMax = min(lagMin, lag), max(lagMax, lag)
		return lag
	}
	for i, off := range plan {
		arriveAt(start.Add(off))
		lagBefore := lagNow()
		before := time.Now()
		st, _, body := call(t, "POST", base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":%d}`, i))
		after := time.Now()
		if st != 202 && st != 429 {
			t.Fatalf("job %d: %d %v", i, st, body)
		}
		lagAfter := lagNow()
		lo[i] = before.Sub(start) + min(lagBefore, lagAfter) - 2*time.Millisecond
		hi[i] = after.Sub(start) + max(lagBefore, lagAfter) + time.Millisecond
		// A job sent at once is due as of its decision: its dispatch_at
		// is the time, exactly. (Each slot after it counts from it: off
		// by some milliseconds, it would set every slot of its spell
		// apart from the service's.)
		if at, ok := dispatchAtOf(body); ok && st == 202 && at.Sub(start) >= lo[i] && at.Sub(start) <= hi[i] {
			lo[i], hi[i] = at.Sub(start), at.Sub(start)
		}
		accepted[i] = st == 202
		answers[i] = body
	}

	cfg, err := config.Load(file, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := cfg.Tenant("acme")
	limit := limitOf(ts)
	predict := func(arrivals []time.Duration) []bool {
		for _, r := range simulate.Run(limit, arrivals) {
			if r.Service {
				out := make([]bool, len(r.Decisions))
				for i, d := range r.Decisions {
					out[i] = d.Accepted
				}
				return out
			}
		}
		t.Fatal("no service lane")
		return nil
	}
	// The simulator is given each job at the middle of its reach, first;
	// a job it decides otherwise than the service is near a boundary if
	// some time in its reach gets the service's answer, and the
	// simulator then goes on from that time (the jobs after it no
	// earlier), so that one boundary job does not set the two apart for
	// every job after it (a busy run: job 35 went either way, and job 36
	// then found a place more or fewer).
	asOf := make([]time.Duration, len(plan))
	for i := range plan {
		asOf[i] = (lo[i] + hi[i]) / 2
		if i > 0 {
			asOf[i] = max(asOf[i], asOf[i-1])
		}
	}
	placed := func(i int, at time.Duration) []time.Duration {
		moved := slices.Clone(asOf)
		moved[i] = at
		for j := i + 1; j < len(moved); j++ {
			moved[j] = max(moved[j], moved[j-1])
		}
		return moved
	}
	agreeWithin := func(i int) bool {
		from := lo[i]
		if i > 0 {
			from = max(from, asOf[i-1])
		}
		for at := from; at <= max(hi[i], from); at += time.Millisecond {
			if moved := placed(i, at); predict(moved)[i] == accepted[i] {
				asOf = moved
				return true
			}
		}
		return false
	}
	agree, skipped, refused := 0, 0, 0
	for i := range plan {
		if !accepted[i] {
			refused++
		}
		predicted := predict(asOf)[i]
		if accepted[i] == predicted {
			agree++
			continue
		}
		if agreeWithin(i) {
			skipped++
			continue
		}
		t.Errorf("job %d, decided between %v and %v: the service %s it, the simulator says %s (the service said %v)", i, lo[i], hi[i], verdict(accepted[i]), verdict(predicted), answers[i])
	}
	t.Logf("%d jobs (%d refused by the service): %d agree, %d differ but agree at another time they may have been decided as of; the start lag went from %v to %v", len(plan), refused, agree, skipped, lagMin, lagMax)
	if refused == 0 || refused == len(plan) {
		t.Fatalf("the trace should both fill the queue and fit in it: %d of %d refused", refused, len(plan))
	}
}

func verdict(ok bool) string {
	if ok {
		return "accepted"
	}
	return "refused"
}
