package api

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3.1 document of this API, served at /openapi.json.
// It is written by hand and kept true by the tests: every request and
// answer of the API tests is checked against it (helpers_test.go), so a
// change of shape that the document does not follow fails them.
//
//go:embed openapi.json
var openAPI []byte

func (s *server) openAPIDocument(w http.ResponseWriter, r *http.Request) {
	// It holds no data, so it needs no token: client generators fetch it
	// before they have one.
	w.Header().Set("Content-Type", "application/json")
	w.Write(openAPI)
}
