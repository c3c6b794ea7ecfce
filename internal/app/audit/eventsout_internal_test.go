package audit

import (
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
)

// TestEventsOutGapKeepsItsOwnBytes: a gap the events-out check keeps holds its
// own copy of the event's data and metadata, not the read's block they came
// in (eventstore/postgres shares blocks of up to 64 KiB between a read's
// events: up to 10,000 kept gaps would keep as many blocks alive).
func TestEventsOutGapKeepsItsOwnBytes(t *testing.T) {
	block := make([]byte, 64<<10)
	copy(block[10:], `{"amount":5}`)
	copy(block[30:], `{"key":"k"}`)
	e := eventstore.RecordedEvent{ID: uuid.New(), Data: block[10:22:22], Metadata: block[30:41:41]}
	x := &eventsOut{rep: &EventsOutReport{}, gaps: map[uuid.UUID]eventstore.RecordedEvent{}, maxGaps: 10}
	x.gap(e)
	k, ok := x.gaps[e.ID]
	if !ok {
		t.Fatal("the gap was not kept")
	}
	if string(k.Data) != `{"amount":5}` || string(k.Metadata) != `{"key":"k"}` {
		t.Fatalf("kept %q, %q", k.Data, k.Metadata)
	}
	if &k.Data[0] == &block[10] || &k.Metadata[0] == &block[30] {
		t.Fatal("the kept gap's bytes are the read's block: it keeps the whole block alive")
	}
}
