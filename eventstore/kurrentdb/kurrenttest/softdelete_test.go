package kurrenttest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	api "github.com/EventStore/EventStore-Client-Go/v4/protos/streams"
	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
)

// readKinds reads a stream forwards from 0 through the generated client.
func readKinds(t *testing.T, rc api.StreamsClient, stream string) []string {
	t.Helper()
	var out []string
	for _, m := range readAllRaw(t, mustRead(t, rc, streamReadReq(stream, 0, false, 10))) {
		out = append(out, kind(m))
	}
	return out
}

// TestSoftDeleteAndUndelete: a soft delete hides the stream from reads (not
// found) but not from the IndexWriter's idempotency check: a no_stream append
// of its event 0 is answered as a repeat, without a position; one of a new
// event is written at N+1 and un-deletes the stream with $tb = N+1, hiding what
// came before. StreamExists on a soft-deleted stream is StreamDeleted, a soft
// delete of a stream that never existed a wrong expected version, and a write
// to the metadata of a soft-deleted stream un-deletes it at its head + 1.
// (Before this model the server answered Delete with Unimplemented.)
func TestSoftDeleteAndUndelete(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	c := client(t, s)
	rc := raw(t, s)
	first := ids(2)
	mustAppend(t, c, "s", esdb.NoStream{}, first...)
	if _, err := c.DeleteStream(ctxT(t), "s", esdb.DeleteStreamOptions{ExpectedRevision: esdb.Revision(1)}); err != nil {
		t.Fatal(err)
	}
	equal(t, readKinds(t, rc, "s"), []string{"stream_not_found"})

	again := rawAppend(t, rc, "s", expNoStream(), first[0]).GetSuccess()
	if again == nil || again.GetCurrentRevision() != 0 || again.GetNoPosition() == nil {
		t.Fatalf("no_stream append of event 0 of a soft-deleted stream: %+v, want revision 0 without a position", again)
	}
	equal(t, readKinds(t, rc, "s"), []string{"stream_not_found"})

	fresh := rawAppend(t, rc, "s", expNoStream(), uuid.New()).GetSuccess()
	if fresh == nil || fresh.GetCurrentRevision() != 2 || fresh.GetPosition() == nil {
		t.Fatalf("no_stream append of a new event to a soft-deleted stream: %+v, want revision 2 with a position", fresh)
	}
	equal(t, readKinds(t, rc, "s"), []string{"event:s/2"})
	meta, err := c.GetStreamMetadata(ctxT(t), "s", lastMeta)
	if err != nil || meta.TruncateBefore() == nil || *meta.TruncateBefore() != 2 {
		t.Fatalf("metadata after the un-delete: %+v, %v; want $tb 2", meta, err)
	}
	// Event 0 is now hidden by $tb: still a repeat, still without a position.
	if r := rawAppend(t, rc, "s", expNoStream(), first[0]).GetSuccess(); r == nil || r.GetNoPosition() == nil {
		t.Fatalf("no_stream append of the hidden event 0: %+v", r)
	}

	if _, err := c.DeleteStream(ctxT(t), "s", esdb.DeleteStreamOptions{ExpectedRevision: esdb.Any{}}); err != nil {
		t.Fatal(err)
	}
	_, err = c.AppendToStream(ctxT(t), "s", esdb.AppendToStreamOptions{ExpectedRevision: esdb.StreamExists{}}, events(uuid.New())...)
	var e *esdb.Error
	if !errors.As(err, &e) || e.Code() != esdb.ErrorCodeStreamDeleted {
		t.Fatalf("StreamExists append to a soft-deleted stream: %v", err)
	}
	if _, err := c.DeleteStream(ctxT(t), "never", esdb.DeleteStreamOptions{ExpectedRevision: esdb.Any{}}); err == nil || !strings.Contains(err.Error(), "WrongExpectedVersion") {
		t.Fatalf("soft delete of a stream that never existed: %v", err)
	}

	mustAppend(t, c, "m", esdb.NoStream{}, ids(3)...)
	if _, err := c.DeleteStream(ctxT(t), "m", esdb.DeleteStreamOptions{}); err != nil {
		t.Fatal(err)
	}
	var m esdb.StreamMetadata
	m.SetMaxCount(10)
	if _, err := c.SetStreamMetadata(ctxT(t), "m", esdb.AppendToStreamOptions{}, m); err != nil {
		t.Fatal(err)
	}
	equal(t, readKinds(t, rc, "m"), nil)
	meta, err = c.GetStreamMetadata(ctxT(t), "m", lastMeta)
	if err != nil || meta.TruncateBefore() == nil || *meta.TruncateBefore() != 3 || meta.MaxCount() == nil || *meta.MaxCount() != 10 {
		t.Fatalf("metadata written to a soft-deleted stream: %+v, %v; want $tb 3 and $maxCount kept", meta, err)
	}
}

// lastMeta reads a stream's current metadata: the last event of $$stream.
var lastMeta = esdb.ReadStreamOptions{Direction: esdb.Backwards, From: esdb.End{}}
