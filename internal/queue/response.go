package queue

// Response is what is kept of a downstream's answer to an attempt (DESIGN.md
// section 6a): its status, the headers the downstream is configured to keep,
// and at most keep_response_bytes of its body. Stores keep it beside the job
// record as long as the job; GET /v1/jobs/{id} shows the latest attempt's.
// It never holds anything of the request (no Authorization).
type Response struct {
	Status int `json:"status"`
	// Headers are the kept answer headers by canonical name, several
	// values of one name joined with ", ".
	Headers map[string]string `json:"headers"`
	// Body is the kept body when it is UTF-8 text; BodyBase64 (standard
	// encoding) when it is not. At most one is set.
	Body       string `json:"body,omitempty"`
	BodyBase64 string `json:"body_base64,omitempty"`
	// Truncated: the body was longer than what is kept.
	Truncated bool `json:"truncated"`
}
