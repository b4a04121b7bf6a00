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

	"github.com/throttler-dev/throttler/internal/config"
)

// encodeFormRef is EncodeForm as it was first written, on json.Decoder's
// tokens and a tree of the payload: slow (84 allocations for a Twilio
// payload) but plainly right. It is kept only as the reference that
// FuzzEncodeFormAgainstReference holds the byte scanner to.
func encodeFormRef(payload json.RawMessage, arrays string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	root, err := parseRefNode(dec)
	if err != nil {
		return nil, fmt.Errorf("is not JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("is not one JSON value: something follows it")
	}
	if root.kind != '{' {
		return nil, errors.New("must be a JSON object for body = \"form\" (its members become the form's fields)")
	}
	e := refEncoder{indexed: arrays == config.FormIndexed}
	if err := e.object("", root); err != nil {
		return nil, err
	}
	return e.buf.Bytes(), nil
}

// refNode is a JSON value with its members in order (a map would lose it).
type refNode struct {
	kind  byte   // '{', '[', 's' (a scalar: text), 'n' (null)
	text  string // a scalar's form text
	names []string
	kids  []refNode
}

func parseRefNode(dec *json.Decoder) (refNode, error) {
	tok, err := dec.Token()
	if err != nil {
		return refNode{}, err
	}
	switch v := tok.(type) {
	case json.Delim:
		n := refNode{kind: byte(v)}
		for dec.More() {
			if v == '{' {
				tok, err := dec.Token()
				name, ok := tok.(string)
				if err != nil || !ok {
					return refNode{}, cmp.Or(err, errors.New("a member name is not a string"))
				}
				n.names = append(n.names, name)
			}
			kid, err := parseRefNode(dec)
			if err != nil {
				return refNode{}, err
			}
			n.kids = append(n.kids, kid)
		}
		_, err := dec.Token() // the closing delimiter
		return n, err
	case string:
		return refNode{kind: 's', text: v}, nil
	case json.Number:
		return refNode{kind: 's', text: v.String()}, nil
	case bool:
		return refNode{kind: 's', text: strconv.FormatBool(v)}, nil
	}
	return refNode{kind: 'n'}, nil
}

type refEncoder struct {
	indexed bool
	buf     bytes.Buffer
}

func (e *refEncoder) object(prefix string, n refNode) error {
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

func (e *refEncoder) value(key string, n refNode) error {
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
