package api

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
	"pgregory.net/rapid"
)

// The generators of TestGeneratedRequestsAnswerAsDocumented: requests for
// every operation of openapi.json, drawn from the document's parameters
// and schemas, mostly valid (so the happy paths run) and otherwise broken
// one rule at a time (a pattern, a bound, an enum, a required field, a
// type, null), with now and then a body that is not JSON at all.

// docOp is one operation of the document, as the generators need it.
type docOp struct {
	name         string // "POST /v1/tenants/{tenant}/jobs"
	method, path string
	params       openapi3.Parameters // the path item's, then the operation's
	body         *openapi3.Schema    // its JSON body's schema; nil: it takes none
	bodyRequired bool
	public       bool     // security [] in the document: no token needed
	methods      []string // every method its path takes (the others are 405)
}

// docOps are the document's operations, in a fixed order (rapid replays a
// failure by the same draws, so the list it draws from must not move).
func docOps(doc *openapi3.T) []*docOp {
	var ops []*docOp
	for _, path := range slices.Sorted(maps.Keys(doc.Paths.Map())) {
		item := doc.Paths.Value(path)
		methods := slices.Sorted(maps.Keys(item.Operations()))
		for _, method := range methods {
			op := item.Operations()[method]
			o := &docOp{name: method + " " + path, method: method, path: path, methods: methods,
				params: slices.Concat(item.Parameters, op.Parameters),
				public: op.Security != nil && len(*op.Security) == 0}
			if rb := op.RequestBody; rb != nil && rb.Value != nil {
				if mt := rb.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
					o.body, o.bodyRequired = mt.Schema.Value, rb.Value.Required
				}
			}
			ops = append(ops, o)
		}
	}
	return ops
}

// tokenKind is a kind of caller: its name and the bearer token it sends.
type tokenKind struct{ name, secret string }

// tokenKinds are tourConfig's tokens, none, and one the server does not
// know; admin, producer and viewer come more often, so that most requests
// get past auth.
var tokenKinds = []tokenKind{
	{"admin", "admin-token"}, {"admin", "admin-token"}, {"admin", "admin-token"},
	{"producer", "acme-token"}, {"producer", "acme-token"}, {"producer", "acme-token"},
	{"viewer", "viewer-token"}, {"none", ""}, {"wrong", "wrong-token-5e1f"},
}

// apiRequest is one drawn request and what the checks need to know of it.
type apiRequest struct {
	op                   *docOp
	token                tokenKind
	method, target, body string
	header               http.Header
	tenants              []string // the tenants it names (path, query), for the scope checks
	id                   string   // the job id it names, if any
}

// GoString is what rapid prints of a drawn request, on one line.
func (r apiRequest) GoString() string {
	return fmt.Sprintf("%s %s (%s token) header %v body %q", r.method, r.target, r.token.name, r.header, truncate(r.body, 300))
}

// drawer draws values for one request; ids are the jobs its check has
// enqueued, so that job paths name real jobs as often as not.
type drawer struct {
	t   *rapid.T
	ids []string
}

// fair draws 0 to n-1, each as likely, from fair bits: rapid's integers
// lean hard to small values (IntRange(0, 99) is under 3 a quarter of the
// time), which would make a rare branch common and a list's last items
// rare. All bits false, where shrinking goes, is 0.
func fair(t *rapid.T, label string, n int) int {
	v := 0
	for range 10 {
		v <<= 1
		if rapid.Bool().Draw(t, label) {
			v |= 1
		}
	}
	return v * n / 1024
}

// oneOf draws one of vs, each as likely.
func oneOf[V any](t *rapid.T, label string, vs []V) V {
	return vs[fair(t, label, len(vs))]
}

// chance is true percent times in 100 (false where shrinking goes).
func (d drawer) chance(percent int, label string) bool {
	return fair(d.t, label, 100) >= 100-percent
}

// requestFor draws a request for op.
func requestFor(ids []string, op *docOp) *rapid.Generator[apiRequest] {
	return rapid.Custom(func(t *rapid.T) apiRequest {
		d := drawer{t: t, ids: ids}
		r := apiRequest{op: op, method: op.method, header: http.Header{}}
		r.token = oneOf(t, "token", tokenKinds)
		if r.token.secret != "" {
			r.header.Set("Authorization", "Bearer "+r.token.secret)
		}
		path, query := op.path, url.Values{}
		for _, p := range op.params {
			path = d.param(&r, p.Value, path, query)
		}
		r.target = path
		if len(query) > 0 {
			r.target += "?" + query.Encode()
		}
		if op.body != nil {
			r.body = d.body(op)
		}
		if r.body != "" {
			r.header.Set("Content-Type", "application/json")
		}
		// Now and then a method the path does not take: the document's
		// 405 with Allow.
		if other := slices.DeleteFunc([]string{"GET", "POST", "PUT", "PATCH", "DELETE"}, func(m string) bool {
			return slices.Contains(op.methods, m)
		}); d.chance(3, "another method") {
			r.method = oneOf(t, "method", other)
		}
		return r
	})
}

// param draws parameter p of r: into the path (returned), the query or a
// header.
func (d drawer) param(r *apiRequest, p *openapi3.Parameter, path string, query url.Values) string {
	s := p.Schema.Value
	switch p.In {
	case openapi3.ParameterInPath:
		v := d.value(s, p.Name)
		text := fmt.Sprint(v)
		if v == nil {
			text = ""
		}
		switch p.Name {
		case "tenant":
			r.tenants = append(r.tenants, text)
		case "id":
			r.id = text
		}
		return strings.ReplaceAll(path, "{"+p.Name+"}", url.PathEscape(text))
	case openapi3.ParameterInQuery:
		if !d.chance(map[bool]int{true: 95, false: 50}[p.Required], "with ?"+p.Name) {
			return path
		}
		for _, text := range queryTexts(d.value(s, p.Name)) {
			if p.Name == "wait" {
				text = tameWait(text)
			}
			if p.Name == "tenant" {
				r.tenants = append(r.tenants, text)
			}
			query.Add(p.Name, text)
		}
	case openapi3.ParameterInHeader:
		if d.chance(30, "with "+p.Name) {
			// A header value cannot hold CR or LF on the wire.
			r.header.Set(p.Name, strings.NewReplacer("\r", "", "\n", "").Replace(fmt.Sprint(d.value(s, p.Name))))
		}
	}
	return path
}

// queryTexts are a drawn value as query parameters: an array repeats the
// name (form, explode), null is the name with no value.
func queryTexts(v any) []string {
	switch v := v.(type) {
	case nil:
		return []string{""}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, queryTexts(e)...)
		}
		return out
	case float64:
		return []string{strconv.FormatFloat(v, 'f', -1, 64)}
	}
	return []string{fmt.Sprint(v)}
}

// tameWait keeps ?wait from holding the test: a wait it takes, longer than
// a few milliseconds, becomes 5ms (a wait past 60s is refused at once and
// stays).
func tameWait(v string) string {
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.ParseUint(v, 10, 32)
		d, err = time.Duration(n)*time.Second, nerr
	}
	if err == nil && d > 5*time.Millisecond && d <= MaxJobWait {
		return "5ms"
	}
	return v
}

// body draws a JSON body for op, or none where it may have none, or now
// and then bytes that are not the JSON it takes.
func (d drawer) body(op *docOp) string {
	if !op.bodyRequired && d.chance(50, "no body") {
		return ""
	}
	raw, _ := json.Marshal(d.value(op.body, "body"))
	if !d.chance(8, "garbage body") {
		return string(raw)
	}
	switch fair(d.t, "garbage", 5) {
	case 0:
		return string(rapid.SliceOfN(rapid.Byte(), 0, 24).Draw(d.t, "bytes"))
	case 1:
		return string(raw[:rapid.IntRange(0, len(raw)-1).Draw(d.t, "cut at")])
	case 2:
		return string(raw) + oneOf(d.t, "trailer", []string{"}", "]", " {}", " x", "\x00"})
	case 3:
		return oneOf(d.t, "not an object", []string{"null", "[]", `""`, "1", "  ", "\xff\xfe", `{"a":1,"a":2}`})
	}
	return string(raw[:1]) + " " + string(raw[1:]) // whitespace inside: still the same JSON
}

// value draws a JSON value for schema s, the schema of name (a property or
// a parameter): valid for s most of the time, else with one of its rules
// broken at one place (see places), as deep down as at the top: a valid
// value around one fault is what finds a check the server makes only at
// the top.
func (d drawer) value(s *openapi3.Schema, name string) any {
	if !d.chance(15, name+" broken") {
		return d.valid(s, name, nil)
	}
	var all [][]string
	places(s, []string{}, &all)
	return d.valid(s, name, oneOf(d.t, name+" broken at", all))
}

// places lists the places of s where a value can break a rule: s itself
// (the empty path), its properties (by name), the items of an array ("[]")
// and the entries of a map ("*"), to a depth of six (a batch's job's
// request's query's array's item).
func places(s *openapi3.Schema, at []string, out *[][]string) {
	*out = append(*out, at)
	if len(at) >= 6 {
		return
	}
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
		places(s.Properties[name].Value, slices.Concat(at, []string{name}), out)
	}
	if s.Items != nil && s.Items.Value != nil {
		places(s.Items.Value, slices.Concat(at, []string{"[]"}), out)
	}
	if more := s.AdditionalProperties.Schema; more != nil && more.Value != nil {
		places(more.Value, slices.Concat(at, []string{"*"}), out)
	}
}

// valid draws a value of s, valid but at the place broken (nil: nowhere;
// empty: s itself).
func (d drawer) valid(s *openapi3.Schema, name string, broken []string) any {
	if broken != nil && len(broken) == 0 {
		return d.broken(s, name)
	}
	if broken == nil {
		if v, ok := d.hint(name); ok {
			return v
		}
	}
	switch {
	case broken == nil && s.Const != nil:
		return s.Const
	case broken == nil && len(s.Enum) > 0:
		return oneOf(d.t, name, s.Enum)
	}
	switch d.typeOf(s, name, broken) {
	case "null":
		return nil
	case "boolean":
		return rapid.Bool().Draw(d.t, name)
	case "integer", "number":
		lo, hi := bounds(s)
		return rapid.IntRange(lo, hi).Draw(d.t, name)
	case "string":
		return d.validString(s, name)
	case "array":
		lo := int(s.MinItems)
		if len(broken) > 0 {
			lo = max(lo, 1) // an item to break
		}
		out := make([]any, 0, lo+3)
		for i := range rapid.IntRange(lo, lo+3).Draw(d.t, name+" items") {
			out = append(out, d.valid(s.Items.Value, name, below(broken, "[]", i == 0)))
		}
		return out
	case "object":
		return d.object(s, broken)
	}
	return d.anyJSON(name, 0)
}

// below is the place to break within a part of a value: the rest of
// broken if the part is where it leads (and this is the part chosen), nil
// if not.
func below(broken []string, part string, chosen bool) []string {
	if len(broken) == 0 || broken[0] != part || !chosen {
		return nil
	}
	return broken[1:]
}

// typeOf is one of the types s allows ("" for any value), the one the
// place to break goes through if any.
func (d drawer) typeOf(s *openapi3.Schema, name string, broken []string) string {
	if s.Type == nil || len(*s.Type) == 0 {
		return ""
	}
	switch {
	case len(broken) > 0 && broken[0] == "[]":
		return "array"
	case len(broken) > 0:
		return "object"
	}
	return oneOf(d.t, name+" type", s.Type.Slice())
}

// bounds are an integer's minimum and maximum, or a small range above the
// minimum when it has no maximum.
func bounds(s *openapi3.Schema) (lo, hi int) {
	if s.Min != nil {
		lo = int(*s.Min)
	}
	hi = lo + 1000
	if s.Max != nil {
		hi = int(*s.Max)
	}
	return lo, hi
}

// patterns are the document's patterns as rapid generators, built once.
var patterns sync.Map // pattern -> *rapid.Generator[string]

func (d drawer) validString(s *openapi3.Schema, name string) any {
	switch s.Format {
	case "date-time":
		return time.Now().Add(time.Duration(rapid.IntRange(-2, 48).Draw(d.t, name+" hours")) * time.Hour).UTC().Format(time.RFC3339)
	case "uri":
		return oneOf(d.t, name, []string{"https://example.com/hook", "http://127.0.0.1:1/cb"})
	}
	v := rapid.StringN(int(s.MinLength), 12, -1).Draw(d.t, name)
	if s.Pattern != "" {
		g, _ := patterns.LoadOrStore(s.Pattern, rapid.StringMatching(s.Pattern))
		v = g.(*rapid.Generator[string]).Draw(d.t, name)
	}
	if s.MaxLength != nil && utf8.RuneCountInString(v) > int(*s.MaxLength) {
		v = string([]rune(v)[:*s.MaxLength])
	}
	return v
}

// usualFields are optional in their schema but sent by most clients: a
// job's payload (optional only for a job whose request is a GET or
// DELETE).
var usualFields = map[string]bool{"payload": true}

// object draws an object of schema s: its required properties, some of
// its optional ones, a few entries of a map (additionalProperties), and
// whichever the place to break is in.
func (d drawer) object(s *openapi3.Schema, broken []string) map[string]any {
	m := map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
		percent := 8
		if slices.Contains(s.Required, name) || usualFields[name] || len(broken) > 0 && broken[0] == name {
			percent = 100
		}
		if d.chance(percent, "with "+name) {
			m[name] = d.valid(s.Properties[name].Value, name, below(broken, name, true))
		}
	}
	if more := s.AdditionalProperties.Schema; more != nil && more.Value != nil {
		least := 0
		if len(broken) > 0 && broken[0] == "*" {
			least = 1 // an entry to break
		}
		for i := range rapid.IntRange(least, 2).Draw(d.t, "entries") {
			key := rapid.StringMatching(`^[A-Za-z][A-Za-z0-9-]{0,8}$`).Draw(d.t, "key")
			m[key] = d.valid(more.Value, key, below(broken, "*", i == 0))
		}
	}
	return m
}

// anyJSON is a value of no schema (a job's payload): small, of any type.
func (d drawer) anyJSON(name string, depth int) any {
	switch fair(d.t, name+" kind", 6) {
	case 0:
		return rapid.IntRange(-1000, 1000).Draw(d.t, name)
	case 1:
		return rapid.String().Draw(d.t, name)
	case 2:
		return rapid.Bool().Draw(d.t, name)
	case 3:
		if depth < 3 {
			return []any{d.anyJSON(name, depth+1)}
		}
	}
	return map[string]any{"to": rapid.StringMatching(`^\+1555[0-9]{0,4}$`).Draw(d.t, name)}
}

// broken draws a value that breaks one rule of s.
func (d drawer) broken(s *openapi3.Schema, name string) any {
	ways := []string{"null", "wrong type"}
	typ := d.typeOf(s, name, nil)
	switch {
	case typ == "string" || s.Const != nil || len(s.Enum) > 0:
		ways = append(ways, "off pattern", "too long", "empty")
	case typ == "integer":
		ways = append(ways, "below minimum", "above maximum", "fraction")
	case typ == "object":
		ways = append(ways, "no required field", "extra field")
	case typ == "array":
		ways = append(ways, "too few", "too many")
	}
	switch way := oneOf(d.t, name+" broken as", ways); way {
	case "null":
		return nil
	case "wrong type":
		if typ == "string" {
			return rapid.IntRange(-5, 5).Draw(d.t, name)
		}
		return "x"
	case "off pattern":
		return fmt.Sprint(d.valid(s, name, nil)) + oneOf(d.t, name+" tail", []string{" ", "é", "\x01", "/", "..", "%"})
	case "too long":
		n := 130
		if s.MaxLength != nil {
			n = int(*s.MaxLength) + 1
		}
		return strings.Repeat("a", n)
	case "empty":
		return ""
	case "below minimum", "above maximum", "fraction":
		lo, hi := bounds(s)
		return map[string]any{"below minimum": lo - 1, "above maximum": hi + 1, "fraction": float64(lo) + 0.5}[way]
	case "no required field", "extra field":
		m := d.object(s, nil)
		if way == "extra field" || len(s.Required) == 0 {
			m["colour"] = "red"
		} else {
			delete(m, oneOf(d.t, name+" without", s.Required))
		}
		return m
	case "too few":
		return []any{}
	}
	n := 101 // "too many": past a maxItems of 100, or many of an unbounded array
	if s.MaxItems != nil && *s.MaxItems < 100 {
		n = int(*s.MaxItems) + 1
	}
	return slices.Repeat([]any{d.valid(s.Items.Value, name, nil)}, n)
}

// hint draws, for the names where the schema alone rarely gives a useful
// value, one that reaches the server's logic: the configured tenants (acme,
// beta) beside an unknown one, the jobs the check enqueued, costs within a
// tenant's capacity and past it, expiries met or not, repeated keys, waits
// short enough for a test.
func (d drawer) hint(name string) (any, bool) {
	if !d.chance(85, name+" hinted") {
		return nil, false
	}
	pick := func(vs ...any) (any, bool) { return oneOf(d.t, name, vs), true }
	switch name {
	case "tenant":
		return pick("acme", "acme", "acme", "acme", "beta", "stranger")
	case "id":
		if len(d.ids) > 0 && d.chance(80, "a job of the check") {
			return oneOf(d.t, name, d.ids), true
		}
		return pick("0000000000000000000000000a", "cz3nf0ggpmk4m0yq1qj2c8x7r9", "x")
	case "cost":
		return pick(1, 1, 2, 7)
	case "payload":
		if d.chance(3, "a payload too large") {
			return strings.Repeat("p", 1100), true
		}
		return nil, false
	case "expires_in":
		return pick("1h", "30s", "8784h", "0s", "-5s", "9000h", "1h30m")
	case "method":
		return pick("GET", "POST", "delete", "PUT", "TRACE")
	case "idempotency_key", "Idempotency-Key":
		return pick("k1", "k2", "order-17")
	case "wait":
		return pick("0", "0s", "1ms", "5ms", "-0s", "+0", "61s")
	case "limit":
		return pick(1, 2, 10)
	case "offset":
		return pick(0, 1, 5)
	case "type":
		return pick("email:welcome", "", "sms")
	}
	return nil, false
}
