package simulate

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Describe says in words what l is.
func Describe(l Limit) string {
	rate := fmt.Sprintf("1 per %v", l.Interval)
	if l.Interval <= time.Second {
		rate = fmt.Sprintf("%g/s", float64(time.Second)/float64(l.Interval))
	}
	s := fmt.Sprintf("limit: %s; window algorithms allow %d per %v; token bucket of %d; leaky queue of %d (burst %d)",
		rate, l.Burst, l.Window(), l.Token.Burst, l.Leaky.Capacity, l.Leaky.Burst)
	for _, w := range l.Leaky.Windows {
		s += fmt.Sprintf("; window %s", w)
	}
	return s
}

// Table prints results as a table.
func Table(w io.Writer, l Limit, arrivals int, results []Result) error {
	fmt.Fprintf(w, "%s\n%d arrivals\n\n", Describe(l), arrivals)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-28s\taccepted\trejected\tmax wait\tmax in %v\tmax per second\t\n", "algorithm", l.Window())
	for _, r := range results {
		name := r.Algorithm
		if r.Service {
			name += " *"
		}
		fmt.Fprintf(tw, "%-28s\t%d\t%d\t%v\t%d\t%d\t\n", name, r.Accepted, r.Rejected, r.MaxWait.Round(time.Millisecond), r.MaxInWindow, r.MaxPerSecond)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		if r.Service {
			fmt.Fprintln(w, "\n* the tenant's own policy: what the service decides")
			break
		}
	}
	return nil
}

// StormTable prints a retry storm: attempts with clients that retry at
// once against clients that honour Retry-After with jitter.
func StormTable(w io.Writer, l Limit, clients int, atOnce, honour []Result) error {
	fmt.Fprintf(w, "%s\n%d clients arrive together; a refused client tries again until it gets in (or %v)\n\n", Describe(l), clients, StormHorizon)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-28s\tattempts, retry at once\tattempts, honour Retry-After\tfewer by\tmax per second\t\n", "algorithm")
	for i := range atOnce {
		a, h := atOnce[i], honour[i]
		fmt.Fprintf(tw, "%-28s\t%d\t%d\t%.1fx\t%d\t\n", a.Algorithm, a.Attempts, h.Attempts, float64(a.Attempts)/float64(max(h.Attempts, 1)), h.MaxPerSecond)
	}
	return tw.Flush()
}

type jsonResult struct {
	Algorithm      string  `json:"algorithm"`
	Service        bool    `json:"service,omitempty"`
	Accepted       int     `json:"accepted"`
	Rejected       int     `json:"rejected"`
	Attempts       int     `json:"attempts"`
	MaxWaitMS      int64   `json:"max_wait_ms"`
	MaxInWindow    int     `json:"max_in_window"`
	WindowSeconds  float64 `json:"window_seconds"`
	MaxPerSecond   int     `json:"max_per_second"`
	HonourAttempts *int    `json:"attempts_honouring_retry_after,omitempty"`
}

// JSON writes results (and, for a storm, the honouring clients' attempts).
func JSON(w io.Writer, l Limit, results, honour []Result) error {
	out := make([]jsonResult, len(results))
	for i, r := range results {
		out[i] = jsonResult{Algorithm: r.Algorithm, Service: r.Service, Accepted: r.Accepted, Rejected: r.Rejected, Attempts: r.Attempts,
			MaxWaitMS: r.MaxWait.Milliseconds(), MaxInWindow: r.MaxInWindow, WindowSeconds: l.Window().Seconds(), MaxPerSecond: r.MaxPerSecond}
		if honour != nil {
			out[i].HonourAttempts = &honour[i].Attempts
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"limit": Describe(l), "results": out})
}

// SVG draws one lane per algorithm: arrivals, accepted (at their send
// time), refused, and sends per second as bars against the limit's line.
func SVG(w io.Writer, l Limit, results []Result) error {
	const width, lane, left, top = 1000.0, 140.0, 190.0, 40.0
	var end time.Duration
	for _, r := range results {
		for _, d := range r.Decisions {
			end = max(end, d.Arrival, d.Send)
		}
	}
	end = max(end+time.Second, l.Window())
	seconds := int(end/time.Second) + 1
	x := func(t time.Duration) float64 {
		return left + (width-left-20)*float64(t)/float64(time.Duration(seconds)*time.Second)
	}
	perSecond := float64(time.Second) / float64(l.Interval)
	// Bars are scaled so the highest count (or the limit) fills 60 px.
	scale := perSecond
	counts := make([][]int, len(results))
	for i, r := range results {
		counts[i] = make([]int, seconds)
		for _, d := range r.Decisions {
			if d.Accepted {
				counts[i][int(d.Send/time.Second)]++
			}
		}
		for _, c := range counts[i] {
			scale = max(scale, float64(c))
		}
	}
	height := top + lane*float64(len(results)) + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14">%s</text>`+"\n", html.EscapeString(Describe(l)))
	legend := []struct{ color, label string }{{"#999", "arrival"}, {"#2a9d3c", "accepted (at send)"}, {"#d62828", "refused"}, {"#4a7bd0", "sends per second"}, {"#f08c00", "the limit per second"}}
	for i, it := range legend {
		fmt.Fprintf(&b, `<rect x="%.0f" y="26" width="10" height="10" fill="%s"/><text x="%.0f" y="35">%s</text>`+"\n", left+float64(i)*150, it.color, left+float64(i)*150+14, it.label)
	}
	for i, r := range results {
		y0 := top + lane*float64(i)
		name := r.Algorithm
		if r.Service {
			name += " (service)"
		}
		fmt.Fprintf(&b, `<g class="lane" data-algorithm="%s">`+"\n", html.EscapeString(r.Algorithm))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ccc"/>`+"\n", left, y0+lane-10, width-20, y0+lane-10)
		fmt.Fprintf(&b, `<text x="10" y="%.1f">%s</text><text x="10" y="%.1f" fill="#555">%d accepted, %d refused</text>`+"\n", y0+30, html.EscapeString(name), y0+46, r.Accepted, r.Rejected)
		for s, c := range counts[i] {
			h := 60 * float64(c) / scale
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4a7bd0" opacity="0.35"/>`+"\n", x(time.Duration(s)*time.Second), y0+lane-10-h, x(time.Second)-x(0)-1, h)
		}
		ly := y0 + lane - 10 - 60*perSecond/scale
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f08c00" stroke-dasharray="4 3"/>`+"\n", left, ly, width-20, ly)
		for _, d := range r.Decisions {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>`+"\n", x(d.Arrival), y0+8, x(d.Arrival), y0+16)
			if d.Accepted {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="#2a9d3c"/>`+"\n", x(d.Send), y0+28)
			} else {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#d62828" text-anchor="middle">×</text>`+"\n", x(d.Arrival), y0+52)
			}
		}
		fmt.Fprintf(&b, "</g>\n")
	}
	for s := 0; s <= seconds; s += max(1, seconds/10) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#555" text-anchor="middle">%ds</text>`+"\n", x(time.Duration(s)*time.Second), height-5, s)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
