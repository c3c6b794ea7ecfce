package kurrentdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"google.golang.org/grpc/codes"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// appendUnavailable appends and expects an indefinite outcome (ErrUnavailable).
func appendUnavailable(t *testing.T, s *kurrentdb.Store, stream string, exp eventstore.ExpectedRevision, batch []eventstore.EventData) {
	t.Helper()
	if _, err := s.Append(ctxT(t), stream, exp, batch); !errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("append to %s: %v, want ErrUnavailable", stream, err)
	}
}

// storedOnce checks that stream holds exactly batch, each event once, and that
// res is the original write's answer: its revisions and its last position.
func storedOnce(t *testing.T, s *kurrentdb.Store, stream string, batch []eventstore.EventData, res eventstore.AppendResult) {
	t.Helper()
	stored, err := s.ReadStream(ctxT(t), stream, 0, eventstore.Forwards, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, stored, batch)
	last := stored[len(stored)-1]
	if res.FirstRevision != 0 || res.LastRevision != last.Revision || res.Position != last.Position {
		t.Fatalf("retry answered %+v; the original write is 0..%d at %s", res, last.Revision, last.Position)
	}
	all, err := s.ReadAll(ctxT(t), eventstore.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, all, batch)
}

// TestRetryAfterAnErrorPastTheWrite: the leader wrote the batch, then answered
// an error (a commit timeout for a write that still commits, a connection cut).
// The backend reports an indefinite outcome, and the ledger's retry with the
// same event IDs at the same expected revision is answered with the original
// write: every event is stored once.
func TestRetryAfterAnErrorPastTheWrite(t *testing.T) {
	for _, code := range []codes.Code{codes.Aborted, codes.Unavailable, codes.DeadlineExceeded} {
		t.Run(code.String(), func(t *testing.T) {
			srv, url := kurrenttest.Start(t)
			s := devtest.OpenKurrentDB(t, url)
			batch := evs(2)
			srv.FailAppendsAfterWrite(1, code)
			appendUnavailable(t, s, "acct-1", eventstore.NoStream, batch)
			storedOnce(t, s, "acct-1", batch, mustAppend(t, s, "acct-1", eventstore.NoStream, batch...))
			mustAppend(t, s, "acct-1", eventstore.Exact(1), evs(1)...)
		})
	}
}

// TestRetryBeforeTheOriginalIsReplicated: the write reaches the leader but not
// a quorum, so it is answered Aborted after the commit timeout; a retry that
// arrives before replication matches the uncommitted write (IdempotentNotReady)
// and times out too, writing nothing. Once replicated, the original commits and
// the next retry gets its revisions and position.
func TestRetryBeforeTheOriginalIsReplicated(t *testing.T) {
	srv, url := kurrenttest.Start(t, kurrenttest.WithCommitTimeout(50*time.Millisecond))
	s := devtest.OpenKurrentDB(t, url)
	batch := evs(3)
	srv.HoldReplication(true)
	appendUnavailable(t, s, "acct-1", eventstore.NoStream, batch)
	if _, err := s.ReadStream(ctxT(t), "acct-1", 0, eventstore.Forwards, 0); !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatalf("an uncommitted write is visible: %v", err)
	}
	appendUnavailable(t, s, "acct-1", eventstore.NoStream, batch)
	if head, err := s.Head(ctxT(t)); err != nil || head != eventstore.Start {
		t.Fatalf("head %s, %v while nothing is committed", head, err)
	}
	srv.HoldReplication(false)
	storedOnce(t, s, "acct-1", batch, mustAppend(t, s, "acct-1", eventstore.NoStream, batch...))
}

// TestNotLeaderIsRetriedOnTheLeader: a node that is not the leader answers a
// write with NotLeader and the leader's endpoint, writing nothing. The client
// reconnects to that endpoint and the backend sends the append once more,
// there: written once, on the leader. Answered NotLeader again, it reports
// ErrUnavailable, and the caller's retry is answered with the original write.
// (Before the backend sent requires-leader it reported ErrUnavailable at once.)
func TestNotLeaderIsRetriedOnTheLeader(t *testing.T) {
	follower, url := kurrenttest.Start(t)
	leader, _ := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	batch := evs(2)
	empty := follower.Head()
	follower.NotLeaderNext(1, leader.Addr())
	res, err := s.Append(ctxT(t), "acct-1", eventstore.NoStream, batch)
	if err != nil {
		t.Fatalf("append answered NotLeader: %v, want it retried on the leader", err)
	}
	if follower.Head() != empty {
		t.Fatal("the follower wrote the refused append")
	}
	if leader.Requests(kurrenttest.MethodAppend) != 1 {
		t.Fatalf("the retry did not reach the leader (%d appends there)", leader.Requests(kurrenttest.MethodAppend))
	}
	storedOnce(t, s, "acct-1", batch, res)
	// Answered NotLeader twice (an election in between): ErrUnavailable, nothing
	// written; the caller's retry with the same events is answered the original.
	leader.NotLeaderNext(2, leader.Addr())
	_, err = s.Append(ctxT(t), "acct-1", eventstore.NoStream, batch)
	var e *esdb.Error
	if !errors.Is(err, eventstore.ErrUnavailable) || !errors.As(err, &e) || e.Code() != esdb.ErrorCodeNotLeader {
		t.Fatalf("append answered NotLeader twice: %v, want ErrUnavailable from NotLeader", err)
	}
	if _, err := s.Append(context.Background(), "acct-1", eventstore.NoStream, batch); err != nil {
		t.Fatalf("a second retry: %v", err)
	}
	storedOnce(t, s, "acct-1", batch, res)
}

// TestReadsFollowTheLeader: a connection left on a node that lags the leader
// (a follower after an election) was served reads, $all and subscriptions
// from its lagging log: client v4.2.0 never sends requires-leader. The backend
// sends it on every call, so the node serves them as the leader would. (On the
// old code the stream read here found 1 event of 3, the head was 2 appends
// behind and no call carried the header.)
func TestReadsFollowTheLeader(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	srv.SetReadLag(2)
	var last eventstore.AppendResult
	for i := range 3 {
		last = mustAppend(t, s, "account-lag", eventstore.ExactOrNoStream(int64(i)-1), ev("E"))
	}
	if got, err := s.ReadStream(ctxT(t), "account-lag", 0, eventstore.Forwards, 0); err != nil || len(got) != 3 {
		t.Fatalf("read of 3 events through a lagging node: %d, %v", len(got), err)
	}
	if head, err := s.Head(ctxT(t)); err != nil || head != last.Position {
		t.Fatalf("head %s, %v; want %s", head, err, last.Position)
	}
	sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{StreamPrefixes: []string{"account-lag"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if got := devtest.Receive(t, sub, 3); got[2].Position != last.Position {
		t.Fatalf("the subscription's third event is at %s, want %s", got[2].Position, last.Position)
	}
	if srv.RequiresLeaderCalls() == 0 {
		t.Fatal("no call carried requires-leader")
	}
}
