package domain

import "time"

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
// len(buf) of them; false for any other body.
func flatMembers(body []byte, buf []bodyField) ([]bodyField, bool) {
	n := 0
	i, started := objectStart(body)
	if !started {
		return nil, false
	}
	for more := true; more; {
		name, j, ok := plainString(body, i)
		if !ok || n == len(buf) || hasMember(buf[:n], name) {
			return nil, false
		}
		if i = skipSpace(body, j); i >= len(body) || body[i] != ':' {
			return nil, false
		}
		f := bodyField{name: name}
		if f.value, f.str, j, ok = memberValue(body, skipSpace(body, i+1)); !ok {
			return nil, false
		}
		buf[n] = f
		n++
		if i, more, ok = afterMember(body, j); !ok {
			return nil, false
		}
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

// objectStart reads the opening brace of a body's object and gives the index of
// its first member; false when body does not start an object or the object is
// empty (it has no idempotency key: the general path says so).
func objectStart(body []byte) (int, bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return 0, false
	}
	return i, true
}

// afterMember reads what follows a member that ends at body[j]: a comma and the
// index of the next member (more), or the closing brace of the object with
// nothing but space after it (not more); false for anything else.
func afterMember(body []byte, j int) (next int, more, ok bool) {
	i := skipSpace(body, j)
	if i >= len(body) {
		return 0, false, false
	}
	switch body[i] {
	case ',':
		return skipSpace(body, i+1), true, true
	case '}':
		return 0, false, skipSpace(body, i+1) == len(body)
	}
	return 0, false, false
}

// memberValue reads the value of a member at body[i], a plain string (its
// content, str), an integer or the literal true or false (the text, not str),
// and the index after it.
func memberValue(body []byte, i int) (value []byte, str bool, next int, ok bool) {
	if i < len(body) && body[i] == '"' {
		value, next, ok = plainString(body, i)
		return value, true, next, ok
	}
	for _, lit := range [...]string{"true", "false"} {
		if j := i + len(lit); j <= len(body) && string(body[i:j]) == lit {
			return body[i:j], false, j, true
		}
	}
	value, next, ok = jsonInteger(body, i)
	return value, false, next, ok
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
		c.setTime(s.name, ts)
	}
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at b[i] that has no escapes and no control
// characters: its content and the index after its closing quote.
func plainString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// jsonInteger reads a JSON number at b[i] that is an integer by JSON's grammar
// (-?(0|[1-9][0-9]*), no fraction, no exponent) and the index after it.
func jsonInteger(b []byte, i int) ([]byte, int, bool) {
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
		return nil, 0, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E' || (b[j] >= '0' && b[j] <= '9')) {
		return nil, 0, false
	}
	return b[i:j], j, true
}
