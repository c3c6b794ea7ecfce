package domain

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// DecodeMetadata parses event metadata.
func DecodeMetadata(b []byte) (Metadata, error) { return decodeEventMetadata(b, true) }

// DecodeMetadataNoRequest parses event metadata but its canonical request
// (Request stays nil): what the read side (projections, audit) reads of every
// event, where the request's base64 would cost more than the rest.
func DecodeMetadataNoRequest(b []byte) (Metadata, error) { return decodeEventMetadata(b, false) }

// decodeEventMetadata is DecodeMetadata's one home. The metadata the ledger writes
// is a flat object of plain strings, integers and booleans: that shape is read
// without encoding/json (metadataFast); anything else (escapes, null, unknown
// or repeated names, a name in another case, invalid UTF-8, a value of the
// wrong kind) goes through encoding/json, which decides it. On the bodies the
// fast path takes it yields what encoding/json yields (TestMetadataFastAgrees,
// FuzzDecodeMetadata).
func decodeEventMetadata(b []byte, request bool) (Metadata, error) {
	if m, ok := metadataFast(b, request); ok {
		return m, nil
	}
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		return Metadata{}, fmt.Errorf("domain: metadata: %w", err)
	}
	if !request {
		m.Request = nil
	}
	return m, nil
}

// metadataMembers bounds the members metadataFast reads: more than Metadata
// has fields is a repeated or unknown name, which the general path decides.
const metadataMembers = 16

// metadataFast decodes a flat metadata object (decodeMetadata); false for any
// other body.
func metadataFast(b []byte, request bool) (Metadata, bool) {
	var buf [metadataMembers]bodyField
	fields, ok := flatMembers(b, buf[:])
	if !ok {
		return Metadata{}, false
	}
	var m Metadata
	for _, f := range fields {
		if f.str && !utf8.Valid(f.value) {
			return Metadata{}, false // encoding/json replaces invalid bytes
		}
		if !m.setFast(f, request) {
			return Metadata{}, false
		}
	}
	return m, true
}

// setFast sets the field f names from its value; false for a name Metadata
// does not have (as spelled in its tags) or a value encoding/json would refuse
// or read otherwise.
func (m *Metadata) setFast(f bodyField, request bool) bool {
	switch name := string(f.name); name {
	case "command", "producer":
		if !f.str {
			return false
		}
		*m.stringField(name) = repeated.value(f.value)
	case "key", "request_hash", "origin", "chain", "subject":
		if !f.str {
			return false
		}
		*m.stringField(name) = string(f.value)
	case "i", "n", "schema":
		return !f.str && metadataInt(f.value, m.intField(name))
	case "at", "effective_at":
		var t time.Time
		if !f.str || t.UnmarshalText(f.value) != nil { // encoding/json's parser of a time
			return false
		}
		m.setTime(name, t)
	case "claimed":
		if f.str || f.value[0] == '-' || f.value[0] >= '0' && f.value[0] <= '9' {
			return false
		}
		m.Claimed = string(f.value) == "true"
	case "request":
		return f.str && (!request || m.setRequest(f.value))
	default:
		return false
	}
	return true
}

func (m *Metadata) stringField(name string) *string {
	switch name {
	case "key":
		return &m.Key
	case "command":
		return &m.Command
	case "request_hash":
		return &m.RequestHash
	case "origin":
		return &m.Origin
	case "chain":
		return &m.Chain
	case "producer":
		return &m.Producer
	}
	return &m.Subject
}

func (m *Metadata) intField(name string) *int {
	switch name {
	case "i":
		return &m.Index
	case "n":
		return &m.Count
	}
	return &m.Schema
}

func (m *Metadata) setTime(name string, t time.Time) {
	if name == "at" {
		m.At = t
		return
	}
	effective := t // its own variable: t, taken by address, would be one every time
	m.EffectiveAt = &effective
}

// setRequest decodes the request's base64, as encoding/json decodes a []byte.
func (m *Metadata) setRequest(v []byte) bool {
	out := make([]byte, base64.StdEncoding.DecodedLen(len(v)))
	n, err := base64.StdEncoding.Decode(out, v)
	if err != nil {
		return false
	}
	m.Request = out[:n]
	return true
}

// metadataInt reads a JSON integer (or a boolean literal, refused) into an int.
func metadataInt(v []byte, dst *int) bool {
	n, err := strconv.ParseInt(string(v), 10, strconv.IntSize)
	if err != nil {
		return false
	}
	*dst = int(n)
	return true
}
