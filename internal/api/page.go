package api

import (
	"bytes"
	"embed"
	"net/http"
)

// The status page: one HTML file and a script, no build step, no library;
// both are in the binary. The page holds no data: its script asks the API
// (with the operator's token, kept in the tab's sessionStorage) every 2 s.
//
//go:embed page/index.html page/*.js
var pageFS embed.FS

// pageScripts are served, in this order, as one script (/static/app.js):
// files kept small, one request.
var pageScripts = []string{"page/core.js", "page/charts.js", "page/views.js", "page/app.js"}

// pageSecurity lets the page load its own script and nothing else; its
// styles are inline.
const pageSecurity = "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"

func (s *server) page(w http.ResponseWriter, r *http.Request) {
	raw, _ := pageFS.ReadFile("page/index.html")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", pageSecurity)
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(raw)
}

func (s *server) pageScript(w http.ResponseWriter, r *http.Request) {
	var b bytes.Buffer
	for _, name := range pageScripts {
		raw, _ := pageFS.ReadFile(name)
		b.Write(raw)
		b.WriteByte('\n')
	}
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(b.Bytes())
}
