package api

import (
	"embed"
	"html/template"
	"net/http"
	"time"
)

// The status page: server-rendered HTML, a little JS, no build step; the
// assets are in the binary.
//
//go:embed page/index.html page/app.js
var pageFS embed.FS

var pageTemplate = template.Must(template.ParseFS(pageFS, "page/index.html"))

type pageRow struct {
	Tenant                                string
	QueueDepth, Capacity, InFlight        int
	Delay, Rate, Paused                   string
	Accepted, Rejected, Delivered, Failed int64
}

// page renders the status page. Its data comes from the same place as the
// API's, and only for a request that may list every tenant; otherwise the
// page renders empty and its script asks for a token.
func (s *server) page(w http.ResponseWriter, r *http.Request) {
	var rows []pageRow
	if t := principal(r); len(s.config().Auth.Tokens) == 0 || (t != nil && t.AllTenants()) {
		list, err := s.store.Tenants(r.Context(), 0, 1000)
		if err == nil {
			cfg := s.config()
			for _, st := range list {
				ts, _ := cfg.Tenant(st.Tenant)
				rows = append(rows, pageRow{Tenant: st.Tenant, QueueDepth: st.QueueDepth, Capacity: ts.Policy().Capacity, InFlight: st.InFlight,
					Delay: st.ExpectedDelay.Round(time.Millisecond).String(), Rate: ts.Rate.String(), Paused: "-",
					Accepted: st.Accepted, Rejected: st.Rejected, Delivered: st.Delivered, Failed: st.Failed})
			}
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'")
	_ = pageTemplate.Execute(w, map[string]any{"Now": time.Now().Format("15:04:05"), "Tenants": rows})
}

func (s *server) pageScript(w http.ResponseWriter, r *http.Request) {
	raw, _ := pageFS.ReadFile("page/app.js")
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Write(raw)
}
