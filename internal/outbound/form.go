package outbound

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/throttler-dev/throttler/internal/config"
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
//
// It runs on every attempt of a form downstream, so it checks the payload
// with json.Valid (no allocation) and then walks the bytes themselves,
// writing as it goes: no tokens, no tree. Strings are unescaped exactly as
// encoding/json does (invalid UTF-8 and lone surrogates become U+FFFD);
// FuzzEncodeFormAgainstReference holds it to the json.Decoder version it
// replaced.
func EncodeForm(payload json.RawMessage, arrays string) ([]byte, error) {
	if !json.Valid(payload) {
		return nil, notOneJSONValue(payload)
	}
	s := formScanner{in: payload, indexed: arrays == config.FormIndexed}
	s.space()
	if s.in[s.pos] != '{' {
		return nil, errors.New("must be a JSON object for body = \"form\" (its members become the form's fields)")
	}
	// Escaping grows URLs and non-ASCII text; dropping quotes, colons and
	// commas shrinks the rest: half again is rarely outgrown.
	s.out = make([]byte, 0, len(payload)+len(payload)/2)
	s.key = s.keyBuf[:0]
	if err := s.object(); err != nil {
		return nil, err
	}
	if len(s.out) == 0 {
		return nil, nil // as before: an empty form is no body bytes at all
	}
	return s.out, nil
}

// notOneJSONValue says why json.Valid refused payload: a syntax error, or
// a second value after the first. Only refused payloads come here.
func notOneJSONValue(payload []byte) error {
	var first json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&first); err != nil {
		return fmt.Errorf("is not JSON: %v", err)
	}
	return errors.New("is not one JSON value: something follows it")
}

// formScanner walks a payload that json.Valid accepted, so it looks at
// each byte once and never meets a syntax error.
type formScanner struct {
	in      []byte
	pos     int
	indexed bool
	key     []byte // the current key, already form-escaped: a%5Bb%5D
	out     []byte
	text    []byte // a string unescaped, when it held an escape
	keyBuf  [64]byte
}

func (s *formScanner) space() {
	for s.pos < len(s.in) {
		switch s.in[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// object writes the members of the object at s.pos, each under the
// current key. Escaping is byte by byte, so escape(prefix[name]) is
// escape(prefix) %5B escape(name) %5D: the key grows and shrinks in
// place.
func (s *formScanner) object() error {
	prefix := len(s.key)
	s.pos++ // {
	s.space()
	if s.in[s.pos] == '}' {
		s.pos++
		return nil
	}
	for {
		s.space()
		name := s.str()
		if len(name) == 0 {
			return s.emptyName()
		}
		if prefix > 0 {
			s.key = append(s.key, "%5B"...)
			s.key = appendQueryEscape(s.key, name)
			s.key = append(s.key, "%5D"...)
		} else {
			s.key = appendQueryEscape(s.key, name)
		}
		s.space()
		s.pos++ // :
		if err := s.value(); err != nil {
			return err
		}
		s.key = s.key[:prefix]
		s.space()
		if s.in[s.pos] == '}' {
			s.pos++
			return nil
		}
		s.pos++ // ,
	}
}

// emptyName is the error for a member with an empty name, naming the
// object it is in by its key as the JSON has it (unescaped).
func (s *formScanner) emptyName() error {
	in, _ := url.QueryUnescape(string(s.key)) // QueryEscape's output: it unescapes
	return fmt.Errorf("has a member with an empty name (in %s): a form field needs a name", cmp.Or(in, "the top-level object"))
}

// array writes the elements of the array at s.pos: under key[i] if the
// downstream indexes arrays or this one holds an object or an array,
// else each under the key itself.
func (s *formScanner) array() error {
	key := len(s.key)
	index := s.indexed || s.holdsCompound()
	s.pos++ // [
	s.space()
	if s.in[s.pos] == ']' {
		s.pos++
		return nil
	}
	for i := 0; ; i++ {
		if index {
			s.key = append(s.key, "%5B"...)
			s.key = strconv.AppendInt(s.key, int64(i), 10)
			s.key = append(s.key, "%5D"...)
		}
		if err := s.value(); err != nil {
			return err
		}
		s.key = s.key[:key]
		s.space()
		if s.in[s.pos] == ']' {
			s.pos++
			return nil
		}
		s.pos++ // ,
	}
}

// holdsCompound reports whether the array at s.pos has an object or an
// array among its elements. It stops at the first one, and skips only
// plain values otherwise, so no byte is looked at twice by it.
func (s *formScanner) holdsCompound() bool {
	at := s.pos
	defer func() { s.pos = at }()
	s.pos++ // [
	for {
		s.space()
		switch s.in[s.pos] {
		case '{', '[':
			return true
		case ']':
			return false
		case ',':
			s.pos++
		case '"':
			s.skipString()
		default:
			s.skipPlain()
		}
	}
}

// value writes the value at s.pos under the current key; null writes
// nothing.
func (s *formScanner) value() error {
	s.space()
	switch s.in[s.pos] {
	case '{':
		return s.object()
	case '[':
		return s.array()
	case '"':
		s.pair(s.str())
	case 'n':
		s.pos += len("null")
	default: // a number, true or false: written as the JSON has it
		start := s.pos
		s.skipPlain()
		s.pair(s.in[start:s.pos])
	}
	return nil
}

func (s *formScanner) pair(v []byte) {
	if len(s.out) > 0 {
		s.out = append(s.out, '&')
	}
	s.out = append(s.out, s.key...)
	s.out = append(s.out, '=')
	s.out = appendQueryEscape(s.out, v)
}

// skipPlain moves past a number, true, false or null.
func (s *formScanner) skipPlain() {
	for s.pos < len(s.in) {
		switch s.in[s.pos] {
		case ',', ']', '}', ' ', '\t', '\n', '\r':
			return
		}
		s.pos++
	}
}

// skipString moves past the string at s.pos.
func (s *formScanner) skipString() {
	for s.pos++; s.in[s.pos] != '"'; s.pos++ {
		if s.in[s.pos] == '\\' {
			s.pos++ // the escaped byte; \uXXXX's digits are plain bytes
		}
	}
	s.pos++
}

// str returns the text of the string at s.pos and moves past it. Plain
// ASCII or valid UTF-8 without an escape, the usual case, is returned as
// it stands in the payload; anything else is unescaped into s.text.
func (s *formScanner) str() []byte {
	start := s.pos + 1
	plain := true
	s.pos = start
	for c := s.in[s.pos]; c != '"'; c = s.in[s.pos] {
		switch {
		case c == '\\':
			plain = false
			s.pos += 2
		case c >= utf8.RuneSelf:
			plain = false
			s.pos++
		default:
			s.pos++
		}
	}
	lit := s.in[start:s.pos]
	s.pos++
	if plain || (bytes.IndexByte(lit, '\\') < 0 && utf8.Valid(lit)) {
		return lit
	}
	s.text = unquote(s.text[:0], lit)
	return s.text
}

// unquote appends the text of a JSON string's body (without its quotes)
// as encoding/json decodes it: escapes resolved, a surrogate pair joined,
// a lone surrogate or a byte that is not UTF-8 written as U+FFFD.
func unquote(dst, lit []byte) []byte {
	for r := 0; r < len(lit); {
		c := lit[r]
		switch {
		case c == '\\' && lit[r+1] == 'u':
			rr := hex4(lit[r+2:])
			r += 6
			if utf16.IsSurrogate(rr) {
				if r+6 <= len(lit) && lit[r] == '\\' && lit[r+1] == 'u' {
					if dec := utf16.DecodeRune(rr, hex4(lit[r+2:])); dec != unicode.ReplacementChar {
						r += 6
						dst = utf8.AppendRune(dst, dec)
						continue
					}
				}
				rr = unicode.ReplacementChar
			}
			dst = utf8.AppendRune(dst, rr)
		case c == '\\':
			dst = append(dst, unescapeByte(lit[r+1]))
			r += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(lit[r:])
			dst = utf8.AppendRune(dst, rr)
			r += size
		}
	}
	return dst
}

// unescapeByte is the byte that \c stands for (c is one json.Valid
// allows).
func unescapeByte(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // " \ /
}

// hex4 reads the four hex digits of a \u escape (json.Valid checked them).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= 'a':
			c -= 'a' - 10
		case c >= 'A':
			c -= 'A' - 10
		default:
			c -= '0'
		}
		r = r<<4 | rune(c)
	}
	return r
}

// appendQueryEscape appends url.QueryEscape(string(src)) without making
// the string: letters, digits and -_.~ as they are, space as +, every
// other byte as %XX.
func appendQueryEscape(dst, src []byte) []byte {
	const upperhex = "0123456789ABCDEF"
	for _, c := range src {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.', c == '~':
			dst = append(dst, c)
		case c == ' ':
			dst = append(dst, '+')
		default:
			dst = append(dst, '%', upperhex[c>>4], upperhex[c&15])
		}
	}
	return dst
}
