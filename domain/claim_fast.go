package domain

import (
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// DecodeKeyClaimed decodes a key stream's claim as encoding/json decodes it
// into a KeyClaimed, refusing what encoding/json refuses. The claim the ledger
// writes is a flat object of plain strings, an integer (revision) and the
// request, an object kept raw: that shape is read without encoding/json's
// reflection (claimFast); anything else (escapes, null, unknown or repeated
// names, a name in another case, invalid UTF-8, a value of another kind) goes
// through encoding/json, which decides it. On the bodies the fast path takes
// it yields what encoding/json yields (TestKeyClaimedFastAgrees). The audit
// reads every claim of the history with it.
//
// The claim and its revision are one allocation (claimed): the audit boxes
// every claim of the history and keeps none.
func DecodeKeyClaimed(b []byte) (*KeyClaimed, error) {
	d := new(claimed)
	if claimFast(b, d) {
		return &d.c, nil
	}
	d.c = KeyClaimed{}
	if err := json.Unmarshal(b, &d.c); err != nil {
		return nil, fmt.Errorf("domain: claim: %w", err)
	}
	return &d.c, nil
}

// claimed is a decoded claim and the storage its revision points to.
type claimed struct {
	c   KeyClaimed
	rev uint64
}

// claimFast decodes a flat claim into d (DecodeKeyClaimed); false for any
// other body, d then partly set. Its text fields (claimText) are made strings
// together, in one allocation.
func claimFast(b []byte, d *claimed) bool {
	c := &d.c
	var text claimText
	sc := flatScan{b: b}
	if !sc.objectStart() {
		return false
	}
	var seen uint8
	for more := true; more; {
		name, ok := sc.memberName()
		if !ok {
			return false
		}
		bit, ok := c.setFast(&sc, string(name), &text, &d.rev)
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		if more, ok = sc.afterMember(); !ok {
			return false
		}
	}
	c.Key, c.RequestHash, c.Stream = text.strings()
	return true
}

// claimText are a claim's key, request hash and stream as the fast path
// reads them (views of the body), made strings at the end (strings).
type claimText [3][]byte

// strings returns the three as strings that share one allocation (the audit
// reads every claim of the history, and keeps none of them): one copy of
// their bytes, each string a slice of it. What keeps one keeps the three.
func (t *claimText) strings() (key, requestHash, stream string) {
	var buf [256]byte // the bytes copied, on the stack unless longer
	all := append(append(append(buf[:0], t[0]...), t[1]...), t[2]...)
	s := string(all)
	k, h := len(t[0]), len(t[0])+len(t[1])
	return s[:k], s[k:h], s[h:]
}

// setFast reads the value of the member name into its field and returns the
// field's bit (a repeated name is the general path's); false for a name
// KeyClaimed does not have (as spelled in its tags) or a value the fast path
// leaves to encoding/json.
func (c *KeyClaimed) setFast(sc *flatScan, name string, text *claimText, rev *uint64) (uint8, bool) {
	var dst *[]byte // the command is interned instead (dst nil)
	var bit uint8
	switch name {
	case "key":
		dst, bit = &text[0], 1
	case "command":
		bit = 2
	case "request_hash":
		dst, bit = &text[1], 4
	case "stream":
		dst, bit = &text[2], 8
	case "revision":
		v, ok := sc.jsonInteger()
		if !ok || v[0] == '-' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(v), 10, 64)
		*rev = n
		c.Revision = rev
		return 16, err == nil
	case "request":
		raw, ok := sc.rawObject()
		c.Request = raw
		return 32, ok
	default:
		return 0, false
	}
	v, ok := sc.plainString()
	if !ok || !utf8.Valid(v) { // encoding/json replaces invalid bytes
		return 0, false
	}
	if dst == nil { // the command: one of the few, interned
		c.Command = repeated.value(v)
	} else {
		*dst = v
	}
	return bit, true
}

// rawObject reads a JSON object as encoding/json reads one into a
// json.RawMessage: a copy of its text, which must be valid JSON (a flat
// object is, flatObject; any other is json.Valid's to decide).
func (sc *flatScan) rawObject() ([]byte, bool) {
	b, start := sc.b, sc.i
	end := closing(b, start)
	if end < 0 || b[start] != '{' {
		return nil, false
	}
	raw := b[start:end]
	sc.i = end
	return append([]byte(nil), raw...), flatObject(raw) || json.Valid(raw)
}

// flatObject reports whether b is a flat object of the members flatScan
// reads (plain strings, integers, true and false), which is valid JSON: the
// request a claim holds is one (a command's body), read without
// encoding/json's scanner. False says nothing: json.Valid decides.
func flatObject(b []byte) bool {
	sc := flatScan{b: b}
	return sc.object(func(bodyField) bool { return true })
}

// closing is the index just past the object or array that starts at b[start],
// read as JSON (its strings skipped, their escapes too); -1 when b[start] opens
// none, or it is not closed. It does not validate what it skips.
func closing(b []byte, start int) int {
	if start >= len(b) || (b[start] != '{' && b[start] != '[') {
		return -1
	}
	depth, inString := 0, false
	for j := start; j < len(b); j++ {
		switch c := b[j]; {
		case inString && c == '\\':
			j++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return j + 1
			}
		}
	}
	return -1
}
