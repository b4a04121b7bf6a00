package leaky

import (
	"fmt"
	"math/big"
	"strings"
	"time"
)

// Rate is a number of sends per period, written N/DURATION: "1/s", "60/m",
// "10/10s", "0.5/s", "1000/d". Its Interval is exact to the nanosecond
// (rounded to nearest), so every spelling of one rate gives the same
// interval.
type Rate struct {
	text     string
	interval time.Duration
}

// Day is the "d" unit of rates and windows.
const Day = 24 * time.Hour

// maxRatePeriod keeps intervals far from overflowing time.Duration.
const maxRatePeriod = 366 * Day

// ParseRate parses N/DURATION. N is a positive decimal; DURATION is a unit
// (s, m, h, d, ms) optionally preceded by a positive number ("10s", "1.5h"),
// or any Go duration ("1m30s").
func ParseRate(s string) (Rate, error) {
	num, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: want N/DURATION such as \"5/s\", \"60/m\" or \"10/10s\"", s)
	}
	n, ok := decimal(strings.TrimSpace(num))
	if !ok || n.Sign() <= 0 {
		return Rate{}, fmt.Errorf("rate %q: count %q must be a positive decimal number", s, num)
	}
	period, err := ParsePeriod(strings.TrimSpace(per))
	if err != nil {
		return Rate{}, fmt.Errorf("rate %q: %w", s, err)
	}
	// interval = period / n, rounded to the nearest nanosecond.
	iv := new(big.Rat).Quo(new(big.Rat).SetInt64(int64(period)), n)
	ns := new(big.Int).Quo(new(big.Int).Add(new(big.Int).Mul(iv.Num(), big.NewInt(2)), iv.Denom()), new(big.Int).Mul(iv.Denom(), big.NewInt(2)))
	if !ns.IsInt64() || ns.Int64() > int64(maxRatePeriod) {
		return Rate{}, fmt.Errorf("rate %q is too slow: at least one per 366d", s)
	}
	if ns.Int64() < int64(time.Microsecond) {
		return Rate{}, fmt.Errorf("rate %q is too fast: at most 1,000,000 per second", s)
	}
	return Rate{text: strings.TrimSpace(s), interval: time.Duration(ns.Int64())}, nil
}

// ParsePeriod parses the DURATION of a rate or window: a bare unit ("s", "m",
// "h", "d", "ms"), a number and a unit ("10s", "7d", "0.5h"), or a Go duration.
func ParsePeriod(s string) (time.Duration, error) {
	if s == "" {
		return 0, fmt.Errorf("missing period after \"/\"")
	}
	units := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour, "d": Day}
	var period time.Duration
	if u, ok := units[s]; ok {
		period = u
	} else if strings.HasSuffix(s, "d") {
		n, ok := decimal(strings.TrimSuffix(s, "d"))
		if !ok || n.Sign() <= 0 {
			return 0, fmt.Errorf("period %q: want a positive number of days such as \"1d\"", s)
		}
		days := new(big.Rat).Mul(n, new(big.Rat).SetInt64(int64(Day)))
		if !days.IsInt() || days.Num().Cmp(big.NewInt(int64(maxRatePeriod))) > 0 {
			return 0, fmt.Errorf("period %q: at most 366d, in whole nanoseconds", s)
		}
		period = time.Duration(days.Num().Int64())
	} else {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("period %q: use s, m, h, d or a duration such as \"10s\"", s)
		}
		period = d
	}
	if period <= 0 || period > maxRatePeriod {
		return 0, fmt.Errorf("period %q must be positive and at most 366d", s)
	}
	return period, nil
}

// decimal parses digits with at most one decimal point, exactly. big.Rat
// alone would also take exponents, fractions, hex and underscores ("1e3",
// "1/3", "0x1p-80", "1_0"): forms nobody means in a rate, which the
// messages do not offer.
func decimal(s string) (*big.Rat, bool) {
	if s == "" || strings.Count(s, ".") > 1 || strings.Trim(s, "0123456789.") != "" || s == "." {
		return nil, false
	}
	return new(big.Rat).SetString(s)
}

// MustParseRate is ParseRate for constants in tests and examples.
func MustParseRate(s string) Rate {
	r, err := ParseRate(s)
	if err != nil {
		panic(err)
	}
	return r
}

// Interval is T = 1/rate.
func (r Rate) Interval() time.Duration { return r.interval }

// PerSecond is the rate in sends per second.
func (r Rate) PerSecond() float64 {
	if r.interval <= 0 {
		return 0
	}
	return float64(time.Second) / float64(r.interval)
}

// String is the rate as it was written.
func (r Rate) String() string { return r.text }

// IsZero reports whether r was never set.
func (r Rate) IsZero() bool { return r.interval == 0 }

// MarshalText and UnmarshalText let a Rate sit in config files and JSON.
func (r Rate) MarshalText() ([]byte, error) { return []byte(r.text), nil }

func (r *Rate) UnmarshalText(b []byte) error {
	parsed, err := ParseRate(string(b))
	if err != nil {
		return err
	}
	*r = parsed
	return nil
}
