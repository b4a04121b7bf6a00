package outbound

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"throttler/internal/config"
)

// EncodeForm writes a JSON object as application/x-www-form-urlencoded, as
// Stripe and Twilio read it (DESIGN.md section 6a):
//
//   - members in their order (a repeated name is written each time);
//   - strings as they are, numbers as written ("1.50" stays 1.50, 1e3
//     stays 1e3), true and false as words, null left out;
//   - a nested object as key[sub]=value, as deep as it goes;
//   - an array by arrays: "indexed" writes k[0]=a&k[1]=b; "repeat" (or "")
//     writes k=a&k=b for an array of plain values, and indexes an array
//     that holds an object or an array (items[0][price]=...), since only
//     the index ties an object's fields together. A null element is left
//     out and keeps its index;
//   - names and values escaped as url.QueryEscape does, so url.ParseQuery
//     on the other side gives back exactly these pairs.
//
// A member name that is empty is refused (its key would read as k[], an
// array append); brackets in a name are kept as written, so
// {"expand[]": ["a", "b"]} gives Stripe's expand[]=a&expand[]=b.
func EncodeForm(payload json.RawMessage, arrays string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	root, err := parseNode(dec)
	if err != nil {
		return nil, fmt.Errorf("is not JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("is not one JSON value: something follows it")
	}
	if root.kind != '{' {
		return nil, errors.New("must be a JSON object for body = \"form\" (its members become the form's fields)")
	}
	e := formEncoder{indexed: arrays == config.FormIndexed}
	if err := e.object("", root); err != nil {
		return nil, err
	}
	return e.buf.Bytes(), nil
}

// node is a JSON value with its members in order (a map would lose it).
type node struct {
	kind  byte   // '{', '[', 's' (a scalar: text), 'n' (null)
	text  string // a scalar's form text
	names []string
	kids  []node
}

func parseNode(dec *json.Decoder) (node, error) {
	tok, err := dec.Token()
	if err != nil {
		return node{}, err
	}
	switch v := tok.(type) {
	case json.Delim:
		n := node{kind: byte(v)}
		for dec.More() {
			if v == '{' {
				tok, err := dec.Token()
				name, ok := tok.(string)
				if err != nil || !ok {
					return node{}, cmp.Or(err, errors.New("a member name is not a string"))
				}
				n.names = append(n.names, name)
			}
			kid, err := parseNode(dec)
			if err != nil {
				return node{}, err
			}
			n.kids = append(n.kids, kid)
		}
		_, err := dec.Token() // the closing delimiter
		return n, err
	case string:
		return node{kind: 's', text: v}, nil
	case json.Number:
		return node{kind: 's', text: v.String()}, nil
	case bool:
		return node{kind: 's', text: strconv.FormatBool(v)}, nil
	}
	return node{kind: 'n'}, nil
}

type formEncoder struct {
	indexed bool
	buf     bytes.Buffer
}

func (e *formEncoder) object(prefix string, n node) error {
	for i, name := range n.names {
		if name == "" {
			return fmt.Errorf("has a member with an empty name (in %s): a form field needs a name", cmp.Or(prefix, "the top-level object"))
		}
		key := name
		if prefix != "" {
			key = prefix + "[" + name + "]"
		}
		if err := e.value(key, n.kids[i]); err != nil {
			return err
		}
	}
	return nil
}

func (e *formEncoder) value(key string, n node) error {
	switch n.kind {
	case '{':
		return e.object(key, n)
	case '[':
		index := e.indexed
		for _, k := range n.kids {
			index = index || k.kind == '{' || k.kind == '['
		}
		for i, k := range n.kids {
			sub := key
			if index {
				sub = key + "[" + strconv.Itoa(i) + "]"
			}
			if err := e.value(sub, k); err != nil {
				return err
			}
		}
	case 's':
		if e.buf.Len() > 0 {
			e.buf.WriteByte('&')
		}
		e.buf.WriteString(url.QueryEscape(key))
		e.buf.WriteByte('=')
		e.buf.WriteString(url.QueryEscape(n.text))
	}
	return nil
}
