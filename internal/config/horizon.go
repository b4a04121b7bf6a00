package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// checkHorizon refuses a policy that schedules further ahead than
// leaky.MaxHorizon: past it the arithmetic of slots and Retry-After stops
// being exact (time.Duration ends at 292 years), and a queue that deep is a
// typo. key is the tenant or downstream ("tenants.acme"), rate as written.
func (c *Config) checkHorizon(key string, p leaky.Policy, rate string) error {
	if p.Horizon() <= leaky.MaxHorizon {
		return nil
	}
	return c.bad(key, "%s schedules %s ahead; at most %s: %s",
		describePolicy(p, rate), span(p.HorizonYears()), maxHorizonText(), horizonFix(p, rate))
}

// describePolicy names what makes p's horizon: "capacity 200000 at rate 1/d".
func describePolicy(p leaky.Policy, rate string) string {
	var parts []string
	if p.Capacity > 0 {
		parts = append(parts, fmt.Sprintf("capacity %d", p.Capacity))
	}
	if p.Burst > 1 {
		parts = append(parts, fmt.Sprintf("burst %d", p.Burst))
	}
	s := strings.Join(parts, " and ")
	if rate != "" {
		s = strings.TrimSpace(s + " at rate " + rate)
	}
	if len(p.Windows) > 0 {
		ws := make([]string, len(p.Windows))
		for i, w := range p.Windows {
			ws[i] = w.String()
		}
		s = strings.TrimSpace(s + " with windows " + strings.Join(ws, ", "))
	}
	return s
}

// horizonFix says which keys bring the horizon in.
func horizonFix(p leaky.Policy, rate string) string {
	var lower []string
	if p.Capacity > 0 {
		lower = append(lower, "capacity")
	}
	if p.Burst > 1 {
		lower = append(lower, "burst")
	}
	var fixes []string
	if len(lower) > 0 {
		fixes = append(fixes, "lower "+strings.Join(lower, " or "))
	}
	if rate != "" {
		fixes = append(fixes, "raise rate")
	}
	if len(p.Windows) > 0 {
		fixes = append(fixes, "let each window take more")
	}
	if len(fixes) == 1 {
		return fixes[0]
	}
	return strings.Join(fixes[:len(fixes)-1], ", ") + " or " + fixes[len(fixes)-1]
}

// span is a horizon for people: whole years when far past the limit, days
// (rounded up, so it never reads as the limit itself) when close to it.
func span(years float64) string {
	if years >= 100 {
		return fmt.Sprintf("%.0f years", math.Floor(years))
	}
	days := math.Ceil(years*365*1000) / 1000
	return strconv.FormatFloat(days, 'f', -1, 64) + " days"
}

// maxHorizonText is "10 years (87600h)".
func maxHorizonText() string {
	return fmt.Sprintf("%.0f years (%.0fh)", leaky.MaxHorizon.Hours()/(365*24), leaky.MaxHorizon.Hours())
}
