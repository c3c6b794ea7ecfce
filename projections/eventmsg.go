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
// twice (json.Valid, then its compaction). The key and time come from the
// metadata as the read side decodes it (domain.DecodeMetadataNoRequest).
func EventMsg(re eventstore.RecordedEvent) (*nats.Msg, error) {
	var m domain.Metadata
	if len(re.Metadata) > 0 {
		var err error
		if m, err = domain.DecodeMetadataNoRequest(re.Metadata); err != nil {
			return nil, fmt.Errorf("publisher: %s@%d: %w", re.Stream, re.Revision, err)
		}
	}
	pos := re.Position.String()
	body, err := eventBody(re, pos, m.Key, m.At)
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
