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
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/simulate"
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
// --config` gives for the arrival times the server saw, apart from
// arrivals within a few milliseconds of a decision boundary (plus the
// spread of the start lag the server added to its arrivals in the run).
func TestSimulatorAgreesWithTheService(t *testing.T) {
	ds := downstreamtest.New(t)
	const tenantCfg = "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 5\nburst = 2\n"
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
	sent := make([]time.Duration, len(plan))
	accepted := make([]bool, len(plan))
	answers := make([]map[string]any, len(plan)) // what the service said, for a disagreement
	took := make([]time.Duration, len(plan))     // each request's round trip: the server decided somewhere in it
	// The service decides as of its arrival, now plus the start lag it
	// measures (a send's time to start), which moves with the machine's
	// load; the simulator is given the client's times. The jobs sent at
	// once are promised that lag: its spread over the run is how far the
	// two clocks may slide against each other.
	lagMin, lagMax := time.Hour, time.Duration(0)
	for i, off := range plan {
		arriveAt(start.Add(off))
		before := time.Now()
		st, _, body := call(t, "POST", base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":%d}`, i))
		after := time.Now()
		if st != 202 && st != 429 {
			t.Fatalf("job %d: %d %v", i, st, body)
		}
		sent[i] = before.Add(after.Sub(before) / 2).Sub(start) // when the server decided, give or take half the round trip
		took[i] = after.Sub(before)
		accepted[i] = st == 202
		answers[i] = body
		if d, ok := body["expected_delay_ms"].(float64); ok && accepted[i] && d < 50 { // sent at once (T = 100 ms)
			lag := time.Duration(d) * time.Millisecond
			lagMin, lagMax = min(lagMin, lag), max(lagMax, lag)
		}
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
	predicted := predict(sent)
	margin := 5 * time.Millisecond
	if lagMax > lagMin {
		margin += lagMax - lagMin
	}
	// A job is near a boundary if moving it by the margin, or by half its
	// own round trip (a busy CI run: a request of 20 ms put the decision
	// 10 ms from the midpoint), changes the simulator's answer.
	nearBoundary := func(i int) bool {
		m := max(margin, took[i]/2+time.Millisecond)
		for _, shift := range []time.Duration{-m, m} {
			moved := append([]time.Duration(nil), sent...)
			moved[i] += shift
			if i > 0 && moved[i] < moved[i-1] || i+1 < len(moved) && moved[i] > moved[i+1] {
				return true // it would change places with a neighbour
			}
			if predict(moved)[i] != predicted[i] {
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
		if accepted[i] == predicted[i] {
			agree++
			continue
		}
		if nearBoundary(i) {
			skipped++
			continue
		}
		t.Errorf("job %d at %v: the service %s it, the simulator says %s (the service said %v)", i, sent[i], verdict(accepted[i]), verdict(predicted[i]), answers[i])
	}
	t.Logf("%d jobs (%d refused by the service): %d agree, %d differ within %v of a decision boundary (5 ms, and the start lag's spread: %v to %v)", len(plan), refused, agree, skipped, margin, lagMin, lagMax)
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
