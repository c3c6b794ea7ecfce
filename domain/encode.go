package domain

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
)

// EncodeMetadata is json.Marshal(m), byte for byte, written field by field
// without reflection (the ledger encodes metadata for every event it writes).
func EncodeMetadata(m Metadata) ([]byte, error) {
	size := 195 + len(m.Key) + len(m.Command) + len(m.RequestHash) + len(m.Origin) + len(m.Chain) + len(m.Producer) + len(m.Subject) + base64.StdEncoding.EncodedLen(len(m.Request))
	b := make([]byte, 0, size)
	b = append(b, `{"key":`...)
	b = AppendJSONString(b, m.Key)
	b = append(b, `,"command":`...)
	b = AppendJSONString(b, m.Command)
	b = append(b, `,"request_hash":`...)
	b = AppendJSONString(b, m.RequestHash)
	b = append(b, `,"i":`...)
	b = strconv.AppendInt(b, int64(m.Index), 10)
	b = append(b, `,"n":`...)
	b = strconv.AppendInt(b, int64(m.Count), 10)
	b = append(b, `,"at":"`...)
	b, err := m.At.AppendText(b) // what Time.MarshalJSON writes between its quotes
	if err != nil {
		return json.Marshal(m) // json.Marshal's own error
	}
	b = append(b, '"')
	if m.Origin != "" {
		b = append(b, `,"origin":`...)
		b = AppendJSONString(b, m.Origin)
	}
	if len(m.Request) > 0 {
		b = append(b, `,"request":"`...)
		b = base64.StdEncoding.AppendEncode(b, m.Request)
		b = append(b, '"')
	}
	if m.Chain != "" {
		b = append(b, `,"chain":`...)
		b = AppendJSONString(b, m.Chain)
	}
	if m.Schema != 0 {
		b = append(b, `,"schema":`...)
		b = strconv.AppendInt(b, int64(m.Schema), 10)
	}
	if m.Producer != "" {
		b = append(b, `,"producer":`...)
		b = AppendJSONString(b, m.Producer)
	}
	if m.Claimed {
		b = append(b, `,"claimed":true`...)
	}
	if m.Subject != "" {
		b = append(b, `,"subject":`...)
		b = AppendJSONString(b, m.Subject)
	}
	if m.EffectiveAt != nil {
		b = append(b, `,"effective_at":"`...)
		if b, err = m.EffectiveAt.AppendText(b); err != nil {
			return json.Marshal(m)
		}
		b = append(b, '"')
	}
	return append(b, '}'), nil
}

// EncodeKeyClaimed is json.Marshal(KeyClaimed{Key: key, Command: command,
// RequestHash: req.Hash, Request: req.JSON, Stream: stream, Revision: &revision}),
// byte for byte.
// json.Marshal compacts a raw message (escaping HTML characters); req.JSON is
// canonical JSON, already compact and escaped that way, so it goes in as it is.
func EncodeKeyClaimed(key, command string, req Canonical, stream string, revision uint64) []byte {
	b := make([]byte, 0, 96+len(key)+len(command)+len(req.Hash)+len(req.JSON)+len(stream))
	b = append(b, `{"key":`...)
	b = AppendJSONString(b, key)
	b = append(b, `,"command":`...)
	b = AppendJSONString(b, command)
	b = append(b, `,"request_hash":`...)
	b = AppendJSONString(b, req.Hash)
	b = append(b, `,"request":`...)
	b = append(b, req.JSON...)
	b = append(b, `,"stream":`...)
	b = AppendJSONString(b, stream)
	b = append(b, `,"revision":`...)
	b = strconv.AppendUint(b, revision, 10)
	return append(b, '}')
}
