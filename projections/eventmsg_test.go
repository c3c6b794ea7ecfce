package projections_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// ledgerEvent is an event as the ledger writes it: a credit with the
// command's canonical request in its metadata (the first event of a command).
func ledgerEvent(t testing.TB) eventstore.RecordedEvent {
	t.Helper()
	held := int64(0)
	data, err := json.Marshal(domain.Credited{Amount: 1234, Currency: "EUR", Reason: "deposit", BalanceAfter: 98765, HeldAfter: &held,
		Metadata: map[string]string{"order": "o-123", "note": "settlement <March> & co"}})
	if err != nil {
		t.Fatal(err)
	}
	eff := time.Date(2021, 3, 31, 23, 59, 0, 0, time.UTC)
	meta, err := domain.EncodeMetadata(domain.Metadata{Key: "dep-42", Command: "deposit", RequestHash: strings.Repeat("ab", 32),
		Index: 0, Count: 1, At: time.Date(2026, 11, 27, 1, 2, 3, 456789000, time.UTC),
		Request:  []byte(`{"account_id":"merchant-7","amount":1234,"currency":"EUR","idempotency_key":"dep-42","type":"deposit"}`),
		Producer: "ledger-1", EffectiveAt: &eff})
	if err != nil {
		t.Fatal(err)
	}
	return eventstore.RecordedEvent{ID: uuid.New(), Stream: "account-merchant-7", Revision: 41, Type: "Credited",
		Position: eventstore.Position{Commit: 9876, Prepare: 5432}, Data: data, Metadata: meta, Created: time.Now()}
}

// marshalled is the body EventMsg must write: json.Marshal of the message,
// the key and time read from the metadata with json.Unmarshal.
func marshalled(t *testing.T, re eventstore.RecordedEvent) string {
	t.Helper()
	var m struct {
		Key string    `json:"key"`
		At  time.Time `json:"at"`
	}
	if len(re.Metadata) > 0 {
		if err := json.Unmarshal(re.Metadata, &m); err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(projections.EventMessage{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Position: re.Position.String(),
		Type: re.Type, Data: json.RawMessage(re.Data), IdempotencyKey: m.Key, At: m.At})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEventMsgBodyIsTheMarshalledMessage(t *testing.T) {
	base := ledgerEvent(t)
	with := func(f func(*eventstore.RecordedEvent)) eventstore.RecordedEvent {
		re := base
		f(&re)
		return re
	}
	for name, re := range map[string]eventstore.RecordedEvent{
		"ledger's":    base,
		"no metadata": with(func(re *eventstore.RecordedEvent) { re.Metadata = nil }),
		"metadata of another writer": with(func(re *eventstore.RecordedEvent) {
			re.Metadata = []byte(` { "at" : "2020-01-02T03:04:05+01:00", "x": [1, {"key": "inner"}], "key": "k\u00e9\"<y>" } `)
		}),
		"metadata with escapes in key": with(func(re *eventstore.RecordedEvent) {
			re.Metadata = []byte(`{"key":"a\u0041\n\"b","at":"2026-01-01T00:00:00Z"}`)
		}),
		"metadata without at":   with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(`{"key":"k"}`) }),
		"metadata empty object": with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(` {} `) }),
		"metadata names in other case": with(func(re *eventstore.RecordedEvent) {
			re.Metadata = []byte(`{"key":"a","KEY":"b","At":"2026-01-01T00:00:00Z"}`)
		}),
		"metadata key twice": with(func(re *eventstore.RecordedEvent) {
			re.Metadata = []byte(`{"key":"a","x":{"key":"x","y":["}",{}]},"key":"b"}`)
		}),
		"metadata key null": with(func(re *eventstore.RecordedEvent) {
			re.Metadata = []byte(`{"key":null,"at":"2026-01-01T00:00:00.5+02:00"}`)
		}),
		"metadata key not ASCII": with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte("{\"key\":\"caf\u00e9 \xff\"}") }),
		"data with white space":  with(func(re *eventstore.RecordedEvent) { re.Data = []byte("{ \"a\" :\t[1, 2 ],\n\"b\": \"x y\" }") }),
		"data with U+2028":       with(func(re *eventstore.RecordedEvent) { re.Data = []byte("{\"a\":\"line\u2028sep\"}") }),
		"data with escapes": with(func(re *eventstore.RecordedEvent) {
			re.Data = []byte(`{"a":"\u003c\n\"\\","b":-1.5e3,"c":null,"d":true}`)
		}),
		"stream and type to be escaped": with(func(re *eventstore.RecordedEvent) { re.Stream, re.Type = "account-<é>\"&", "Type\u2029" }),
	} {
		t.Run(name, func(t *testing.T) {
			msg, err := projections.EventMsg(re)
			if err != nil {
				t.Fatal(err)
			}
			if want := marshalled(t, re); string(msg.Data) != want {
				t.Fatalf("body\n%s\nwant\n%s", msg.Data, want)
			}
		})
	}
	for name, re := range map[string]eventstore.RecordedEvent{
		"data not JSON":          with(func(re *eventstore.RecordedEvent) { re.Data = []byte(`{"a":1`) }),
		"data empty":             with(func(re *eventstore.RecordedEvent) { re.Data = nil }),
		"data two values":        with(func(re *eventstore.RecordedEvent) { re.Data = []byte(`{} {}`) }),
		"metadata not JSON":      with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(`{"key":"k",`) }),
		"metadata key no string": with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(`{"key":5}`) }),
		"metadata at no time":    with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(`{"key":"k","at":"yesterday"}`) }),
		"metadata at empty":      with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(`{"key":"k","at":""}`) }),
		"metadata after object":  with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(`{"key":"k"} x`) }),
		"metadata trailing ,":    with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(`{"key":"k",}`) }),
		"metadata an array":      with(func(re *eventstore.RecordedEvent) { re.Metadata = []byte(`["key","k"]`) }),
		"data after value":       with(func(re *eventstore.RecordedEvent) { re.Data = []byte(`{"a":1}x`) }),
	} {
		t.Run(name, func(t *testing.T) {
			if msg, err := projections.EventMsg(re); err == nil {
				t.Fatalf("EventMsg accepted it: %s", msg.Data)
			}
		})
	}
}

// BenchmarkEventMsg is the publisher's cost per event, the ledger's events:
//
//	go test -run '^$' -bench EventMsg -benchmem ./projections/
func BenchmarkEventMsg(b *testing.B) {
	re := ledgerEvent(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := projections.EventMsg(re); err != nil {
			b.Fatal(err)
		}
	}
}
