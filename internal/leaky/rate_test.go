package leaky

import (
	"strings"
	"testing"
	"time"
)

func TestRateSpellings(t *testing.T) {
	t.Parallel()
	groups := []struct {
		interval time.Duration
		spell    []string
	}{
		{time.Second, []string{"1/s", "60/m", "3600/h", "86400/d", "10/10s", "1/1s", "0.5/500ms", "1/1000ms", " 1 / s ", "2/2s", "120/2m", "1.0/s"}},
		{2 * time.Second, []string{"0.5/s", "30/m", "1/2s", "5/10s", "43200/d"}},
		{200 * time.Millisecond, []string{"5/s", "300/m", "50/10s", "0.2/40ms"}},
		{time.Second / 3, []string{"3/s", "180/m"}},
		{86400 * time.Millisecond, []string{"1000/d", "1/86.4s", "1/1m26.4s"}},
	}
	for _, g := range groups {
		for _, s := range g.spell {
			r, err := ParseRate(s)
			if err != nil {
				t.Errorf("%q: %v", s, err)
				continue
			}
			if r.Interval() != g.interval {
				t.Errorf("%q: interval %v, want %v", s, r.Interval(), g.interval)
			}
		}
	}
}

func TestRateRefusals(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{
		"":                   "want N/DURATION",
		"5":                  "want N/DURATION",
		"0/s":                "positive",
		"-1/s":               "positive",
		"x/s":                "positive",
		"1e3/s":              "positive",
		"5/x":                "use s, m, h, d",
		"5/":                 "missing period",
		"5/0s":               "positive",
		"5/-1s":              "positive",
		"1/400d":             "366d",
		"2000000/s":          "too fast",
		"1/s/s":              "use s",
		"1/0.5e3s":           "use s, m, h, d",
		"1/1.0000000000001d": "whole nanoseconds",
		"0.001/d":            "too slow",
		// Nothing parses to an interval past 366d, or one that overflows.
		"1/2562047h":                   "366d",
		"1/99999999999h":               "use s, m, h, d",
		"0.000000000000000000000001/s": "too slow",
		"1/366.000000001d":             "366d",
		"0.5/366d":                     "too slow",
		// Decimals only: no hex, exponents, fractions or underscores.
		"0x10/s":   "positive decimal",
		"1p3/s":    "positive decimal",
		"1_000/s":  "positive decimal",
		"1/0x1p3d": "positive number of days",
		"./s":      "positive decimal",
		"1.2.3/s":  "positive decimal",
	} {
		_, err := ParseRate(s)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRate(%q) = %v, want an error containing %q", s, err, want)
		}
	}
}

func TestRateIntervalsAtTheEdges(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]time.Duration{"1/366d": 366 * Day, "1/8784h": 366 * Day, "1000000/s": time.Microsecond, ".5/s": 2 * time.Second} {
		r, err := ParseRate(s)
		if err != nil || r.Interval() != want {
			t.Errorf("%q: %v, %v; want %v", s, r.Interval(), err, want)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"1/s", "0.5/s", "10/10s", "1000/d", "3/1m30s", "1/1.5d", "9/ms", "1/0s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			return
		}
		if r.Interval() < time.Microsecond || r.Interval() > maxRatePeriod {
			t.Fatalf("%q: interval %v out of range", s, r.Interval())
		}
		// What parsed once parses again to the same thing.
		again, err := ParseRate(r.String())
		if err != nil || again.Interval() != r.Interval() {
			t.Fatalf("%q: reparse gave %v, %v", s, again.Interval(), err)
		}
	})
}
