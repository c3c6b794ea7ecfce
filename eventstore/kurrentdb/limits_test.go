package kurrentdb_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// sized returns n events whose data make up about total bytes.
func sized(n, total int) []eventstore.EventData {
	out := make([]eventstore.EventData, n)
	for i := range out {
		out[i] = eventstore.EventData{ID: uuid.New(), Type: "E", Data: bytes.Repeat([]byte("x"), total/n)}
	}
	return out
}

// TestAppendOverTheMaximumSize: the server refuses an append over its maximum
// size (1 MiB on 24.10) while it reads it, so the client, still sending, loses
// the status and reports io.EOF, which the backend took for a retryable outage:
// the ledger retried a too-large append forever. It is refused before it is
// sent, with kurrentdb.ErrAppendTooLarge, and never as ErrUnavailable.
func TestAppendOverTheMaximumSize(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	for _, batch := range [][]eventstore.EventData{sized(40, 2<<20), sized(1, 1<<20+1)} {
		_, err := s.Append(ctxT(t), "acct-1", eventstore.Any, batch)
		if !errors.Is(err, kurrentdb.ErrAppendTooLarge) || errors.Is(err, eventstore.ErrUnavailable) {
			t.Fatalf("append of %d events over 1 MiB: %v, want ErrAppendTooLarge", len(batch), err)
		}
	}
	// Just under the limit, counted as the server counts (type twice, metadata).
	under := sized(4, 1<<20-4*(2+2)-4*2)
	for i := range under {
		under[i].Metadata = []byte("{}")
	}
	mustAppend(t, s, "acct-1", eventstore.Any, under...)
	if srv.Head() == 0 {
		t.Fatal("nothing written")
	}
}

// TestAppendOfAnEventWithoutType: the server refuses an empty event type while
// it reads the append (the Event constructor throws), so the client, still
// sending the batch, reported io.EOF and the backend ErrUnavailable: retried
// forever. It is refused before it is sent.
func TestAppendOfAnEventWithoutType(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	batch := sized(40, 1<<19)
	batch[0].Type = ""
	_, err := s.Append(ctxT(t), "acct-1", eventstore.Any, batch)
	if err == nil || errors.Is(err, eventstore.ErrUnavailable) || !strings.Contains(err.Error(), "event 0 has no type") {
		t.Fatalf("append of an event without type: %v", err)
	}
	if n := srv.Requests(kurrenttest.MethodAppend); n != 0 {
		t.Fatalf("%d appends sent", n)
	}
}

// TestFreshLogStartsWithSystemRecords: a real node's log begins with system
// records (metadata, settings, users), one of them of a type without "$" that
// the server's exclude-system-events filter lets through. "All" leaves every one
// of them out: the head of a fresh log is Start, and a subscription from Start
// delivers only the ledger's events.
func TestFreshLogStartsWithSystemRecords(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	if srv.Head() == 0 {
		t.Fatal("the fresh log is empty")
	}
	s := devtest.OpenKurrentDB(t, url)
	if head, err := s.Head(ctxT(t)); err != nil || head != eventstore.Start {
		t.Fatalf("head of a fresh log %s, %v; want Start", head, err)
	}
	if all, err := s.ReadAll(ctxT(t), eventstore.Start, 0); err != nil || len(all) != 0 {
		t.Fatalf("all of a fresh log: %+v, %v", all, err)
	}
	var appended []eventstore.EventData
	for _, prefixes := range [][]string{nil, {"acct-", "$"}} {
		sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{StreamPrefixes: prefixes})
		if err != nil {
			t.Fatal(err)
		}
		e := ev("Opened")
		mustAppend(t, s, fmt.Sprintf("acct-%d", len(prefixes)), eventstore.NoStream, e)
		appended = append(appended, e)
		sameIDs(t, devtest.Receive(t, sub, len(appended)), appended)
		_ = sub.Close()
	}
}

// TestReadFromAnInvalidPosition: a position inside a record is refused by the
// server (InvalidArgument, "Trying to read from an invalid position."); the
// backend says so with ErrInvalidPosition, not as a retryable outage.
func TestReadFromAnInvalidPosition(t *testing.T) {
	s := devtest.KurrentDB(t)
	a := mustAppend(t, s, "acct-1", eventstore.NoStream, ev("Opened"))
	inside := eventstore.Position{Commit: a.Position.Commit + 1, Prepare: a.Position.Prepare + 1}
	if _, err := s.ReadAll(ctxT(t), inside, 0); !errors.Is(err, kurrentdb.ErrInvalidPosition) || errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("read from inside a record: %v, want ErrInvalidPosition", err)
	}
	if _, err := s.SubscribeAll(ctxT(t), inside, eventstore.SubscribeOptions{}); !errors.Is(err, kurrentdb.ErrInvalidPosition) {
		t.Fatalf("subscription from inside a record: %v, want ErrInvalidPosition", err)
	}
}

// TestReadOfATruncatedStream: KurrentDB leaves out of a stream read the events
// its metadata truncates ($tb, $maxCount, $maxAge; scavenged ones alike), with
// their revisions unchanged. The backend returned the rest as if it were the
// whole history, so an account rebuilt from it had a wrong balance, silently; a
// forward read whose first event is not at its start revision now fails with
// ErrStreamTruncated.
func TestReadOfATruncatedStream(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	mustAppend(t, s, "account-1", eventstore.NoStream, evs(3)...)
	var m esdb.StreamMetadata
	m.SetTruncateBefore(2)
	if _, err := kurrenttest.Client(t, srv.ConnectionString()).SetStreamMetadata(ctxT(t), "account-1", esdb.AppendToStreamOptions{}, m); err != nil {
		t.Fatal(err)
	}
	if evs, err := s.ReadStream(ctxT(t), "account-1", 0, eventstore.Forwards, 0); !errors.Is(err, kurrentdb.ErrStreamTruncated) {
		t.Fatalf("read of a truncated stream from 0: %d events, %v; want ErrStreamTruncated", len(evs), err)
	}
	if evs, err := s.ReadStream(ctxT(t), "account-1", 2, eventstore.Forwards, 0); err != nil || len(evs) != 1 || evs[0].Revision != 2 {
		t.Fatalf("read from the first readable revision: %+v, %v", evs, err)
	}
}
