package kurrentdb_test

import (
	"errors"
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestHiddenStreamIsNeverTakenForNew: a soft-deleted stream, or one whose $tb
// lies past its events, hides them from reads but not from the server's
// idempotency check, which compares event IDs ignoring metadata. A no_stream
// append of its event 0 is then answered as a repeat at revision 0 (without a
// position), which looked like a fresh write; a no_stream append of another
// event un-deletes a soft-deleted stream and is written at N+1, which the
// backend took for revision N+1 of a new stream; and a read from 0 of a stream
// truncated entirely found nothing, as for a stream never written. Each is now
// ErrStreamTruncated, and so is a read of a soft-deleted stream, which the
// server answers not found as for a stream never written (the backend reads
// its metadata then). On the old backend the appends succeeded (revision 0,
// position Start; revision 1), the read of the $tb-truncated stream returned
// no events and no error, and the soft-deleted one read as not found.
func TestHiddenStreamIsNeverTakenForNew(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	c := kurrenttest.Client(t, srv.ConnectionString())
	claim := ev("KeyClaimed")
	hide := map[string]func(stream string){
		"soft delete": func(stream string) {
			if _, err := c.DeleteStream(ctxT(t), stream, esdb.DeleteStreamOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		"$tb past it": func(stream string) {
			var m esdb.StreamMetadata
			m.SetTruncateBefore(1)
			if _, err := c.SetStreamMetadata(ctxT(t), stream, esdb.AppendToStreamOptions{}, m); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, hideIt := range hide {
		t.Run(name, func(t *testing.T) {
			stream := "key-" + uuid.NewString()
			mustAppend(t, s, stream, eventstore.NoStream, claim)
			hideIt(stream)
			_, err := s.ReadStream(ctxT(t), stream, 0, eventstore.Forwards, 1)
			switch name {
			case "soft delete": // the server answers not found; its metadata tells
				if !errors.Is(err, kurrentdb.ErrStreamTruncated) || errors.Is(err, eventstore.ErrStreamNotFound) {
					t.Fatalf("read of a soft-deleted stream: %v, want ErrStreamTruncated, not not found", err)
				}
				if _, err := s.ReadStream(ctxT(t), "never-"+stream, 0, eventstore.Forwards, 1); !errors.Is(err, eventstore.ErrStreamNotFound) {
					t.Fatalf("read of a stream never written: %v, want not found", err)
				}
			default:
				if !errors.Is(err, kurrentdb.ErrStreamTruncated) {
					t.Fatalf("read from 0 of a stream truncated entirely: %v, want ErrStreamTruncated", err)
				}
			}
			if res, err := s.Append(ctxT(t), stream, eventstore.NoStream, []eventstore.EventData{claim}); !errors.Is(err, kurrentdb.ErrStreamTruncated) {
				t.Fatalf("no_stream append of the hidden event 0: %+v, %v; want ErrStreamTruncated", res, err)
			}
			res, err := s.Append(ctxT(t), stream, eventstore.NoStream, []eventstore.EventData{ev("KeyClaimed")})
			var wrong *eventstore.WrongExpectedRevisionError
			switch name {
			case "soft delete": // written at 1, the stream un-deleted with $tb 1
				if !errors.Is(err, kurrentdb.ErrStreamTruncated) {
					t.Fatalf("no_stream append of another event: %+v, %v; want ErrStreamTruncated", res, err)
				}
				if _, err := s.ReadStream(ctxT(t), stream, 0, eventstore.Forwards, 1); !errors.Is(err, kurrentdb.ErrStreamTruncated) {
					t.Fatalf("read of the un-deleted stream from 0: %v, want ErrStreamTruncated", err)
				}
			default:
				if !errors.As(err, &wrong) || wrong.Actual != 0 {
					t.Fatalf("no_stream append of another event: %+v, %v; want a wrong expected revision at 0", res, err)
				}
			}
		})
	}
}
