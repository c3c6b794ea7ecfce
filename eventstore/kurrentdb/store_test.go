package kurrentdb_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
)

const waitFor = 10 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	t.Cleanup(cancel)
	return ctx
}

func ev(typ string) eventstore.EventData {
	return eventstore.EventData{ID: uuid.New(), Type: typ, Data: []byte(`{"n":1}`), Metadata: []byte(`{"k":"v"}`)}
}

func evs(n int) []eventstore.EventData {
	out := make([]eventstore.EventData, n)
	for i := range out {
		out[i] = ev("E")
	}
	return out
}

func mustAppend(t *testing.T, s *kurrentdb.Store, stream string, exp eventstore.ExpectedRevision, e ...eventstore.EventData) eventstore.AppendResult {
	t.Helper()
	res, err := s.Append(ctxT(t), stream, exp, e)
	if err != nil {
		t.Fatalf("append to %s: %v", stream, err)
	}
	return res
}

func sameIDs(t *testing.T, got []eventstore.RecordedEvent, want []eventstore.EventData) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].ID != want[i].ID {
			t.Fatalf("event %d is %s, want %s", i, got[i].ID, want[i].ID)
		}
	}
}

func TestConnectionString(t *testing.T) {
	for in, want := range map[string]string{
		"kurrentdb://localhost:2113?tls=false":                   "esdb://localhost:2113?tls=false",
		"kurrentdb://admin:changeit@kdb:2113?tls=true":           "esdb://admin:changeit@kdb:2113?tls=true",
		"kurrentdb+discover://cluster.dns:2113":                  "esdb+discover://cluster.dns:2113",
		"kurrentdb://a:2113,b:2113,c:2113?nodePreference=leader": "esdb://a:2113,b:2113,c:2113?nodePreference=leader",
		"esdb://localhost:2113?tls=false":                        "esdb://localhost:2113?tls=false",
		"KurrentDB://h:1":                                        "esdb://h:1",
	} {
		got, err := kurrentdb.ConnectionString(in)
		if err != nil || got != want {
			t.Errorf("ConnectionString(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"postgres://x/y", "localhost:2113", ""} {
		if _, err := kurrentdb.ConnectionString(bad); err == nil {
			t.Errorf("ConnectionString(%q) succeeded", bad)
		}
	}
}

func TestOpenUnreachableServer(t *testing.T) {
	srv, err := kurrenttest.New()
	if err != nil {
		t.Fatal(err)
	}
	url := srv.URL() + "&maxDiscoverAttempts=2&discoveryInterval=5"
	srv.Stop()
	_, err = kurrentdb.Open(ctxT(t), url)
	if !errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("open of a stopped server: %v, want ErrUnavailable", err)
	}
	if _, err := kurrentdb.Open(ctxT(t), "postgres://x"); err == nil {
		t.Fatal("open of a postgres URL succeeded")
	}
}

func TestNotAMultiAppender(t *testing.T) {
	if _, ok := any(devtest.KurrentDB(t)).(eventstore.MultiAppender); ok {
		t.Fatal("the KurrentDB store claims atomic multi-stream appends")
	}
}

func TestAppendMapsWrongExpectedRevision(t *testing.T) {
	s := devtest.KurrentDB(t)
	mustAppend(t, s, "acct-1", eventstore.NoStream, evs(3)...)
	for _, c := range []struct {
		stream string
		exp    eventstore.ExpectedRevision
		actual int64
	}{
		{"acct-1", eventstore.Exact(7), 2},
		{"acct-1", eventstore.NoStream, 2},
		{"acct-2", eventstore.StreamExists, -1},
	} {
		_, err := s.Append(ctxT(t), c.stream, c.exp, evs(1))
		var wer *eventstore.WrongExpectedRevisionError
		if !errors.As(err, &wer) || !errors.Is(err, eventstore.ErrWrongExpectedRevision) {
			t.Fatalf("%s at %s: %v", c.stream, c.exp, err)
		}
		if wer.Stream != c.stream || wer.Expected != c.exp || wer.Actual != c.actual {
			t.Fatalf("%s at %s: %+v, want actual %d", c.stream, c.exp, wer, c.actual)
		}
	}
	// Corrupted idempotency: the first event matches, the second does not.
	first, err := s.ReadStream(ctxT(t), "acct-1", 0, eventstore.Forwards, 1)
	if err != nil {
		t.Fatal(err)
	}
	half := []eventstore.EventData{{ID: first[0].ID, Type: "E", Data: []byte(`{}`)}, ev("E")}
	_, err = s.Append(ctxT(t), "acct-1", eventstore.NoStream, half)
	var wer *eventstore.WrongExpectedRevisionError
	if !errors.As(err, &wer) || wer.Actual != 2 {
		t.Fatalf("half-matching re-append: %v", err)
	}
}

func TestAppendRejectsEventsWithoutID(t *testing.T) {
	s := devtest.KurrentDB(t)
	if _, err := s.Append(ctxT(t), "a", eventstore.Any, []eventstore.EventData{{Type: "E"}}); err == nil {
		t.Fatal("an event without ID was appended (the client would have invented one)")
	}
	if _, err := s.Append(ctxT(t), "a", eventstore.Any, nil); err == nil {
		t.Fatal("an empty append succeeded")
	}
}

// TestUnavailableIsRetryable: an Unavailable answer is ErrUnavailable. The
// append's fault is FailNextAppendTo's, whose status always reaches the client
// (FailNext's may not: see there; the store then resends the append).
func TestUnavailableIsRetryable(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	srv.FailNextAppendTo("a", codes.Unavailable)
	_, err := s.Append(ctxT(t), "a", eventstore.NoStream, evs(1))
	if !errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("append answered Unavailable: %v, want ErrUnavailable", err)
	}
	srv.FailNext(kurrenttest.MethodRead, 1, codes.Unavailable)
	if _, err := s.ReadStream(ctxT(t), "a", 0, eventstore.Forwards, 0); !errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("read answered Unavailable: %v, want ErrUnavailable", err)
	}
	// The client reconnects; the same append now goes through.
	mustAppend(t, s, "a", eventstore.NoStream, evs(1)...)
}

// TestDeadlineWithoutReply: the server commits but its answer never comes. The
// caller gets ErrUnavailable (an indefinite outcome); retrying with the same IDs
// at the same expected revision returns the original write, and writes nothing.
func TestDeadlineWithoutReply(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	batch := evs(2)
	srv.StallAppends(1, true)
	// The deadline leaves a loaded machine time to deliver the request: one
	// abandoned before the server read it would leave the stall to the retry.
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := s.Append(short, "acct-1", eventstore.NoStream, batch)
	if !errors.Is(err, eventstore.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unanswered append: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	res := mustAppend(t, s, "acct-1", eventstore.NoStream, batch...)
	stored, err := s.ReadStream(ctxT(t), "acct-1", 0, eventstore.Forwards, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, stored, batch)
	if res.FirstRevision != 0 || res.LastRevision != 1 || res.Position != stored[1].Position {
		t.Fatalf("retry returned %+v, the original write is 0..1 at %s", res, stored[1].Position)
	}

	// Lost request: nothing was written, the retry writes.
	srv.StallAppends(1, false)
	short2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	more := evs(1)
	if _, err := s.Append(short2, "acct-1", eventstore.Exact(1), more); !errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("unanswered append: %v", err)
	}
	if res := mustAppend(t, s, "acct-1", eventstore.Exact(1), more...); res.FirstRevision != 2 {
		t.Fatalf("retry after a lost request: %+v", res)
	}
}

func TestCancelledCallReturnsPromptly(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	srv.StallAppends(1, false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := s.Append(ctx, "a", eventstore.Any, evs(1)); done <- err }()
	devtest.Eventually(t, waitFor, "the append to reach the server", func() bool { return srv.Requests(kurrenttest.MethodAppend) == 1 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || errors.Is(err, eventstore.ErrUnavailable) {
			t.Fatalf("cancelled append: %v, want context.Canceled alone", err)
		}
	case <-time.After(waitFor):
		t.Fatal("the cancelled append did not return")
	}
}

// TestClientReplacedAfterDiscoveryFails: when node discovery fails
// MaxDiscoverAttempts times the client's connection loop ends for good; the store
// replaces the client and recovers once the server is back.
func TestClientReplacedAfterDiscoveryFails(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url+"&maxDiscoverAttempts=2&discoveryInterval=5")
	mustAppend(t, s, "a", eventstore.NoStream, evs(1)...)
	srv.SetUnavailable(true)
	probes := srv.Requests(kurrenttest.MethodGetSupportedMethods)
	for i := range 4 {
		if _, err := s.ReadStream(ctxT(t), "a", 0, eventstore.Forwards, 0); !errors.Is(err, eventstore.ErrUnavailable) {
			t.Fatalf("read %d while unavailable: %v, want ErrUnavailable", i, err)
		}
	}
	if srv.Requests(kurrenttest.MethodGetSupportedMethods) < probes+2 {
		t.Fatal("the client did not try to rediscover the node")
	}
	srv.SetUnavailable(false)
	devtest.Eventually(t, waitFor, "reads to work again", func() bool {
		_, err := s.ReadStream(ctxT(t), "a", 0, eventstore.Forwards, 0)
		return err == nil
	})
	mustAppend(t, s, "a", eventstore.Exact(0), evs(1)...)
}

func TestTombstonedStream(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	mustAppend(t, s, "gone", eventstore.NoStream, evs(1)...)
	if _, err := kurrenttest.Client(t, srv.ConnectionString()).TombstoneStream(ctxT(t), "gone", esdb.TombstoneStreamOptions{ExpectedRevision: esdb.Any{}}); err != nil {
		t.Fatal(err)
	}
	_, err := s.ReadStream(ctxT(t), "gone", 0, eventstore.Forwards, 0)
	if errors.Is(err, eventstore.ErrStreamNotFound) || !errors.Is(err, kurrentdb.ErrStreamDeleted) {
		t.Fatalf("read of a tombstoned stream: %v, want ErrStreamDeleted, not not found (its events are in $all)", err)
	}
	_, err = s.Append(ctxT(t), "gone", eventstore.Any, evs(1))
	if !errors.Is(err, kurrentdb.ErrStreamDeleted) || errors.Is(err, eventstore.ErrWrongExpectedRevision) {
		t.Fatalf("append to a tombstoned stream: %v", err)
	}
}

func TestAllLeavesOutSystemRecords(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url)
	c := kurrenttest.Client(t, srv.ConnectionString())
	a := mustAppend(t, s, "acct-1", eventstore.NoStream, ev("Opened"))
	if _, err := c.SetStreamMetadata(ctxT(t), "acct-1", esdb.AppendToStreamOptions{}, esdb.StreamMetadata{}); err != nil {
		t.Fatal(err)
	}
	b := mustAppend(t, s, "acct-2", eventstore.NoStream, ev("Opened"))
	if _, err := c.TombstoneStream(ctxT(t), "acct-2", esdb.TombstoneStreamOptions{ExpectedRevision: esdb.Any{}}); err != nil {
		t.Fatal(err)
	}
	all, err := s.ReadAll(ctxT(t), eventstore.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Position != a.Position || all[1].Position != b.Position {
		t.Fatalf("all: %+v", all)
	}
	if page, err := s.ReadAll(ctxT(t), a.Position, 1); err != nil || len(page) != 1 || page[0].Position != b.Position {
		t.Fatalf("one after a: %+v, %v", page, err)
	}
	head, err := s.Head(ctxT(t))
	if err != nil || head != b.Position {
		t.Fatalf("head %s, %v; want %s (the tombstone after it is a system record)", head, err, b.Position)
	}
	sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got := devtest.Receive(t, sub, 2)
	last := mustAppend(t, s, "acct-3", eventstore.NoStream, ev("Opened"))
	got = append(got, devtest.Receive(t, sub, 1)...)
	if got[0].Position != a.Position || got[1].Position != b.Position || got[2].Position != last.Position {
		t.Fatalf("subscription delivered %+v", got)
	}
}

func TestHeadOfEmptyStore(t *testing.T) {
	s := devtest.KurrentDB(t)
	if h, err := s.Head(ctxT(t)); err != nil || h != eventstore.Start {
		t.Fatalf("head %s, %v", h, err)
	}
	if all, err := s.ReadAll(ctxT(t), eventstore.Start, 10); err != nil || len(all) != 0 {
		t.Fatalf("all %v, %v", all, err)
	}
}

// TestSubscriptionResubscribesAfterDrop: a dropped subscription comes back from
// the last event it delivered, without gaps or repeats.
func TestSubscriptionResubscribesAfterDrop(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url, kurrentdb.WithResubscribe(time.Millisecond, 20*time.Millisecond, 10))
	first := evs(3)
	mustAppend(t, s, "acct-1", eventstore.NoStream, first...)
	sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{StreamPrefixes: []string{"acct-"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got := devtest.Receive(t, sub, 3)
	devtest.Eventually(t, waitFor, "the subscription on the server", func() bool { return srv.Subscriptions() == 1 })

	if n := srv.DropSubscriptions(); n != 1 {
		t.Fatalf("dropped %d subscriptions", n)
	}
	ks := sub.(*kurrentdb.Subscription)
	devtest.Eventually(t, waitFor, "the resubscription", func() bool { return ks.Drops() == 1 && srv.Subscriptions() == 1 })
	second := evs(3)
	mustAppend(t, s, "acct-1", eventstore.Exact(2), second...)
	got = append(got, devtest.Receive(t, sub, 3)...)
	sameIDs(t, got, append(first, second...))

	starts := srv.SubscriptionStarts()
	if len(starts) != 2 || starts[0] != "start" || starts[1] != got[2].Position.String() {
		t.Fatalf("subscriptions started at %v, want [start %s]", starts, got[2].Position)
	}
	select {
	case e := <-sub.Events():
		t.Fatalf("unexpected event %+v", e)
	default:
	}
}

// TestSubscriptionDropDuringCatchUp: the drop comes while the consumer is
// still working through history; nothing is lost or repeated.
func TestSubscriptionDropDuringCatchUp(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url, kurrentdb.WithResubscribe(time.Millisecond, 20*time.Millisecond, 10))
	var want []eventstore.EventData
	for i := range 50 {
		e := evs(2)
		mustAppend(t, s, fmt.Sprintf("acct-%d", i), eventstore.NoStream, e...)
		mustAppend(t, s, fmt.Sprintf("other-%d", i), eventstore.NoStream, evs(1)...)
		want = append(want, e...)
	}
	sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{StreamPrefixes: []string{"acct-"}, BufferSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got := devtest.Receive(t, sub, 10)
	srv.DropSubscriptions()
	got = append(got, devtest.Receive(t, sub, len(want)-10)...)
	sameIDs(t, got, want)
	for i := 1; i < len(got); i++ {
		if got[i].Position.Compare(got[i-1].Position) <= 0 {
			t.Fatalf("positions not increasing at %d", i)
		}
	}
}

// TestSubscriptionResumesFromCheckpoint: with a prefix that matches rarely, the
// server's checkpoints move the resume position past the filtered-out events.
// A page without a match checkpoints where it was read from, (commit, 0), which
// no event sits at (commit != prepare): the resubscription starts from the
// event before it, and the backwards read that finds that event must not start
// at (commit, 0), which leaves it out (it started one record too early before).
func TestSubscriptionResumesFromCheckpoint(t *testing.T) {
	srv, url := kurrenttest.Start(t, kurrenttest.WithEmptyLog()) // the pages below start at the first event
	s := devtest.OpenKurrentDB(t, url,
		kurrentdb.WithResubscribe(time.Millisecond, 20*time.Millisecond, 10),
		kurrentdb.WithCheckpointWindow(2, 1))
	a := ev("Opened")
	mustAppend(t, s, "acct-1", eventstore.NoStream, a)
	var others []eventstore.AppendResult
	for i := range 9 {
		others = append(others, mustAppend(t, s, fmt.Sprintf("other-%d", i), eventstore.NoStream, ev("X")))
	}
	sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{StreamPrefixes: []string{"acct-"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got := devtest.Receive(t, sub, 1)
	ks := sub.(*kurrentdb.Subscription)
	// Pages of 2: [acct-1 other-0] [other-1 other-2] [other-3 other-4]
	// [other-5 other-6] [other-7 other-8]. Each page checkpoints at its last event
	// sent, else where it was read from (the last one as catch-up goes live): the
	// last one at (other-7's commit position, 0).
	cp := eventstore.Position{Commit: others[7].Position.Commit}
	devtest.Eventually(t, waitFor, "the last catch-up checkpoint", func() bool { return ks.Checkpoint() == cp })
	srv.DropSubscriptions()
	devtest.Eventually(t, waitFor, "the resubscription", func() bool { return ks.Drops() == 1 && srv.Subscriptions() == 1 })
	b := ev("Opened")
	mustAppend(t, s, "acct-2", eventstore.NoStream, b)
	got = append(got, devtest.Receive(t, sub, 1)...)
	sameIDs(t, got, []eventstore.EventData{a, b})
	starts := srv.SubscriptionStarts()
	if len(starts) != 2 || starts[1] != others[6].Position.String() {
		t.Fatalf("resubscribed at %v, want at the event before the checkpoint %s (%s)", starts, cp, others[6].Position)
	}
}

// TestSubscribeAfterPositionBetweenEvents: a start position that is not an
// event's (a stored checkpoint, say) must not cost the next event, on a release
// that starts strictly after the position and on 23.10, which skipped the first
// event at or after it.
func TestSubscribeAfterPositionBetweenEvents(t *testing.T) {
	for _, release := range []kurrenttest.Release{kurrenttest.DefaultRelease, kurrenttest.Release23_10} {
		t.Run(string(release), func(t *testing.T) { subscribeBetweenEvents(t, release) })
	}
}

func subscribeBetweenEvents(t *testing.T, release kurrenttest.Release) {
	srv, url := kurrenttest.Start(t, kurrenttest.WithRelease(release))
	s := devtest.OpenKurrentDB(t, url)
	a := mustAppend(t, s, "acct-1", eventstore.NoStream, ev("E"))
	b := ev("E")
	bRes := mustAppend(t, s, "acct-2", eventstore.NoStream, b)
	// No event sits at (b's commit, 0), the form of the server's catch-up
	// checkpoints; a position inside a record would be refused as invalid.
	between := eventstore.Position{Commit: bRes.Position.Commit}
	sub, err := s.SubscribeAll(ctxT(t), between, eventstore.SubscribeOptions{StreamPrefixes: []string{"acct-"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sameIDs(t, devtest.Receive(t, sub, 1), []eventstore.EventData{b})
	if starts := srv.SubscriptionStarts(); len(starts) != 1 || starts[0] != a.Position.String() {
		t.Fatalf("subscribed at %v, want at the event before the position (%s)", starts, a.Position)
	}
	// At an event's position the subscription starts there, exclusive.
	sub2, err := s.SubscribeAll(ctxT(t), a.Position, eventstore.SubscribeOptions{StreamPrefixes: []string{"acct-"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Close()
	sameIDs(t, devtest.Receive(t, sub2, 1), []eventstore.EventData{b})
}

func TestSubscriptionGivesUpAfterBoundedAttempts(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s := devtest.OpenKurrentDB(t, url+"&maxDiscoverAttempts=1&discoveryInterval=1",
		kurrentdb.WithResubscribe(time.Millisecond, 4*time.Millisecond, 3))
	sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, waitFor, "the subscription on the server", func() bool { return srv.Subscriptions() == 1 })
	srv.SetUnavailable(true)
	srv.DropSubscriptions()
	devtest.WaitClosed(t, sub)
	if err := sub.Err(); !errors.Is(err, eventstore.ErrUnavailable) || !strings.Contains(err.Error(), "3 resubscriptions failed") {
		t.Fatalf("Err %v, want ErrUnavailable after 3 attempts", err)
	}
	_ = sub.Close()
}

func TestCloseEndsSubscriptions(t *testing.T) {
	_, url := kurrenttest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	s, err := kurrentdb.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := s.SubscribeAll(ctx, eventstore.Start, eventstore.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	devtest.WaitClosed(t, sub)
	if err := sub.Err(); err != nil {
		t.Fatalf("Err after the store closed: %v", err)
	}
	if _, err := s.Append(ctx, "a", eventstore.Any, evs(1)); err == nil {
		t.Fatal("append after Close succeeded")
	}
	if _, err := s.SubscribeAll(ctx, eventstore.Start, eventstore.SubscribeOptions{}); err == nil {
		t.Fatal("subscribe after Close succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestOutageOfSecondsIsRidden: with the store's default rediscovery (not the
// client's ten attempts) an outage longer than a second ends with the same client
// working again, and Close leaves no call stranded.
func TestOutageOfSecondsIsRidden(t *testing.T) {
	srv, url := kurrenttest.Start(t)
	s, err := kurrentdb.Open(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, s, "a", eventstore.NoStream, evs(1)...)
	srv.SetUnavailable(true)
	outage := time.Now()
	for time.Since(outage) < 2500*time.Millisecond { // the client's own limit is about one second
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		if _, err := s.ReadStream(ctx, "a", 0, eventstore.Forwards, 0); err == nil {
			t.Fatal("read succeeded while the server was unavailable")
		}
		cancel()
	}
	srv.SetUnavailable(false)
	devtest.Eventually(t, waitFor, "reads to work again", func() bool {
		_, err := s.ReadStream(ctxT(t), "a", 0, eventstore.Forwards, 0)
		return err == nil
	})
	mustAppend(t, s, "a", eventstore.Exact(0), evs(1)...)
	if err := s.Close(); err != nil {
		t.Fatalf("close after the outage: %v", err)
	}
}

// TestSubscribeFromStartOnAlmostEmptyLog: on the releases with KDB-710 (24.2,
// 24.6, 24.10.0-24.10.4), a filtered subscription from Start over a log whose
// last catch-up page matches nothing (a fresh cluster: only other streams) gets a
// checkpoint at the maximum position before caught_up. Adopted as the resume
// point, it would drop every later event: the transfer process, which subscribes
// from Start, would hear nothing until restarted. The subscription must still
// deliver what is appended after, on that release and on the fixed one, and
// never report a checkpoint beyond the log's head.
func TestSubscribeFromStartOnAlmostEmptyLog(t *testing.T) {
	for _, release := range []kurrenttest.Release{kurrenttest.Release24_10_4, kurrenttest.Release24_10_5} {
		t.Run(string(release), func(t *testing.T) {
			_, url := kurrenttest.Start(t, kurrenttest.WithRelease(release))
			subscribeFromStartThenAppend(t, devtest.OpenKurrentDB(t, url, kurrentdb.WithCheckpointWindow(2, 1)), "acct-")
		})
	}
}

// subscribeFromStartThenAppend subscribes s from Start to the streams of prefix,
// of which the log holds none yet, appends two events to such streams and
// expects exactly them, with the subscription's checkpoint never beyond the
// log's head.
func subscribeFromStartThenAppend(t *testing.T, s *kurrentdb.Store, prefix string) {
	head := mustAppend(t, s, "other-"+uuid.NewString(), eventstore.NoStream, ev("X"))
	sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{StreamPrefixes: []string{prefix}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	a, b := ev("Opened"), ev("Opened")
	mustAppend(t, s, prefix+"1", eventstore.NoStream, a)
	mustAppend(t, s, prefix+"2", eventstore.NoStream, b)
	sameIDs(t, devtest.Receive(t, sub, 2), []eventstore.EventData{a, b})
	if cp := sub.(*kurrentdb.Subscription).Checkpoint(); cp.Compare(head.Position) < 0 || cp.Commit == math.MaxUint64 {
		t.Fatalf("checkpoint %s: before the first event, or beyond the log's head", cp)
	}
}
