package simulate

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// MaxTrace bounds a trace, so a wrong file cannot exhaust memory.
const MaxTrace = 1_000_000

// ParseTrace reads arrival times: seconds from the start, one per line
// (decimals allowed; in a CSV, the first column). Blank lines, lines
// starting with #, and a header line are skipped.
func ParseTrace(r io.Reader) ([]time.Duration, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	var out []time.Duration
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		field, _, _ := strings.Cut(text, ",")
		field = strings.TrimSpace(field)
		secs, err := strconv.ParseFloat(field, 64)
		if err != nil {
			if line == 1 && len(out) == 0 {
				continue // a header
			}
			return nil, fmt.Errorf("line %d: %q is not a number of seconds", line, truncate(field, 40))
		}
		if math.IsNaN(secs) || secs < 0 || secs > 366*24*3600 {
			return nil, fmt.Errorf("line %d: %v seconds: arrival times go from 0 to 366 days", line, field)
		}
		if len(out) == MaxTrace {
			return nil, fmt.Errorf("line %d: more than %d arrivals", line, MaxTrace)
		}
		out = append(out, time.Duration(math.Round(secs*float64(time.Second))))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no arrival times: want seconds from the start, one per line")
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
