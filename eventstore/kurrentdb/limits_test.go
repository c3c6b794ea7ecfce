package kurrentdb_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/testcert"
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

// TestEarlyRefusalsEndWithinBoundedAttempts: a node refuses an append on its
// header (no right to write the stream) before it reads the events, and an
// event over its MaxAppendEventSize as it reads it; for an append larger than
// what flow control lets through unread, client v4.2.0 then loses the status
// and returns io.EOF, which the backend reported as ErrUnavailable: retried
// for ever. It now asks about the header alone and resends at most once:
// ErrAccessDenied and ErrAppendTooLarge, each within three appends. (On the
// old code: ErrUnavailable for the refused header, and an unlabelled error for
// the event, whose message "Maximum Append Event Size" it did not match.)
func TestEarlyRefusalsEndWithinBoundedAttempts(t *testing.T) {
	ca := testcert.NewCA(t)
	srv, _ := kurrenttest.Start(t,
		kurrenttest.WithTLS(ca.Issue(t, "kurrentdb", true).Pair(t)),
		kurrenttest.WithUsers(
			kurrenttest.User{Name: "admin", Password: adminPassword, Admin: true},
			kurrenttest.User{Name: "reader", Password: readerPassword, ReadOnly: true}),
		kurrenttest.WithEarlyRefusals(),
		kurrenttest.WithMaxAppendEventSize(128<<10))
	caFile := testcert.WriteFile(t, "ca.crt", ca.CertPEM)
	for _, tc := range []struct {
		name, user, password string
		batch                []eventstore.EventData
		want                 error
	}{
		{"256 KiB without the right to write", "reader", readerPassword, sized(4, 256<<10), kurrentdb.ErrAccessDenied},
		{"an event over the server's limit", "admin", adminPassword, sized(4, 800<<10), kurrentdb.ErrAppendTooLarge},
		{"one event over the server's limit", "admin", adminPassword, sized(1, 200<<10), kurrentdb.ErrAppendTooLarge},
	} {
		s := devtest.OpenKurrentDB(t, "kurrentdb://"+tc.user+":"+tc.password+"@"+srv.Addr()+"?tlsCAFile="+caFile)
		before := srv.Requests(kurrenttest.MethodAppend)
		_, err := s.Append(ctxT(t), "account-"+uuid.NewString(), eventstore.NoStream, tc.batch)
		if !errors.Is(err, tc.want) || errors.Is(err, eventstore.ErrUnavailable) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if testing.Verbose() {
			t.Logf("%s: %v", tc.name, err)
		}
		if n := srv.Requests(kurrenttest.MethodAppend) - before; n > 3 {
			t.Errorf("%s: %d appends, want at most 3", tc.name, n)
		}
	}
}

// TestAppendOfAnEventOverTheEventLimit: with kurrentdb.WithMaxAppendEventSize,
// an event over it is refused before it is sent.
func TestAppendOfAnEventOverTheEventLimit(t *testing.T) {
	srv, url := kurrenttest.Start(t, kurrenttest.WithMaxAppendEventSize(128<<10))
	s := devtest.OpenKurrentDB(t, url, kurrentdb.WithMaxAppendEventSize(128<<10))
	before := srv.Requests(kurrenttest.MethodAppend)
	if _, err := s.Append(ctxT(t), "account-1", eventstore.NoStream, sized(2, 300<<10)); !errors.Is(err, kurrentdb.ErrAppendTooLarge) {
		t.Fatalf("an event of 150 KiB over a limit of 128 KiB: %v", err)
	}
	if n := srv.Requests(kurrenttest.MethodAppend) - before; n != 0 {
		t.Fatalf("%d appends sent", n)
	}
	mustAppend(t, s, "account-1", eventstore.NoStream, sized(2, 200<<10)...)
}

// TestEarlyEndOfAFailedCallIsNotARefusal: a call that fails (Unavailable)
// before the server has read an append larger than flow control lets through
// unread reaches the backend as the same bare io.EOF as a refusal on the
// header, its status lost. It must not be taken for one: the probe of the
// header passes, and the append is resent once and written once; and when
// the probe fails too (the node still down), the answer is ErrUnavailable
// (retried by the caller), never ErrAppendTooLarge or ErrAccessDenied. Shown
// failing with a resendAfterEarlyEnd that ignored the probe's error: the
// second case ended in ErrAppendTooLarge.
func TestEarlyEndOfAFailedCallIsNotARefusal(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	big := sized(4, 256<<10)

	before := srv.Requests(kurrenttest.MethodAppend)
	srv.FailNext(kurrenttest.MethodAppend, 1, codes.Unavailable)
	res, err := s.Append(ctxT(t), "account-1", eventstore.NoStream, big)
	if err != nil || res.FirstRevision != 0 || res.LastRevision != 3 {
		t.Fatalf("256 KiB after a failed call: %+v, %v; want revisions 0-3", res, err)
	}
	if n := srv.Requests(kurrenttest.MethodAppend) - before; n != 3 {
		t.Fatalf("%d appends, want 3 (the failed one, the probe, the resend)", n)
	}

	srv.FailNext(kurrenttest.MethodAppend, 3, codes.Unavailable)
	_, err = s.Append(ctxT(t), "account-2", eventstore.NoStream, big)
	if !errors.Is(err, eventstore.ErrUnavailable) || errors.Is(err, kurrentdb.ErrAppendTooLarge) || errors.Is(err, kurrentdb.ErrAccessDenied) {
		t.Fatalf("256 KiB while every call fails: %v, want ErrUnavailable alone", err)
	}
	if evs, err := s.ReadStream(ctxT(t), "account-1", 0, eventstore.Forwards, 0); err != nil || len(evs) != 4 {
		t.Fatalf("account-1 holds %d events (%v), want 4", len(evs), err)
	}
}
