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
	type field struct {
		name, value []byte
		str         bool
	}
	var fields [12]field
	n := 0
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return Command{}, false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return Command{}, false // no idempotency key: the general path says so
	}
	for {
		name, j, ok := plainString(body, i)
		if !ok || n == len(fields) {
			return Command{}, false
		}
		i = skipSpace(body, j)
		if i >= len(body) || body[i] != ':' {
			return Command{}, false
		}
		i = skipSpace(body, i+1)
		f := field{name: name}
		if i < len(body) && body[i] == '"' {
			f.value, j, ok = plainString(body, i)
			f.str = true
		} else {
			f.value, j, ok = jsonInteger(body, i)
		}
		if !ok {
			return Command{}, false
		}
		for _, g := range fields[:n] {
			if string(g.name) == string(name) {
				return Command{}, false
			}
		}
		fields[n] = f
		n++
		i = skipSpace(body, j)
		if i >= len(body) {
			return Command{}, false
		}
		if body[i] == '}' {
			break
		}
		if body[i] != ',' {
			return Command{}, false
		}
		i = skipSpace(body, i+1)
	}
	if skipSpace(body, i+1) != len(body) {
		return Command{}, false
	}
	cmd := Command{Type: t}
	seen := 0
	for _, f := range fields[:n] {
		if string(f.name) == "idempotency_key" {
			if !f.str || !ValidKey(string(f.value)) {
				return Command{}, false
			}
			cmd.IdempotencyKey = string(f.value)
			seen++
		}
	}
	if seen != 1 {
		return Command{}, false
	}
	for _, s := range specs {
		var f *field
		for k := range fields[:n] {
			if string(fields[k].name) == s.name {
				f = &fields[k]
				break
			}
		}
		if f == nil {
			if s.required {
				return Command{}, false
			}
			continue
		}
		seen++
		if !cmd.setFast(s, f.value, f.str) {
			return Command{}, false
		}
	}
	if seen != n { // a name that is not the command's
		return Command{}, false
	}
	return cmd, true
}

// setFast sets one field from a plain string or an integer literal, as setField
// would; false when setField would refuse it (or the value has the wrong kind).
func (c *Command) setFast(s fieldSpec, v []byte, str bool) bool {
	switch s.kind {
	case fID, fKey, fCurrency, fTime:
		if !str {
			return false
		}
	case fAmount, fLimit:
		if str {
			return false
		}
	default: // metadata: the general path
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
	case fTime:
		ts, err := time.Parse(time.RFC3339Nano, string(v))
		if err != nil {
			return false
		}
		c.ExpiresAt = ts.UTC()
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
