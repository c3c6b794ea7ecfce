package postgres_test

import (
	"errors"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestLoad: events loaded in bulk read back as an append would have stored
// them (revisions after the expected one, subjects found); a load that names
// an event already stored, or an expected revision an append would have to
// check (Any), writes nothing.
func TestLoad(t *testing.T) {
	ctx := ctxT(t)
	s := devtest.Postgres(t)
	held := ev()
	held.Subject = "hold:h1"
	first, second := ev(), ev()
	if _, err := s.Append(ctx, "b", eventstore.NoStream, []eventstore.EventData{first}); err != nil {
		t.Fatal(err)
	}
	parts := []eventstore.StreamAppend{
		{Stream: "a", Expected: eventstore.NoStream, Events: []eventstore.EventData{ev(), held}},
		{Stream: "b", Expected: eventstore.Exact(0), Events: []eventstore.EventData{second}},
	}
	if err := s.Load(ctx, parts); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		got, err := s.ReadStream(ctx, p.Stream, 0, eventstore.Forwards, 10)
		if err != nil {
			t.Fatal(err)
		}
		last, _ := p.Expected.LastBefore()
		if len(got) != int(last)+1+len(p.Events) {
			t.Fatalf("%s: %d events, want %d", p.Stream, len(got), int(last)+1+len(p.Events))
		}
		for i, e := range p.Events {
			if g := got[int(last)+1+i]; g.ID != e.ID || g.Revision != eventstore.Revision(int(last)+1+i) || g.Type != e.Type {
				t.Fatalf("%s: event %d read back as %v at %d", p.Stream, i, g.ID, g.Revision)
			}
		}
	}
	subj, err := s.ReadStreamSubject(ctx, "a", "hold:h1", 10)
	if err != nil || len(subj) != 1 || subj[0].ID != held.ID {
		t.Fatalf("the loaded event's subject: %v %v", subj, err)
	}
	// Refused whole: a new stream beside an event ID already stored.
	again := []eventstore.StreamAppend{
		{Stream: "c", Expected: eventstore.NoStream, Events: []eventstore.EventData{ev()}},
		{Stream: "d", Expected: eventstore.NoStream, Events: []eventstore.EventData{second}},
	}
	if err := s.Load(ctx, again); err == nil {
		t.Fatal("a load of an event ID already stored succeeded")
	}
	if err := s.Load(ctx, []eventstore.StreamAppend{{Stream: "e", Expected: eventstore.Any, Events: []eventstore.EventData{ev()}}}); err == nil {
		t.Fatal("a load expecting Any succeeded")
	}
	for _, stream := range []string{"c", "d", "e"} {
		if _, err := s.ReadStream(ctx, stream, 0, eventstore.Forwards, 1); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("%s after the refused loads: %v", stream, err)
		}
	}
}
