package outbound

import (
	"encoding/json"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

func TestEncodeForm(t *testing.T) {
	t.Parallel()
	cases := []struct {
		payload, arrays, want string
	}{
		{`{}`, "", ``},
		{`{"b": "2", "a": "1"}`, "", `b=2&a=1`}, // members in their order
		{`{"n": 1.50, "e": 1e3, "neg": -0, "big": 12345678901234567890}`, "", `n=1.50&e=1e3&neg=-0&big=12345678901234567890`},
		{`{"t": true, "f": false, "z": null}`, "", `t=true&f=false`},
		{`{"s": "a b&c=d+e%/?#é\u0000"}`, "", `s=a+b%26c%3Dd%2Be%25%2F%3F%23%C3%A9%00`},
		{`{"m": {"order_id": "6735", "deep": {"x": "1"}}}`, "", `m%5Border_id%5D=6735&m%5Bdeep%5D%5Bx%5D=1`},
		{`{"k": ["a", "b"]}`, "", `k=a&k=b`},
		{`{"k": ["a", "b"]}`, "repeat", `k=a&k=b`},
		{`{"k": ["a", "b"]}`, "indexed", `k%5B0%5D=a&k%5B1%5D=b`},
		{`{"k": ["a", null, "c"]}`, "indexed", `k%5B0%5D=a&k%5B2%5D=c`},
		{`{"k": ["a", null, "c"]}`, "repeat", `k=a&k=c`},
		{`{"items": [{"price": "p1", "quantity": 2}, {"price": "p2"}]}`, "repeat", `items%5B0%5D%5Bprice%5D=p1&items%5B0%5D%5Bquantity%5D=2&items%5B1%5D%5Bprice%5D=p2`},
		{`{"k": [1, {"a": 2}]}`, "repeat", `k%5B0%5D=1&k%5B1%5D%5Ba%5D=2`},
		{`{"k": [[1, 2], [3]]}`, "repeat", `k%5B0%5D=1&k%5B0%5D=2&k%5B1%5D=3`},
		{`{"k": [[1, 2], [3]]}`, "indexed", `k%5B0%5D%5B0%5D=1&k%5B0%5D%5B1%5D=2&k%5B1%5D%5B0%5D=3`},
		{`{"expand[]": ["a", "b"]}`, "repeat", `expand%5B%5D=a&expand%5B%5D=b`},
		{`{"a": 1, "a": 2}`, "", `a=1&a=2`},
		{`{"e": {}, "l": [], "x": "1"}`, "", `x=1`},
		{` {"a":"1"} ` + "\n", "", `a=1`},
	}
	for _, c := range cases {
		got, err := EncodeForm(json.RawMessage(c.payload), c.arrays)
		if err != nil || string(got) != c.want {
			t.Errorf("%s %s: got %q %v, want %q", c.payload, c.arrays, got, err, c.want)
		}
	}
	for _, bad := range []string{``, `[]`, `"a"`, `1`, `null`, `{"a": 1} {}`, `{"a": }`, `{"": 1}`, `{"a": [{"": 1}]}`, `{"a"`} {
		if got, err := EncodeForm(json.RawMessage(bad), ""); err == nil {
			t.Errorf("%s: encoded as %q", bad, got)
		}
	}
}

// Deep nesting is written as deep as it goes, and parses back.
func TestEncodeFormDeep(t *testing.T) {
	t.Parallel()
	const depth = 200
	payload := strings.Repeat(`{"a":`, depth) + `"x"` + strings.Repeat(`}`, depth)
	got, err := EncodeForm(json.RawMessage(payload), "")
	if err != nil {
		t.Fatal(err)
	}
	v, err := url.ParseQuery(string(got))
	want := url.Values{"a" + strings.Repeat("[a]", depth-1): {"x"}}
	if err != nil || !reflect.DeepEqual(v, want) {
		t.Fatalf("%v %v", err, v)
	}
}
