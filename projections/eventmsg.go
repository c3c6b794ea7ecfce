package projections

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// EventMsg is the message of one event on LEDGER_EVENTS (the publisher's, and
// a repair's: ledger audit --events-out --repair). Its body is
// json.Marshal(EventMessage{...}) byte for byte, written without reflection:
// the publisher writes one per event, and json.Marshal would scan the data
// twice (json.Valid, then its compaction) and the metadata twice (json.Unmarshal
// validates before it decodes).
func EventMsg(re eventstore.RecordedEvent) (*nats.Msg, error) {
	key, at, err := keyAndAt(re.Metadata)
	if err != nil {
		return nil, fmt.Errorf("publisher: %s@%d: metadata: %w", re.Stream, re.Revision, err)
	}
	pos := re.Position.String()
	body, err := eventBody(re, pos, key, at)
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(EventSubject(re.Stream, re.Type))
	msg.Data = body
	msg.Header.Set(HeaderPosition, pos)
	return msg, nil
}

// eventBody writes the fields of EventMessage in its order, as json.Marshal does.
func eventBody(re eventstore.RecordedEvent, pos, key string, at time.Time) ([]byte, error) {
	b := make([]byte, 0, 160+len(re.Stream)+len(re.Type)+len(re.Data)+len(key))
	b = append(b, `{"id":"`...)
	b = append(b, re.ID.String()...)
	b = append(b, `","stream":`...)
	b = domain.AppendJSONString(b, re.Stream)
	b = append(b, `,"revision":`...)
	b = strconv.AppendUint(b, re.Revision, 10)
	b = append(b, `,"position":`...)
	b = domain.AppendJSONString(b, pos)
	b = append(b, `,"type":`...)
	b = domain.AppendJSONString(b, re.Type)
	b = append(b, `,"data":`...)
	b, err := appendRawJSON(b, re.Data)
	if err != nil {
		return nil, fmt.Errorf("publisher: %s@%d: data is not JSON: %w", re.Stream, re.Revision, err)
	}
	b = append(b, `,"idempotency_key":`...)
	b = domain.AppendJSONString(b, key)
	b = append(b, `,"at":"`...)
	if b, err = at.AppendText(b); err != nil { // what Time.MarshalJSON writes between its quotes
		return nil, fmt.Errorf("publisher: %s@%d: metadata: at: %w", re.Stream, re.Revision, err)
	}
	return append(b, `"}`...), nil
}

// appendRawJSON appends raw as json.Marshal writes a json.RawMessage: checked
// and compacted in one pass (json.Compact), its HTML characters and U+2028/U+2029
// escaped (json.HTMLEscape) when it has any.
func appendRawJSON(b []byte, raw []byte) ([]byte, error) {
	out := bytes.NewBuffer(b)
	if err := json.Compact(out, raw); err != nil {
		return nil, err
	}
	if !bytes.ContainsAny(raw, "<>&\u2028\u2029") {
		return out.Bytes(), nil
	}
	compact := bytes.Clone(out.Bytes()[len(b):])
	out.Truncate(len(b))
	json.HTMLEscape(out, compact)
	return out.Bytes(), nil
}

// keyAndAt reads the metadata's "key" and "at" as json.Unmarshal into
// struct{Key string; At time.Time} does. The ledger's own metadata
// (domain.EncodeMetadata) is read in one pass over its top-level members
// (plainMembers); whatever that pass does not take plainly goes to
// json.Unmarshal. The pass checks the values it skips for their strings and
// nesting only: metadata is the ledger's, and only the key and time are read.
func keyAndAt(meta []byte) (string, time.Time, error) {
	var m struct {
		Key string    `json:"key"`
		At  time.Time `json:"at"`
	}
	if len(meta) == 0 {
		return "", m.At, nil
	}
	key, at, ok := plainMembers(meta)
	if !ok {
		err := json.Unmarshal(meta, &m)
		return m.Key, m.At, err
	}
	if at != nil {
		if err := m.At.UnmarshalText(at); err != nil { // Time.UnmarshalJSON's parse
			return "", m.At, fmt.Errorf("at: %w", err)
		}
	}
	return string(key), m.At, nil
}

// plainMembers walks a JSON object's members and returns the strings of "key"
// and "at" (nil when absent), false when the object is not plain: a member
// name or one of those strings with an escape or a byte outside printable
// ASCII, a name that matches them only in another case, a key or time that is
// not a string, or anything malformed.
func plainMembers(b []byte) (key, at []byte, ok bool) {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return nil, nil, false
	}
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] != '}' {
		name, j, plain := plainString(b, i)
		if j = skipSpace(b, j); !plain || j == len(b) || b[j] != ':' {
			return nil, nil, false
		}
		i = skipSpace(b, j+1)
		switch {
		case string(name) == "key":
			key, i, plain = plainString(b, i)
		case string(name) == "at":
			at, i, plain = plainString(b, i)
		case len(name) <= 3 && (bytes.EqualFold(name, []byte("key")) || bytes.EqualFold(name, []byte("at"))):
			return nil, nil, false
		default:
			i, plain = skipValue(b, i)
		}
		if i = skipSpace(b, i); !plain || i == len(b) {
			return nil, nil, false
		}
		if b[i] == ',' {
			if i = skipSpace(b, i+1); i < len(b) && b[i] == '}' { // a trailing comma
				return nil, nil, false
			}
		} else if b[i] != '}' {
			return nil, nil, false
		}
	}
	return key, at, i < len(b) && skipSpace(b, i+1) == len(b)
}

// plainString reads the string at b[i] when it holds printable ASCII only
// without escapes; j is the index after it.
func plainString(b []byte, i int) (s []byte, j int, ok bool) {
	if i == len(b) || b[i] != '"' {
		return nil, i, false
	}
	for j = i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, j, false
		}
	}
	return nil, j, false
}

// skipValue steps over the value at b[i]: a string (escapes included), an
// object or array (strings and nesting followed), or a number or literal.
func skipValue(b []byte, i int) (int, bool) {
	depth := 0
	for start := i; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			if i = skipString(b, i); i < 0 {
				return 0, false
			}
			i-- // the loop steps past the closing quote
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i, i > start
			}
			depth--
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, i > start
			}
		}
		if depth == 0 && (b[i] == '"' || b[i] == '}' || b[i] == ']') {
			return i + 1, true
		}
	}
	return 0, false
}

// skipString returns the index after the string at b[i], -1 when it is not
// closed.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
