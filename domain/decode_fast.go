package domain

import (
	"bytes"
	"encoding/binary"
	"time"
)

// decodeFast decodes the common shape of a command body without encoding/json: one
// flat object whose values are plain strings (no escapes) and JSON integers, each
// name known for the command and given once, every value within its limits. It
// reports ok only for such bodies; for anything else (escapes, null, nested values,
// fractions, unknown or repeated names, a limit broken, malformed JSON) it gives up
// and DecodeCommand takes the strict general path, which accepts or rejects the
// body with its own error. So the fast path never decides a rejection, and on the
// bodies it accepts it yields the Command the general path yields (tested).
func decodeFast(t CommandType, specs []fieldSpec, body []byte) (Command, bool) {
	var buf [12]bodyField
	fields, ok := flatMembers(body, buf[:])
	if !ok {
		return Command{}, false
	}
	cmd := Command{Type: t}
	if !cmd.setFields(specs, fields) {
		return Command{}, false
	}
	return cmd, true
}

// flatMembers reads the members of a flat body (decodeFast) into buf, at most
// len(buf) of them, each name once; false for any other body.
func flatMembers(body []byte, buf []bodyField) ([]bodyField, bool) {
	n, sc := 0, flatScan{b: body}
	ok := sc.object(func(f bodyField) bool {
		if n == len(buf) || hasMember(buf[:n], f.name) {
			return false
		}
		buf[n] = f
		n++
		return true
	})
	if !ok {
		return nil, false
	}
	return buf[:n], true
}

// bodyField is one member of a flat command body as decodeFast reads it: its name,
// its value (a string's content without the quotes, or an integer's text) and
// whether the value is a string.
type bodyField struct {
	name, value []byte
	str         bool
}

// flatScan reads a flat body (decodeFast) front to back: b is the body and i
// the index of the next byte to read. Each read advances i past what it read
// when it succeeds; a read that fails leaves i undefined, and decodeFast gives
// up on the body.
type flatScan struct {
	b []byte
	i int
}

// objectStart reads the opening brace of a body's object up to its first
// member; false when body does not start an object or the object is empty (it
// has no idempotency key: the general path says so).
func (sc *flatScan) objectStart() bool {
	sc.i = skipSpace(sc.b, 0)
	if sc.i >= len(sc.b) || sc.b[sc.i] != '{' {
		return false
	}
	sc.i = skipSpace(sc.b, sc.i+1)
	return sc.i >= len(sc.b) || sc.b[sc.i] != '}'
}

// object reads a whole flat object, each of its members in turn handed to
// take, which may refuse it (false); false when take refuses one or the
// object is not flat (the loop of flatMembers and flatObject).
func (sc *flatScan) object(take func(bodyField) bool) bool {
	if !sc.objectStart() {
		return false
	}
	for more := true; more; {
		f, ok := sc.member()
		if !ok || !take(f) {
			return false
		}
		if more, ok = sc.afterMember(); !ok {
			return false
		}
	}
	return true
}

// member reads one member, "name": value.
func (sc *flatScan) member() (bodyField, bool) {
	name, ok := sc.memberName()
	if !ok {
		return bodyField{}, false
	}
	f := bodyField{name: name}
	return f, sc.memberValue(&f)
}

// memberName reads a member's name and the colon after it, up to its value.
func (sc *flatScan) memberName() ([]byte, bool) {
	name, ok := sc.plainString()
	if !ok {
		return nil, false
	}
	if sc.i = skipSpace(sc.b, sc.i); sc.i >= len(sc.b) || sc.b[sc.i] != ':' {
		return nil, false
	}
	sc.i = skipSpace(sc.b, sc.i+1)
	return name, true
}

// afterMember reads what follows a member: a comma up to the next member
// (more), or the closing brace of the object with nothing but space after it
// (not more); false for anything else.
func (sc *flatScan) afterMember() (more, ok bool) {
	sc.i = skipSpace(sc.b, sc.i)
	if sc.i >= len(sc.b) {
		return false, false
	}
	switch sc.b[sc.i] {
	case ',':
		sc.i = skipSpace(sc.b, sc.i+1)
		return true, true
	case '}':
		return false, skipSpace(sc.b, sc.i+1) == len(sc.b)
	}
	return false, false
}

// memberValue reads the value of a member into f: a plain string (its
// content, str), an integer or the literal true or false (the text, not str).
func (sc *flatScan) memberValue(f *bodyField) bool {
	var ok bool
	if sc.i < len(sc.b) && sc.b[sc.i] == '"' {
		f.value, ok = sc.plainString()
		f.str = true
		return ok
	}
	for _, lit := range [...]string{"true", "false"} {
		if j := sc.i + len(lit); j <= len(sc.b) && string(sc.b[sc.i:j]) == lit {
			f.value, sc.i = sc.b[sc.i:j], j
			return true
		}
	}
	f.value, ok = sc.jsonInteger()
	return ok
}

// hasMember reports whether one of fields is named name.
func hasMember(fields []bodyField, name []byte) bool {
	for _, g := range fields {
		if string(g.name) == string(name) {
			return true
		}
	}
	return false
}

// setFields sets the command's fields from the members of a flat body; false
// unless they are a valid idempotency key, every field that specs requires and
// only fields that specs lists, each value one that setFast takes.
func (c *Command) setFields(specs []fieldSpec, fields []bodyField) bool {
	key := memberNamed(fields, "idempotency_key")
	if key == nil || !key.str || !ValidKey(string(key.value)) {
		return false
	}
	c.IdempotencyKey = string(key.value)
	seen := 1
	for _, s := range specs {
		f := memberNamed(fields, s.name)
		if f == nil {
			if s.required {
				return false
			}
			continue
		}
		seen++
		if !c.setFast(s, f.value, f.str) {
			return false
		}
	}
	return seen == len(fields) // fewer: a name that is not the command's
}

// memberNamed is the member of fields named name, or nil.
func memberNamed(fields []bodyField, name string) *bodyField {
	for k := range fields {
		if string(fields[k].name) == name {
			return &fields[k]
		}
	}
	return nil
}

// setFast sets one field from a plain string or an integer literal, as setField
// would; false when setField would refuse it (or the value has the wrong kind).
func (c *Command) setFast(s fieldSpec, v []byte, str bool) bool {
	switch s.kind {
	case fID, fKey, fCurrency, fTime:
		if !str {
			return false
		}
	case fAmount, fLimit, fRevision:
		if str {
			return false
		}
	default: // metadata, booleans: the general path
		return false
	}
	switch s.kind {
	case fID:
		if !ValidID(string(v)) || !c.setID(s.name, string(v)) {
			return false
		}
	case fKey:
		if !ValidKey(string(v)) {
			return false
		}
		c.OriginalKey = string(v)
	case fCurrency:
		if !ValidCurrency(string(v)) {
			return false
		}
		c.Currency = string(v)
	case fAmount:
		a, err := decodeInteger(v, 1, MaxAmount)
		if err != nil {
			return false
		}
		c.Amount, c.HasAmount = a, true
	case fLimit:
		l, err := decodeInteger(v, 0, MaxAmount)
		if err != nil {
			return false
		}
		c.OverdraftLimit = l
	case fRevision:
		r, err := decodeInteger(v, 0, MaxAmount)
		if err != nil {
			return false
		}
		c.ExpectedRevision, c.HasExpectedRevision = r, true
	case fTime:
		ts, err := time.Parse(time.RFC3339Nano, string(v))
		if err != nil {
			return false
		}
		return c.setTime(s.name, ts)
	}
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string that has no escapes and no control
// characters: its content. Its end is the first quote after its start (a
// quote escaped would follow a backslash, which plainBytes refuses).
func (sc *flatScan) plainString() ([]byte, bool) {
	b, i := sc.b, sc.i
	if i >= len(b) || b[i] != '"' {
		return nil, false
	}
	n := bytes.IndexByte(b[i+1:], '"')
	if n < 0 {
		return nil, false
	}
	if s := b[i+1 : i+1+n]; plainBytes(s) {
		sc.i = i + 2 + n
		return s, true
	}
	return nil, false
}

// Bytes repeated across a word, for plainBytes.
const (
	eachByte   = 0x0101010101010101
	eachHigh   = 0x8080808080808080
	eachEscape = eachByte * '\\'
	eachSpace  = eachByte * 0x20
)

// plainBytes reports whether s, a string's content, has no backslash and no
// control character (a byte below 0x20), eight bytes at a time: a word has a
// byte below n when (x - n in each byte) &^ x has a high bit set (n <= 0x80,
// exact), and a backslash where x ^ '\\' in each byte has a zero byte.
func plainBytes(s []byte) bool {
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		y := x ^ eachEscape
		if ((x-eachSpace)&^x|(y-eachByte)&^y)&eachHigh != 0 {
			return false
		}
		s = s[8:]
	}
	for _, c := range s {
		if c == '\\' || c < 0x20 {
			return false
		}
	}
	return true
}

// jsonInteger reads a JSON number that is an integer by JSON's grammar
// (-?(0|[1-9][0-9]*), no fraction, no exponent): its text.
func (sc *flatScan) jsonInteger() ([]byte, bool) {
	b, i := sc.b, sc.i
	j := i
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
	default:
		return nil, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E' || (b[j] >= '0' && b[j] <= '9')) {
		return nil, false
	}
	sc.i = j
	return b[i:j], true
}
