package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
)

// HeldAppender is an optional test capability: AppendHeld performs an append and
// returns before committing it, with the stream locked (appends to it wait) until
// commit or rollback ends it. The suite uses it to hold a transaction open across
// a later commit, the case in which a naive "all" reader skips an event.
type HeldAppender interface {
	AppendHeld(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.HeldAppend, error)
}

// waitTimeout bounds every wait of the suite: nothing waits forever.
const waitTimeout = 15 * time.Second

// Run runs the conformance suite. newStore is called once per subtest; the store
// may be fresh or shared (a KurrentDB server): every subtest works on streams of
// its own random prefix and reads "all" from the head it found at its start, so
// other writers do not disturb it. Subtests run in parallel.
func Run(t *testing.T, newStore func(t *testing.T) eventstore.Store) {
	tests := []struct {
		name string
		f    func(t *testing.T, s eventstore.Store, p string)
	}{
		{"AppendAndRead", testAppendAndRead},
		{"WrongExpectedRevision", testWrongExpectedRevision},
		{"ConcurrentAppendsOneWinnerPerRevision", testConcurrentAppends},
		{"IdempotentReappend", testIdempotentReappend},
		{"PartialOverlapIsAConflict", testPartialOverlap},
		{"ReappendAtNextRevisionIsNotDeduped", testReappendAtNextRevision},
		{"AnyWithKnownFirstIDIsIdempotent", testAnyIdempotent},
		{"GlobalOrder", testGlobalOrder},
		{"HeldTransactionIsNotSkipped", testHeldTransaction},
		{"SubscribeCatchUpThenLive", testCatchUpThenLive},
		{"SubscribePrefixFilter", testPrefixFilter},
		{"ContextCancellation", testContextCancellation},
		{"ReadStreamDirectionsAndMax", testReadStreamDirections},
		{"MultiStreamAppend", testMultiAppend},
		{"MultiAppendChainsPartsOfOneStream", testMultiAppendChain},
		{"MultiAppendAssertsRevisions", testMultiAppendAsserts},
		{"MultiAppendRepeatsOnlyTheSameEvents", testMultiAppendRepeatsSameEvents},
		{"MultiAppendRefusesARepeatThatMustBeNew", testMultiAppendMustBeNew},
		{"LocateEventsByIDAndRefuseRepeats", testLocateEvents},
		{"SnapshotsKeepTheLatest", testSnapshots},
		{"ReadEventsBySubject", testSubjects},
		{"ReadColdManyStreamsAtOnce", testReadCold},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			tc.f(t, s, prefix())
		})
	}
}

// ---- helpers ----

func prefix() string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return "st" + hex.EncodeToString(b) + "-"
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// event returns an event with a fresh ID. Its data is JSON with odd key order and
// spacing: stores must keep the exact bytes.
func event(typ string, n int) eventstore.EventData {
	return eventstore.EventData{
		ID:       uuid.New(),
		Type:     typ,
		Data:     []byte(fmt.Sprintf(`{"z": %d,  "a":[1, 2],"m":"é"}`, n)),
		Metadata: []byte(fmt.Sprintf(`{"n":%d}`, n)),
	}
}

func events(typ string, n int) []eventstore.EventData {
	out := make([]eventstore.EventData, n)
	for i := range out {
		out[i] = event(typ, i)
	}
	return out
}

func mustAppend(t *testing.T, s eventstore.Store, stream string, exp eventstore.ExpectedRevision, evs ...eventstore.EventData) eventstore.AppendResult {
	t.Helper()
	res, err := s.Append(ctxT(t), stream, exp, evs)
	if err != nil {
		t.Fatalf("append %d to %s at %s: %v", len(evs), stream, exp, err)
	}
	return res
}

func head(t *testing.T, s eventstore.Store) eventstore.Position {
	t.Helper()
	p, err := s.Head(ctxT(t))
	if err != nil {
		t.Fatalf("head: %v", err)
	}
	return p
}

func readStream(t *testing.T, s eventstore.Store, stream string) []eventstore.RecordedEvent {
	t.Helper()
	evs, err := s.ReadStream(ctxT(t), stream, 0, eventstore.Forwards, 0)
	if err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	return evs
}

func ids(evs []eventstore.RecordedEvent) []uuid.UUID {
	out := make([]uuid.UUID, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

func dataIDs(evs []eventstore.EventData) []uuid.UUID {
	out := make([]uuid.UUID, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// readAllOnce pages through "all" after `after` once, keeping events of streams
// with prefix p; it returns them and the position it stopped at (the last event
// seen, whatever its stream).
func readAllOnce(t *testing.T, s eventstore.Store, after eventstore.Position, p string) ([]eventstore.RecordedEvent, eventstore.Position) {
	t.Helper()
	var out []eventstore.RecordedEvent
	for {
		page, err := s.ReadAll(ctxT(t), after, 7) // a small page: paging is exercised
		if err != nil {
			t.Fatalf("read all after %s: %v", after, err)
		}
		for _, e := range page {
			if e.Position.Compare(after) <= 0 {
				t.Fatalf("read all after %s returned %s (not strictly after)", after, e.Position)
			}
			after = e.Position
			if strings.HasPrefix(e.Stream, p) {
				out = append(out, e)
			}
		}
		if len(page) < 7 {
			return out, after
		}
	}
}

// readAllUntil reads "all" after `after` until n events of prefix p are there
// (the PostgreSQL store shows a commit only once no older transaction runs).
func readAllUntil(t *testing.T, s eventstore.Store, after eventstore.Position, p string, n int) []eventstore.RecordedEvent {
	t.Helper()
	var got []eventstore.RecordedEvent
	devtest.Eventually(t, waitTimeout, fmt.Sprintf("%d events of %s in all", n, p), func() bool {
		got, _ = readAllOnce(t, s, after, p)
		return len(got) >= n
	})
	if len(got) != n {
		t.Fatalf("all has %d events of %s, want %d", len(got), p, n)
	}
	return got
}

// receiveUntil takes events from sub until one has ID last.
func receiveUntil(t *testing.T, sub eventstore.Subscription, last uuid.UUID) []eventstore.RecordedEvent {
	t.Helper()
	var out []eventstore.RecordedEvent
	timeout := time.After(waitTimeout)
	for {
		select {
		case e, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended after %d events: %v", len(out), sub.Err())
			}
			out = append(out, e)
			if e.ID == last {
				return out
			}
		case <-timeout:
			t.Fatalf("event %s not received in %s (got %d events)", last, waitTimeout, len(out))
		}
	}
}

func subscribe(t *testing.T, s eventstore.Store, after eventstore.Position, prefixes ...string) eventstore.Subscription {
	t.Helper()
	sub, err := s.SubscribeAll(ctxT(t), after, eventstore.SubscribeOptions{StreamPrefixes: prefixes})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	t.Cleanup(func() { sub.Close() })
	return sub
}

func increasing(t *testing.T, what string, evs []eventstore.RecordedEvent) {
	t.Helper()
	for i := 1; i < len(evs); i++ {
		if evs[i].Position.Compare(evs[i-1].Position) <= 0 {
			t.Fatalf("%s: position %s at %d after %s: not strictly increasing", what, evs[i].Position, i, evs[i-1].Position)
		}
	}
}

func wantWrongRevision(t *testing.T, err error, stream string, exp eventstore.ExpectedRevision, actual int64) {
	t.Helper()
	var wer *eventstore.WrongExpectedRevisionError
	if !errors.As(err, &wer) || !errors.Is(err, eventstore.ErrWrongExpectedRevision) {
		t.Fatalf("append to %s at %s: got %v, want a WrongExpectedRevisionError", stream, exp, err)
	}
	if wer.Stream != stream || wer.Expected != exp || wer.Actual != actual {
		t.Fatalf("WrongExpectedRevisionError{%q, %s, %d}, want {%q, %s, %d}", wer.Stream, wer.Expected, wer.Actual, stream, exp, actual)
	}
}

func wantLen(t *testing.T, s eventstore.Store, stream string, n int) []eventstore.RecordedEvent {
	t.Helper()
	evs, err := s.ReadStream(ctxT(t), stream, 0, eventstore.Forwards, 0)
	if n == 0 {
		if !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("read %s: got %d events, %v; want ErrStreamNotFound", stream, len(evs), err)
		}
		return nil
	}
	if err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	if len(evs) != n {
		t.Fatalf("%s has %d events, want %d", stream, len(evs), n)
	}
	for i, e := range evs {
		if e.Revision != uint64(i) || e.Stream != stream {
			t.Fatalf("%s: event %d is %s@%d", stream, i, e.Stream, e.Revision)
		}
	}
	return evs
}

// wantResult fails unless an append's result has want's revisions and position.
func wantResult(t *testing.T, what string, got, want eventstore.AppendResult) {
	t.Helper()
	if got.FirstRevision != want.FirstRevision || got.LastRevision != want.LastRevision || got.Position != want.Position {
		t.Fatalf("%s: got revisions %d..%d at %s, want %d..%d at %s", what, got.FirstRevision, got.LastRevision, got.Position, want.FirstRevision, want.LastRevision, want.Position)
	}
}

// ---- tests ----

func testAppendAndRead(t *testing.T, s eventstore.Store, p string) {
	stream := p + "a"
	evs := events("Opened", 3)
	evs[2].Metadata = nil
	before := time.Now().Add(-time.Hour)
	res := mustAppend(t, s, stream, eventstore.NoStream, evs...)
	if res.FirstRevision != 0 || res.LastRevision != 2 || res.Position == eventstore.Start {
		t.Fatalf("first append: %+v", res)
	}
	got := wantLen(t, s, stream, 3)
	for i, e := range got {
		if e.ID != evs[i].ID || e.Type != evs[i].Type || !bytes.Equal(e.Data, evs[i].Data) || !bytes.Equal(e.Metadata, evs[i].Metadata) {
			t.Fatalf("event %d read back as %s %s %q %q, appended %s %s %q %q",
				i, e.ID, e.Type, e.Data, e.Metadata, evs[i].ID, evs[i].Type, evs[i].Data, evs[i].Metadata)
		}
		if e.Created.Before(before) || e.Created.After(time.Now().Add(time.Hour)) {
			t.Fatalf("event %d created %s", i, e.Created)
		}
	}
	increasing(t, "stream", got)
	if got[2].Position != res.Position {
		t.Fatalf("append returned %s, last event is at %s", res.Position, got[2].Position)
	}

	res2 := mustAppend(t, s, stream, eventstore.Exact(2), events("Credited", 2)...)
	if res2.FirstRevision != 3 || res2.LastRevision != 4 || res2.Position.Compare(res.Position) <= 0 {
		t.Fatalf("exact append: %+v after %+v", res2, res)
	}
	if r := mustAppend(t, s, stream, eventstore.StreamExists, event("Credited", 5)); r.FirstRevision != 5 || r.LastRevision != 5 {
		t.Fatalf("stream-exists append: %+v", r)
	}
	if r := mustAppend(t, s, stream, eventstore.Any, event("Credited", 6)); r.FirstRevision != 6 || r.LastRevision != 6 {
		t.Fatalf("any append: %+v", r)
	}
	if r := mustAppend(t, s, p+"b", eventstore.Any, event("Opened", 0)); r.FirstRevision != 0 {
		t.Fatalf("any append to a new stream: %+v", r)
	}
	all := increasingStreamRead(t, s, stream, 7)
	headReaches(t, s, all[6].Position)
	wantLen(t, s, p+"missing", 0)
}

func increasingStreamRead(t *testing.T, s eventstore.Store, stream string, n int) []eventstore.RecordedEvent {
	t.Helper()
	evs := wantLen(t, s, stream, n)
	increasing(t, stream, evs)
	return evs
}

// headReaches waits until Head is at or after p.
func headReaches(t *testing.T, s eventstore.Store, p eventstore.Position) {
	t.Helper()
	devtest.Eventually(t, waitTimeout, "head to reach "+p.String(), func() bool { return head(t, s).Compare(p) >= 0 })
}

func testWrongExpectedRevision(t *testing.T, s eventstore.Store, p string) {
	ctx := ctxT(t)
	stream, missing := p+"a", p+"missing"
	mustAppend(t, s, stream, eventstore.NoStream, events("E", 2)...)

	cases := []struct {
		name   string
		stream string
		exp    eventstore.ExpectedRevision
		actual int64
	}{
		{"NoStream on an existing stream", stream, eventstore.NoStream, 1},
		{"Exact beyond the head", stream, eventstore.Exact(5), 1},
		{"Exact one beyond the head", stream, eventstore.Exact(2), 1},
		{"Exact before the head, other IDs", stream, eventstore.Exact(0), 1},
		{"StreamExists on a missing stream", missing, eventstore.StreamExists, -1},
		{"Exact on a missing stream", missing, eventstore.Exact(0), -1},
	}
	for _, c := range cases {
		_, err := s.Append(ctx, c.stream, c.exp, []eventstore.EventData{event("X", 0)})
		if err == nil {
			t.Fatalf("%s: append succeeded", c.name)
		}
		wantWrongRevision(t, err, c.stream, c.exp, c.actual)
	}
	wantLen(t, s, stream, 2)
	wantLen(t, s, missing, 0)
}

// testConcurrentAppends: 16 appenders race at the same expected revision with
// different IDs, several rounds: exactly one wins each revision, the others get
// WrongExpectedRevision naming the winner's revision.
func testConcurrentAppends(t *testing.T, s eventstore.Store, p string) {
	const writers, rounds = 16, 5
	stream := p + "race"
	ctx := ctxT(t)
	var winners []uuid.UUID
	for r := range rounds {
		exp := eventstore.ExactOrNoStream(int64(r) - 1)
		start := make(chan struct{})
		errs := make([]error, writers)
		evs := make([]eventstore.EventData, writers)
		var wg sync.WaitGroup
		for w := range writers {
			evs[w] = event("Raced", w)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := s.Append(ctx, stream, exp, []eventstore.EventData{evs[w]})
				if err == nil && (res.FirstRevision != uint64(r) || res.LastRevision != uint64(r)) {
					err = fmt.Errorf("won at revisions %d..%d, want %d", res.FirstRevision, res.LastRevision, r)
				}
				errs[w] = err
			}()
		}
		close(start)
		wg.Wait()
		won := -1
		for w, err := range errs {
			if err == nil {
				if won >= 0 {
					t.Fatalf("round %d: writers %d and %d both won", r, won, w)
				}
				won = w
				continue
			}
			wantWrongRevision(t, err, stream, exp, int64(r))
		}
		if won < 0 {
			t.Fatalf("round %d: nobody won", r)
		}
		winners = append(winners, evs[won].ID)
	}
	if got := ids(wantLen(t, s, stream, rounds)); !slices.Equal(got, winners) {
		t.Fatalf("stream holds %v, winners were %v", got, winners)
	}
}

// testIdempotentReappend: re-appending events at the expected revision they were
// first appended with returns the original revisions and position, even after
// the stream grew, and writes nothing.
func testIdempotentReappend(t *testing.T, s eventstore.Store, p string) {
	stream := p + "a"
	abc := events("E", 3)
	d := event("E", 3)
	r1 := mustAppend(t, s, stream, eventstore.NoStream, abc...)
	r2 := mustAppend(t, s, stream, eventstore.Exact(2), d)
	if r1.Idempotent || r2.Idempotent {
		t.Fatalf("fresh writes reported as idempotent: %+v %+v", r1, r2)
	}
	evs := wantLen(t, s, stream, 4)
	// A backend that reports deduplicated appends (PostgreSQL, memory) must say so.
	if _, reports := s.(interface{ ReportsIdempotentAppends() bool }); reports {
		if again := mustAppend(t, s, stream, eventstore.Exact(2), d); !again.Idempotent {
			t.Fatalf("a deduplicated append is not reported as idempotent: %+v", again)
		}
	}

	wantResult(t, "abc again at no_stream", mustAppend(t, s, stream, eventstore.NoStream, abc...), eventstore.AppendResult{FirstRevision: 0, LastRevision: 2, Position: r1.Position})
	wantResult(t, "ab again at no_stream", mustAppend(t, s, stream, eventstore.NoStream, abc[:2]...), eventstore.AppendResult{FirstRevision: 0, LastRevision: 1, Position: evs[1].Position})
	wantResult(t, "bc again at 0", mustAppend(t, s, stream, eventstore.Exact(0), abc[1:]...), eventstore.AppendResult{FirstRevision: 1, LastRevision: 2, Position: r1.Position})
	wantResult(t, "d again at 2", mustAppend(t, s, stream, eventstore.Exact(2), d), eventstore.AppendResult{FirstRevision: 3, LastRevision: 3, Position: r2.Position})
	if got := ids(wantLen(t, s, stream, 4)); !slices.Equal(got, append(dataIDs(abc), d.ID)) {
		t.Fatalf("stream changed: %v", got)
	}
}

// testPartialOverlap: a re-append that only partly matches what is there is a
// conflict, not a success, and writes nothing.
func testPartialOverlap(t *testing.T, s eventstore.Store, p string) {
	stream := p + "a"
	abc := events("E", 3)
	mustAppend(t, s, stream, eventstore.NoStream, abc...)
	x, d := event("E", 10), event("E", 11)
	cases := []struct {
		name string
		exp  eventstore.ExpectedRevision
		evs  []eventstore.EventData
	}{
		{"first matches, second differs", eventstore.NoStream, []eventstore.EventData{abc[0], x}},
		{"first differs, second matches", eventstore.NoStream, []eventstore.EventData{x, abc[1]}},
		{"batch runs past the head", eventstore.Exact(0), []eventstore.EventData{abc[1], abc[2], d}},
		{"last matches, batch runs past the head", eventstore.Exact(1), []eventstore.EventData{abc[2], d}},
	}
	for _, c := range cases {
		_, err := s.Append(ctxT(t), stream, c.exp, c.evs)
		if err == nil {
			t.Fatalf("%s: append succeeded", c.name)
		}
		wantWrongRevision(t, err, stream, c.exp, 2)
	}
	if got := ids(wantLen(t, s, stream, 3)); !slices.Equal(got, dataIDs(abc)) {
		t.Fatalf("stream changed: %v", got)
	}
}

// testReappendAtNextRevision: the same events appended again at the stream's new
// head are NOT recognised as a duplicate: KurrentDB writes them a second time, a
// store with unique event IDs refuses them; neither returns the original write.
// This is why the domain dedupes command keys itself (ARCHITECTURE decision 4): a
// retry that reloaded the stream expects the new head.
func testReappendAtNextRevision(t *testing.T, s eventstore.Store, p string) {
	stream := p + "a"
	ab := events("E", 2)
	mustAppend(t, s, stream, eventstore.NoStream, ab...)
	res, err := s.Append(ctxT(t), stream, eventstore.Exact(1), ab)
	if err == nil {
		if res.FirstRevision != 2 || res.LastRevision != 3 {
			t.Fatalf("re-append at the next revision returned %+v: deduped, or written at the wrong revisions", res)
		}
		evs := wantLen(t, s, stream, 4)
		if !slices.Equal(ids(evs[2:]), dataIDs(ab)) {
			t.Fatalf("written again, but not as the same events: %v", ids(evs))
		}
		t.Logf("store wrote the events a second time (at 2..3)")
		return
	}
	if errors.Is(err, eventstore.ErrWrongExpectedRevision) {
		t.Fatalf("re-append at the right revision reported a wrong revision: %v", err)
	}
	wantLen(t, s, stream, 2)
	t.Logf("store refused the duplicate IDs: %v", err)
}

// testAnyIdempotent: with Any (and StreamExists), a batch whose first event is
// already in the stream returns the original write.
func testAnyIdempotent(t *testing.T, s eventstore.Store, p string) {
	stream := p + "a"
	ab := events("E", 2)
	r1 := mustAppend(t, s, stream, eventstore.NoStream, ab...)
	mustAppend(t, s, stream, eventstore.Exact(1), event("E", 2))
	evs := wantLen(t, s, stream, 3)

	wantResult(t, "ab again with any", mustAppend(t, s, stream, eventstore.Any, ab...), eventstore.AppendResult{FirstRevision: 0, LastRevision: 1, Position: r1.Position})
	wantResult(t, "a again with any", mustAppend(t, s, stream, eventstore.Any, ab[0]), eventstore.AppendResult{FirstRevision: 0, LastRevision: 0, Position: evs[0].Position})
	wantResult(t, "ab again with stream_exists", mustAppend(t, s, stream, eventstore.StreamExists, ab...), eventstore.AppendResult{FirstRevision: 0, LastRevision: 1, Position: r1.Position})
	wantLen(t, s, stream, 3)
	if r := mustAppend(t, s, stream, eventstore.Any, event("E", 3)); r.FirstRevision != 3 {
		t.Fatalf("a new event with any was written at %d, want 3", r.FirstRevision)
	}
	wantLen(t, s, stream, 4)
}

// testGlobalOrder: concurrent optimistic writers on a few streams, and
// unconditional (Any) writers on one hot stream; "all" then holds
// every event once, in strictly increasing positions, each stream's events in
// revision order, at the positions the appends returned; reads after a position
// are exclusive.
func testGlobalOrder(t *testing.T, s eventstore.Store, p string) {
	start := head(t, s)
	all := writeConcurrently(t, s, p)
	total := 0
	for _, w := range all {
		total += w.n
	}
	got := readAllUntil(t, s, start, p, total)
	increasing(t, "all", got)
	checkStreamOrderAndPositions(t, got, all)
	checkExclusiveReads(t, s, p, got)
	headReaches(t, s, got[len(got)-1].Position)
}

// appended is one append of testGlobalOrder: its stream, result and event count.
type appended struct {
	stream string
	res    eventstore.AppendResult
	n      int
}

// writeConcurrently runs 8 writers of 6 rounds each: a round appends one event
// to the hot stream unconditionally, then 1 or 2 events to one of 4 streams at
// the revision it read last (retrying a conflict). It returns every append.
func writeConcurrently(t *testing.T, s eventstore.Store, p string) []appended {
	const writers, appends, nstreams = 8, 6, 4
	ctx := ctxT(t)
	var mu sync.Mutex
	var all []appended
	record := func(a appended) {
		mu.Lock()
		all = append(all, a)
		mu.Unlock()
	}
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range appends {
				stream := fmt.Sprintf("%ss%d", p, (w+i)%nstreams)
				n := 1 + (w+i)%2
				// Unconditional appends to one hot stream: nothing but the store's
				// own serialisation orders them.
				hot := p + "hot"
				res, err := s.Append(ctx, hot, eventstore.Any, events("E", 1))
				if err != nil {
					errs <- err
					return
				}
				record(appended{hot, res, 1})
				res, err = appendAtLastRevision(ctx, s, stream, n)
				if err != nil {
					errs <- err
					return
				}
				record(appended{stream, res, n})
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return all
}

// appendAtLastRevision appends n events to stream expecting the revision a
// backwards read of its last event finds, and reads again after a conflict (up
// to 200 times).
func appendAtLastRevision(ctx context.Context, s eventstore.Store, stream string, n int) (eventstore.AppendResult, error) {
	for attempt := 0; ; attempt++ {
		exp := eventstore.NoStream
		if last, err := s.ReadStream(ctx, stream, eventstore.EndOfStream, eventstore.Backwards, 1); err == nil {
			if len(last) != 1 {
				return eventstore.AppendResult{}, fmt.Errorf("backwards read of the last event of %s returned %d events and no error", stream, len(last))
			}
			exp = eventstore.Exact(last[0].Revision)
		} else if !errors.Is(err, eventstore.ErrStreamNotFound) {
			return eventstore.AppendResult{}, err
		}
		res, err := s.Append(ctx, stream, exp, events("E", n))
		if errors.Is(err, eventstore.ErrWrongExpectedRevision) && attempt < 200 {
			continue
		}
		return res, err
	}
}

// checkStreamOrderAndPositions checks that "all" holds each stream's events in
// revision order, and each append's last event at the position it returned.
func checkStreamOrderAndPositions(t *testing.T, got []eventstore.RecordedEvent, all []appended) {
	t.Helper()
	next := map[string]uint64{}
	at := map[string]eventstore.Position{}
	for _, e := range got {
		if e.Revision != next[e.Stream] {
			t.Fatalf("all: %s@%d where %s@%d was due: stream order broken", e.Stream, e.Revision, e.Stream, next[e.Stream])
		}
		next[e.Stream]++
		at[fmt.Sprintf("%s@%d", e.Stream, e.Revision)] = e.Position
	}
	for _, w := range all {
		if pos := at[fmt.Sprintf("%s@%d", w.stream, w.res.LastRevision)]; pos != w.res.Position {
			t.Fatalf("append to %s returned %s, all has its last event at %s", w.stream, w.res.Position, pos)
		}
	}
}

// checkExclusiveReads checks that a read of "all" after every fifth event's
// position gives exactly the events after it.
func checkExclusiveReads(t *testing.T, s eventstore.Store, p string, got []eventstore.RecordedEvent) {
	t.Helper()
	for i := 0; i < len(got); i += 5 {
		tail, _ := readAllOnce(t, s, got[i].Position, p)
		if len(tail) != len(got)-i-1 || (len(tail) > 0 && tail[0].ID != got[i+1].ID) {
			t.Fatalf("read after event %d (%s) returned %d events, want the %d after it", i, got[i].Position, len(tail), len(got)-i-1)
		}
	}
}

// testHeldTransaction: A's transaction stays open while B commits. Whatever a
// reader of "all" (and a subscriber) sees meanwhile, once A commits it must
// deliver A and B exactly once each, in strictly increasing positions: a reader
// that delivered B, then A at an earlier position, would have skipped A forever.
func testHeldTransaction(t *testing.T, s eventstore.Store, p string) {
	ha, ok := s.(HeldAppender)
	if !ok {
		t.Skip("the store cannot hold an append open (no AppendHeld)")
	}
	ctx := ctxT(t)
	start := head(t, s)
	sub := subscribe(t, s, start, p)

	a, b := event("A", 0), event("B", 0)
	heldA, err := ha.AppendHeld(ctx, p+"a", eventstore.NoStream, []eventstore.EventData{a})
	if err != nil {
		t.Fatalf("held append: %v", err)
	}
	defer heldA.Rollback() // no-op once committed
	resB := mustAppend(t, s, p+"b", eventstore.NoStream, b)

	// A reader checkpointing as it goes: what it sees before A commits.
	seen, checkpoint := readAllOnce(t, s, start, p)
	for _, e := range seen {
		if e.ID == a.ID {
			t.Fatal("all shows A before its transaction committed")
		}
	}
	delivered := observeWhileHeld(t, sub, a.ID)

	if err := heldA.Commit(); err != nil {
		t.Fatalf("commit A: %v", err)
	}
	// The reader goes on from its checkpoint and must find A (and B if not yet).
	// A may show before B does: a transaction of another test whose xid lies
	// between theirs holds B back until it ends (the horizon is gap-safe), so
	// the reader waits for both, not for A alone.
	var rest []eventstore.RecordedEvent
	devtest.Eventually(t, waitTimeout, "A and B in all after A's commit", func() bool {
		rest, _ = readAllOnce(t, s, checkpoint, p)
		got := append(slices.Clone(seen), rest...)
		return contains(got, a.ID) && contains(got, b.ID)
	})
	checkExactlyOnce(t, "reader", append(seen, rest...), a.ID, b.ID)
	// The subscriber likewise.
	delivered = receiveBoth(t, sub, delivered, a.ID, b.ID)
	checkExactlyOnce(t, "subscriber", delivered, a.ID, b.ID)
	// Nothing after: both were delivered once; B's position is the one Append returned.
	for _, e := range delivered {
		if e.ID == b.ID && e.Position != resB.Position {
			t.Fatalf("B delivered at %s, appended at %s", e.Position, resB.Position)
		}
	}
}

// observeWhileHeld gives the subscriber time to poll while A is held (an
// observation window for the bug to show, not a synchronisation: nothing waits
// on it) and returns what it delivered, which must not be A.
func observeWhileHeld(t *testing.T, sub eventstore.Subscription, a uuid.UUID) []eventstore.RecordedEvent {
	t.Helper()
	var delivered []eventstore.RecordedEvent
	window := time.After(150 * time.Millisecond)
	for {
		select {
		case e, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			if e.ID == a {
				t.Fatal("subscriber delivered A before its transaction committed")
			}
			delivered = append(delivered, e)
		case <-window:
			return delivered
		}
	}
}

// receiveBoth receives until the subscriber has delivered A and B (A having
// committed), within waitTimeout, and returns all it delivered.
func receiveBoth(t *testing.T, sub eventstore.Subscription, delivered []eventstore.RecordedEvent, a, b uuid.UUID) []eventstore.RecordedEvent {
	t.Helper()
	timeout := time.After(waitTimeout)
	for !contains(delivered, a) || !contains(delivered, b) {
		select {
		case e, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			delivered = append(delivered, e)
		case <-timeout:
			t.Fatalf("subscriber did not deliver A and B in %s after A committed (got %d events)", waitTimeout, len(delivered))
		}
	}
	return delivered
}

func contains(evs []eventstore.RecordedEvent, id uuid.UUID) bool {
	for _, e := range evs {
		if e.ID == id {
			return true
		}
	}
	return false
}

func checkExactlyOnce(t *testing.T, who string, evs []eventstore.RecordedEvent, want ...uuid.UUID) {
	t.Helper()
	increasing(t, who, evs)
	count := map[uuid.UUID]int{}
	for _, e := range evs {
		count[e.ID]++
	}
	for _, id := range want {
		if count[id] != 1 {
			t.Fatalf("%s delivered %s %d times, want once (delivered %d events)", who, id, count[id], len(evs))
		}
	}
	if len(evs) != len(want) {
		t.Fatalf("%s delivered %d events, want %d", who, len(evs), len(want))
	}
}

func testCatchUpThenLive(t *testing.T, s eventstore.Store, p string) {
	stream := p + "a"
	start := head(t, s)
	for i := range 5 {
		mustAppend(t, s, stream, eventstore.ExactOrNoStream(int64(i)-1), event("E", i))
	}
	sub := subscribe(t, s, start, p)
	got := devtest.Receive(t, sub, 5)
	for i := range 5 {
		mustAppend(t, s, stream, eventstore.Exact(uint64(4+i)), event("E", 5+i))
	}
	got = append(got, devtest.Receive(t, sub, 5)...)
	increasing(t, "subscription", got)
	if want := ids(wantLen(t, s, stream, 10)); !slices.Equal(ids(got), want) {
		t.Fatalf("subscription delivered %v, stream holds %v", ids(got), want)
	}

	// From a position: exclusive.
	from := subscribe(t, s, got[2].Position, p)
	if tail := devtest.Receive(t, from, 7); !slices.Equal(ids(tail), ids(got[3:])) {
		t.Fatalf("subscription after event 2 delivered %v, want %v", ids(tail), ids(got[3:]))
	}

	// Close ends it: the channel is closed, Err is nil.
	if err := sub.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, ok := <-sub.Events(); ok {
		for range sub.Events() {
		}
	}
	if err := sub.Err(); err != nil {
		t.Fatalf("Err after Close: %v", err)
	}
}

func testPrefixFilter(t *testing.T, s eventstore.Store, p string) {
	start := head(t, s)
	streams := []string{p + "acct-1", p + "xfer-1", p + "acct-2", p + "other", p + "acctx"}
	revs := map[string]int64{}
	var order []eventstore.EventData
	var names []string
	for i := range 15 {
		stream := streams[i%len(streams)]
		e := event("E", i)
		mustAppend(t, s, stream, eventstore.ExactOrNoStream(revs[stream]-1), e)
		revs[stream]++
		order = append(order, e)
		names = append(names, stream)
	}
	sentinel := event("E", 99)
	mustAppend(t, s, p+"acct-zz", eventstore.NoStream, sentinel)
	order, names = append(order, sentinel), append(names, p+"acct-zz")

	check := func(prefixes ...string) {
		t.Helper()
		sub := subscribe(t, s, start, prefixes...)
		got := receiveUntil(t, sub, sentinel.ID)
		var want []uuid.UUID
		for i, e := range order {
			for _, pre := range prefixes {
				if strings.HasPrefix(names[i], pre) {
					want = append(want, e.ID)
					break
				}
			}
		}
		if !slices.Equal(ids(got), want) {
			t.Fatalf("prefixes %v: delivered %d events %v, want %d %v", prefixes, len(got), ids(got), len(want), want)
		}
		increasing(t, "filtered subscription", got)
		sub.Close()
	}
	check(p + "acct-")
	check(p+"acct-", p+"xfer-")
}

func testContextCancellation(t *testing.T, s eventstore.Store, p string) {
	stream := p + "a"
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Append(cancelled, stream, eventstore.NoStream, []eventstore.EventData{event("E", 0)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("append with a cancelled context: %v", err)
	}
	wantLen(t, s, stream, 0)
	mustAppend(t, s, stream, eventstore.NoStream, event("E", 0))
	if _, err := s.ReadStream(cancelled, stream, 0, eventstore.Forwards, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("read stream with a cancelled context: %v", err)
	}
	if _, err := s.ReadAll(cancelled, eventstore.Start, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("read all with a cancelled context: %v", err)
	}
	if sub, err := s.SubscribeAll(cancelled, eventstore.Start, eventstore.SubscribeOptions{}); err == nil {
		devtest.WaitClosed(t, sub)
	}

	// Cancelling a live subscription's context ends it promptly, Err nil.
	ctx, cancelSub := context.WithCancel(context.Background())
	sub, err := s.SubscribeAll(ctx, head(t, s), eventstore.SubscribeOptions{StreamPrefixes: []string{p}})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	mustAppend(t, s, stream, eventstore.Exact(0), event("E", 1))
	devtest.Receive(t, sub, 1)
	cancelSub()
	devtest.WaitClosed(t, sub)
	if err := sub.Err(); err != nil {
		t.Fatalf("Err after cancellation: %v", err)
	}

	// An append waiting for a stream another append holds ends at its deadline.
	ha, ok := s.(HeldAppender)
	if !ok {
		return
	}
	held := p + "held"
	h, err := ha.AppendHeld(ctxT(t), held, eventstore.NoStream, []eventstore.EventData{event("E", 0)})
	if err != nil {
		t.Fatalf("held append: %v", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelShort()
	began := time.Now()
	_, err = s.Append(short, held, eventstore.Any, []eventstore.EventData{event("E", 1)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("append blocked behind a held append: %v, want the deadline", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("append took %s to notice its deadline", took)
	}
	if err := h.Rollback(); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	wantLen(t, s, held, 0)
	mustAppend(t, s, held, eventstore.NoStream, event("E", 2)) // the lock is gone
}

func testReadStreamDirections(t *testing.T, s eventstore.Store, p string) {
	ctx := ctxT(t)
	stream := p + "a"
	mustAppend(t, s, stream, eventstore.NoStream, events("E", 10)...)
	revs := func(evs []eventstore.RecordedEvent) []int {
		out := make([]int, len(evs))
		for i, e := range evs {
			out[i] = int(e.Revision)
		}
		return out
	}
	cases := []struct {
		name string
		from eventstore.Revision
		dir  eventstore.Direction
		max  int
		want []int
	}{
		{"forwards from 3, max 4", 3, eventstore.Forwards, 4, []int{3, 4, 5, 6}},
		{"forwards from 0, no max", 0, eventstore.Forwards, 0, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"forwards from 8, max 5", 8, eventstore.Forwards, 5, []int{8, 9}},
		{"forwards past the end", 10, eventstore.Forwards, 0, []int{}},
		{"backwards from the end, max 3", eventstore.EndOfStream, eventstore.Backwards, 3, []int{9, 8, 7}},
		{"backwards from 5, no max", 5, eventstore.Backwards, 0, []int{5, 4, 3, 2, 1, 0}},
		{"backwards from beyond the end, max 2", 100, eventstore.Backwards, 2, []int{9, 8}},
	}
	for _, c := range cases {
		got, err := s.ReadStream(ctx, stream, c.from, c.dir, c.max)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if fmt.Sprint(revs(got)) != fmt.Sprint(c.want) {
			t.Fatalf("%s: revisions %v, want %v", c.name, revs(got), c.want)
		}
	}
	if _, err := s.ReadStream(ctx, p+"missing", 0, eventstore.Forwards, 0); !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatalf("missing stream, forwards: %v", err)
	}
	if _, err := s.ReadStream(ctx, p+"missing", eventstore.EndOfStream, eventstore.Backwards, 0); !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatalf("missing stream, backwards: %v", err)
	}
}

func testMultiAppend(t *testing.T, s eventstore.Store, p string) {
	ma := multiAppender(t, s)
	ctx := ctxT(t)
	start := head(t, s)
	x, y, z := p+"x", p+"y", p+"z"
	xs, ys := events("E", 2), events("E", 1)
	parts := []eventstore.StreamAppend{
		{Stream: x, Expected: eventstore.NoStream, Events: xs},
		{Stream: y, Expected: eventstore.NoStream, Events: ys},
	}
	res, err := ma.AppendMulti(ctx, parts)
	if err != nil {
		t.Fatalf("multi append: %v", err)
	}
	if len(res) != 2 || res[0].FirstRevision != 0 || res[0].LastRevision != 1 || res[1].FirstRevision != 0 || res[1].LastRevision != 0 {
		t.Fatalf("multi append results %+v", res)
	}
	got := readAllUntil(t, s, start, p, 3)
	increasing(t, "all", got)
	pos := positionsByID(got)
	if pos[xs[1].ID] != res[0].Position || pos[ys[0].ID] != res[1].Position {
		t.Fatalf("multi append returned %s, %s; all has %s, %s", res[0].Position, res[1].Position, pos[xs[1].ID], pos[ys[0].ID])
	}

	// Idempotent as a whole.
	again, err := ma.AppendMulti(ctx, parts)
	for i := range again {
		again[i].Idempotent = false // reported or not, the rest must be the original
	}
	if err != nil || len(again) != 2 || again[0] != res[0] || again[1] != res[1] {
		t.Fatalf("multi re-append: %+v, %v; want %+v", again, err, res)
	}

	// All or none: the conflict on x leaves z unwritten.
	_, err = ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: z, Expected: eventstore.NoStream, Events: events("E", 1)},
		{Stream: x, Expected: eventstore.NoStream, Events: events("E", 1)},
	})
	wantWrongRevision(t, err, x, eventstore.NoStream, 1)
	wantLen(t, s, z, 0)
	wantLen(t, s, x, 2)

	checkCrossedMultiAppends(ctx, t, ma, s, p)
}

// checkCrossedMultiAppends checks that appends sharing two streams in opposite
// orders do not deadlock: 8 writers of 10 appends each, all written.
func checkCrossedMultiAppends(ctx context.Context, t *testing.T, ma eventstore.MultiAppender, s eventstore.Store, p string) {
	t.Helper()
	const writers, rounds = 8, 10
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for range rounds {
				a, b := p+"s1", p+"s2"
				if w%2 == 1 {
					a, b = b, a
				}
				if _, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
					{Stream: a, Expected: eventstore.Any, Events: events("E", 1)},
					{Stream: b, Expected: eventstore.Any, Events: events("E", 1)},
				}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatalf("crossed multi appends: %v", err)
		}
	}
	wantLen(t, s, p+"s1", writers*rounds)
	wantLen(t, s, p+"s2", writers*rounds)
}

// positionsByID maps each event's ID to its position.
func positionsByID(evs []eventstore.RecordedEvent) map[uuid.UUID]eventstore.Position {
	pos := make(map[uuid.UUID]eventstore.Position, len(evs))
	for _, e := range evs {
		pos[e.ID] = e.Position
	}
	return pos
}

// testMultiAppendChain: one append may name a stream in several parts, in
// revision order, each decided on the head the earlier parts leave (several
// commands of one account in one group commit); a part that does not follow
// refuses the whole append.
// testMultiAppendAsserts: a part with no events writes nothing and holds the
// append to its stream's revision: the append is written when the stream is
// at it (or has no events, for NoStream), refused as a whole when another
// write moved it; a part with no events and no exact revision is refused.
func testMultiAppendAsserts(t *testing.T, s eventstore.Store, p string) {
	ma := multiAppender(t, s)
	ctx := ctxT(t)
	read, other, ghost, out := p+"read", p+"other", p+"ghost", p+"out"
	mustAppend(t, s, read, eventstore.NoStream, events("R", 2)...)
	res, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: read, Expected: eventstore.Exact(1)},
		{Stream: ghost, Expected: eventstore.NoStream},
		{Stream: out, Expected: eventstore.NoStream, Events: events("O", 1)},
	})
	if err != nil || len(res) != 3 || res[2].FirstRevision != 0 {
		t.Fatalf("asserting the revisions that hold: %+v, %v", res, err)
	}
	wantLen(t, s, read, 2)
	mustAppend(t, s, read, eventstore.Exact(1), events("R", 1)...) // another write moves it
	_, err = ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: read, Expected: eventstore.Exact(1)},
		{Stream: out, Expected: eventstore.Exact(0), Events: events("O", 1)},
	})
	var wrong *eventstore.WrongExpectedRevisionError
	if !errors.As(err, &wrong) || wrong.Stream != read || wrong.Actual != 2 {
		t.Fatalf("asserting a revision another write moved: %v", err)
	}
	wantLen(t, s, out, 1)
	if _, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{{Stream: other, Expected: eventstore.Any}}); err == nil {
		t.Fatal("a part with no events and no exact revision was taken")
	}
}

// testMultiAppendRepeatsSameEvents: a part is idempotent only where its
// events sit with the same types, not only the same IDs (eventstore.SameEvent);
// otherwise the whole append is refused and writes nothing. Chaos C4 (seed 258958648): two
// ledgers decided one post_transaction, one rejected it (its key's claim and a
// TransactionRejected), the other posted it in an append whose claim and
// transaction event had the same IDs (taken as idempotent) and whose legs in
// the accounts were new: legs written with no posting.
func testMultiAppendRepeatsSameEvents(t *testing.T, s eventstore.Store, p string) {
	ma := multiAppender(t, s)
	ctx := ctxT(t)
	key, tx, acc := p+"key", p+"tx", p+"acc"
	claim, rejected := event("Claimed", 0), event("Rejected", 0)
	mustAppend(t, s, acc, eventstore.NoStream, event("Opened", 0))
	if _, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: key, Expected: eventstore.NoStream, Events: []eventstore.EventData{claim}},
		{Stream: tx, Expected: eventstore.NoStream, Events: []eventstore.EventData{rejected}},
		{Stream: acc, Expected: eventstore.Exact(0)},
	}); err != nil {
		t.Fatalf("the first decision: %v", err)
	}
	posted := event("Posted", 0)
	posted.ID = rejected.ID // the same key's other decision: its event IDs are the same
	_, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: key, Expected: eventstore.NoStream, Events: []eventstore.EventData{claim}},
		{Stream: tx, Expected: eventstore.NoStream, Events: []eventstore.EventData{posted}},
		{Stream: acc, Expected: eventstore.Exact(0), Events: []eventstore.EventData{event("Debited", 1)}},
	})
	var wrong *eventstore.WrongExpectedRevisionError
	if !errors.As(err, &wrong) || wrong.Stream != tx {
		t.Errorf("another type under the ID of a stored event: %v, want a wrong expected revision of %s", err, tx)
	}
	wantLen(t, s, acc, 1)
	reclaim := claim
	reclaim.Data = []byte(`{"first": 1}`) // a claim made again with another attempt's revision
	res, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: key, Expected: eventstore.NoStream, Events: []eventstore.EventData{reclaim}},
		{Stream: tx, Expected: eventstore.NoStream, Events: []eventstore.EventData{rejected}},
	})
	if err != nil || !res[0].Idempotent || !res[1].Idempotent {
		t.Fatalf("the same events again (the claim's data other): %+v, %v; want both idempotent", res, err)
	}
}

// testMultiAppendMustBeNew: a part that MustBeNew is refused where the
// stream holds its events, same IDs, types and data, and the whole append
// writes nothing; without the flag the same part is a repeat. The ledger sets
// it on an atomic command's claim (chaos C4): two decisions of one key that
// write the same types with other data (an atomic batch refused and applied)
// pass SameEvent, and the second one's new parts would be written.
func testMultiAppendMustBeNew(t *testing.T, s eventstore.Store, p string) {
	ma := multiAppender(t, s)
	ctx := ctxT(t)
	key, acc := p+"key", p+"acc"
	claim := event("Claimed", 0)
	mustAppend(t, s, acc, eventstore.NoStream, event("Opened", 0))
	if _, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: key, Expected: eventstore.NoStream, Events: []eventstore.EventData{claim}, MustBeNew: true},
		{Stream: acc, Expected: eventstore.Exact(0)},
	}); err != nil {
		t.Fatalf("the first decision, its claim new: %v", err)
	}
	_, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: key, Expected: eventstore.NoStream, Events: []eventstore.EventData{claim}, MustBeNew: true},
		{Stream: acc, Expected: eventstore.Exact(0), Events: []eventstore.EventData{event("Debited", 1)}},
	})
	var wrong *eventstore.WrongExpectedRevisionError
	if !errors.As(err, &wrong) || wrong.Stream != key {
		t.Errorf("a stored claim that must be new: %v, want a wrong expected revision of %s", err, key)
	}
	wantLen(t, s, acc, 1)
	res, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: key, Expected: eventstore.NoStream, Events: []eventstore.EventData{claim}},
	})
	if err != nil || !res[0].Idempotent {
		t.Fatalf("the same claim again, not required new: %+v, %v; want idempotent", res, err)
	}
}

func testMultiAppendChain(t *testing.T, s eventstore.Store, p string) {
	ma := multiAppender(t, s)
	ctx := ctxT(t)
	start := head(t, s)
	x, k := p+"x", p+"k"
	a, b, c := events("E", 2), events("E", 1), events("E", 2)
	parts := []eventstore.StreamAppend{
		{Stream: x, Expected: eventstore.NoStream, Events: a},
		{Stream: k, Expected: eventstore.NoStream, Events: events("K", 1)},
		{Stream: x, Expected: eventstore.Exact(1), Events: b},
		{Stream: x, Expected: eventstore.Exact(2), Events: c},
	}
	res, err := ma.AppendMulti(ctx, parts)
	if err != nil {
		t.Fatalf("chained multi append: %v", err)
	}
	wantFirst := []uint64{0, 0, 2, 3}
	wantLast := []uint64{1, 0, 2, 4}
	for i, r := range res {
		if r.FirstRevision != wantFirst[i] || r.LastRevision != wantLast[i] {
			t.Fatalf("part %d: revisions %d..%d, want %d..%d", i, r.FirstRevision, r.LastRevision, wantFirst[i], wantLast[i])
		}
	}
	got := wantLen(t, s, x, 5)
	if want := append(append(dataIDs(a), dataIDs(b)...), dataIDs(c)...); !slices.Equal(ids(got), want) {
		t.Fatalf("stream %v, want %v", ids(got), want)
	}
	all := readAllUntil(t, s, start, p, 6)
	increasing(t, "all", all)
	pos := positionsByID(all)
	if pos[a[1].ID] != res[0].Position || pos[b[0].ID] != res[2].Position || pos[c[1].ID] != res[3].Position {
		t.Fatalf("parts report positions %s %s %s; all has %s %s %s", res[0].Position, res[2].Position, res[3].Position, pos[a[1].ID], pos[b[0].ID], pos[c[1].ID])
	}

	// The same chain again is idempotent part by part.
	again, err := ma.AppendMulti(ctx, parts)
	if err != nil {
		t.Fatalf("chained re-append: %v", err)
	}
	for i := range again {
		again[i].Idempotent = false
		if again[i] != res[i] {
			t.Fatalf("re-append part %d: %+v, want %+v", i, again[i], res[i])
		}
	}

	checkChainRefusals(ctx, t, s, chain{x: x, k: k, c: c})
}

// chain is what testMultiAppendChain wrote: stream x at revision 4, k at 0,
// and c, the last part of x.
type chain struct {
	x, k string
	c    []eventstore.EventData
}

// checkChainRefusals checks, on the chain testMultiAppendChain wrote, that
// chains that do not follow are refused whole, nothing written.
func checkChainRefusals(ctx context.Context, t *testing.T, s eventstore.Store, ch chain) {
	t.Helper()
	ma, x, k, c := multiAppender(t, s), ch.x, ch.k, ch.c
	// A stored part then a new one: the new one was decided on the events the
	// stored part carries, which the store may hold other versions of (the same
	// IDs): refused, nothing written.
	_, err := ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: k, Expected: eventstore.Exact(0), Events: events("K", 1)},
		{Stream: x, Expected: eventstore.Exact(2), Events: c},
		{Stream: x, Expected: eventstore.Exact(4), Events: events("E", 1)},
	})
	wantWrongRevision(t, err, x, eventstore.Exact(4), 4)
	wantLen(t, s, x, 5)
	wantLen(t, s, k, 1)

	// A part that does not follow the one before it refuses the whole append.
	_, err = ma.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: k, Expected: eventstore.Exact(0), Events: events("K", 1)},
		{Stream: x, Expected: eventstore.Exact(4), Events: events("E", 1)},
		{Stream: x, Expected: eventstore.Exact(4), Events: events("E", 1)},
	})
	wantWrongRevision(t, err, x, eventstore.Exact(4), 5)
	wantLen(t, s, x, 5)
	wantLen(t, s, k, 1)
}

// multiAppender is s as a MultiAppender; a store without one skips the test (it
// has no such capability to check: KurrentDB through the v4 client).
func multiAppender(t *testing.T, s eventstore.Store) eventstore.MultiAppender {
	t.Helper()
	ma, ok := s.(eventstore.MultiAppender)
	if !ok {
		t.Skip("the store has no multi-stream append")
	}
	return ma
}

// testSubjects: a store that finds events by subject (SubjectReader) returns a
// stream's events of one subject in revision order, bounded by max, none of
// another stream's or subject's, and indexes an event once however often its
// append is repeated.
func testSubjects(t *testing.T, s eventstore.Store, p string) {
	sr, ok := s.(eventstore.SubjectReader)
	if !ok {
		t.Skip("the store does not read events by subject")
	}
	ctx := ctxT(t)
	a, b := p+"a", p+"b"
	evs := events("E", 4)
	evs[0].Subject, evs[1].Subject, evs[3].Subject = "hold:x", "hold:y", "hold:x"
	mustAppend(t, s, a, eventstore.NoStream, evs...)
	mustAppend(t, s, a, eventstore.NoStream, evs...) // a repeat: idempotent
	other := events("E", 1)
	other[0].Subject = "hold:x"
	mustAppend(t, s, b, eventstore.NoStream, other...)
	got, err := sr.ReadStreamSubject(ctx, a, "hold:x", 0)
	if err != nil || len(got) != 2 || got[0].ID != evs[0].ID || got[1].ID != evs[3].ID || got[1].Revision != 3 || !bytes.Equal(got[1].Data, evs[3].Data) {
		t.Fatalf("subject hold:x of %s: %+v, %v", a, got, err)
	}
	if got, err := sr.ReadStreamSubject(ctx, a, "hold:x", 1); err != nil || len(got) != 1 || got[0].ID != evs[0].ID {
		t.Fatalf("max 1: %+v, %v", got, err)
	}
	if got, err := sr.ReadStreamSubject(ctx, b, "hold:x", 0); err != nil || len(got) != 1 || got[0].ID != other[0].ID {
		t.Fatalf("subject hold:x of %s: %+v, %v", b, got, err)
	}
	for _, q := range [][2]string{{a, "hold:z"}, {p + "none", "hold:x"}, {a, ""}} {
		if got, err := sr.ReadStreamSubject(ctx, q[0], q[1], 0); err != nil || len(got) != 0 {
			t.Fatalf("subject %q of %s: %+v, %v", q[1], q[0], got, err)
		}
	}
}

// testLocateEvents: a store that locates events (EventLocator) finds one by ID,
// says when it holds none, and refuses an ID it holds when written at the head of
// its own stream (a repeat of an earlier write), naming the ID and the stream.
func testLocateEvents(t *testing.T, s eventstore.Store, p string) {
	loc, ok := s.(eventstore.EventLocator)
	if !ok {
		t.Skip("the store does not locate events by ID")
	}
	ctx := ctxT(t)
	a := p + "a"
	evs := events("E", 3)
	mustAppend(t, s, a, eventstore.NoStream, evs...)
	got, err := loc.ReadEventByID(ctx, evs[1].ID)
	if err != nil || got.Stream != a || got.Revision != 1 || got.ID != evs[1].ID || !bytes.Equal(got.Data, evs[1].Data) {
		t.Fatalf("located %+v, %v", got, err)
	}
	if _, err := loc.ReadEventByID(ctx, uuid.New()); !errors.Is(err, eventstore.ErrEventNotFound) {
		t.Fatalf("an unknown ID: %v", err)
	}
	unknown := uuid.New()
	exist, err := loc.EventsExist(ctx, []uuid.UUID{evs[0].ID, unknown, evs[2].ID})
	if err != nil || len(exist) != 2 || !exist[evs[0].ID] || !exist[evs[2].ID] || exist[unknown] {
		t.Fatalf("which exist: %v, %v", exist, err)
	}
	read, err := loc.ReadEventsByID(ctx, []uuid.UUID{evs[2].ID, unknown, evs[0].ID})
	if err != nil || len(read) != 2 {
		t.Fatalf("read by ID: %v, %v", read, err)
	}
	for _, i := range []int{0, 2} {
		if got := read[evs[i].ID]; got.Stream != a || got.Revision != eventstore.Revision(i) || got.Type != evs[i].Type || !bytes.Equal(got.Data, evs[i].Data) {
			t.Fatalf("read by ID, event %d: %+v", i, got)
		}
	}
	if none, err := loc.ReadEventsByID(ctx, []uuid.UUID{unknown}); err != nil || len(none) != 0 {
		t.Fatalf("read by ID, none held: %v, %v", none, err)
	}
	_, err = s.Append(ctx, a, eventstore.Exact(2), []eventstore.EventData{event("E", 9), evs[0]})
	var dup *eventstore.DuplicateEventIDError
	if !errors.As(err, &dup) || dup.ID != evs[0].ID || dup.Stream != a || !errors.Is(err, eventstore.ErrDuplicateEventID) {
		t.Fatalf("a repeated ID at the head: %v", err)
	}
	wantLen(t, s, a, 3)
	if ma, ok := s.(eventstore.MultiAppender); ok {
		_, err = ma.AppendMulti(ctx, []eventstore.StreamAppend{
			{Stream: p + "b", Expected: eventstore.NoStream, Events: events("E", 1)},
			{Stream: a, Expected: eventstore.Exact(2), Events: []eventstore.EventData{evs[2]}},
		})
		if !errors.As(err, &dup) || dup.ID != evs[2].ID || dup.Stream != a {
			t.Fatalf("a repeated ID in a multi-stream append: %v", err)
		}
		wantLen(t, s, a, 3)
	}
}

// testSnapshots: a store keeps the latest snapshot of each stream, never one
// older than it holds, and lists them in stream order.
func testSnapshots(t *testing.T, s eventstore.Store, p string) {
	ss, ok := s.(eventstore.SnapshotStore)
	if !ok {
		t.Skip("the store keeps no snapshots")
	}
	ctx := ctxT(t)
	if _, err := ss.ReadSnapshot(ctx, p+"a"); !errors.Is(err, eventstore.ErrSnapshotNotFound) {
		t.Fatalf("no snapshot yet: %v", err)
	}
	write := func(stream string, rev uint64, data string) {
		t.Helper()
		if err := ss.WriteSnapshot(ctx, eventstore.Snapshot{Stream: stream, Revision: rev, Data: []byte(data)}); err != nil {
			t.Fatal(err)
		}
	}
	write(p+"b", 5, "b5")
	write(p+"a", 10, "a10")
	write(p+"a", 7, "a7") // older: ignored
	write(p+"b", 9, "b9")
	got, err := ss.ReadSnapshot(ctx, p+"a")
	if err != nil || got.Revision != 10 || string(got.Data) != "a10" || got.Taken.IsZero() {
		t.Fatalf("snapshot of a: %+v, %v", got, err)
	}
	list, err := ss.ReadSnapshots(ctx, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	var mine []string
	for _, sn := range list {
		if strings.HasPrefix(sn.Stream, p) {
			mine = append(mine, fmt.Sprintf("%s@%d=%s", strings.TrimPrefix(sn.Stream, p), sn.Revision, sn.Data))
		}
	}
	if strings.Join(mine, " ") != "a@10=a10 b@9=b9" {
		t.Fatalf("listed %v", mine)
	}
	if one, err := ss.ReadSnapshots(ctx, p+"a", 1); err != nil || len(one) != 1 || one[0].Stream <= p+"a" {
		t.Fatalf("listed after a, at most 1: %+v, %v", one, err)
	}
}

// testReadCold: a store that reads many streams' starts at once (ColdReader)
// answers each stream asked, in the order asked and as often as asked: up to
// max events from its snapshot's revision (that event first) or from its
// start, the snapshot with them, and nothing for a stream that does not
// exist; a max below 1 is refused.
func testReadCold(t *testing.T, s eventstore.Store, p string) {
	cr, ok := s.(eventstore.ColdReader)
	if !ok {
		t.Skip("the store reads no streams' starts at once")
	}
	ctx := ctxT(t)
	a, b, none := p+"a", p+"b", p+"none"
	mustAppend(t, s, a, eventstore.NoStream, events("A", 5)...)
	mustAppend(t, s, b, eventstore.NoStream, events("B", 2)...)
	revs := func(evs []eventstore.RecordedEvent, stream string) string {
		var out []string
		for _, e := range evs {
			if e.Stream != stream {
				return "another stream's event: " + e.Stream
			}
			out = append(out, strconv.FormatUint(e.Revision, 10))
		}
		return strings.Join(out, ",")
	}
	check := func(got []eventstore.ColdStream, want []string, snapA uint64) {
		t.Helper()
		streams := []string{b, none, a, b}
		for i, st := range streams {
			if r := revs(got[i].Events, st); r != want[i] {
				t.Errorf("stream %d (%s): revisions %q, want %q", i, st, r, want[i])
			}
			snap := got[i].Snapshot
			switch {
			case st == a && snapA > 0 && (snap == nil || snap.Revision != snapA || string(snap.Data) != "a-snap"):
				t.Errorf("%s: snapshot %+v, want one at %d", st, snap, snapA)
			case (st != a || snapA == 0) && snap != nil:
				t.Errorf("%s: snapshot %+v, want none", st, snap)
			}
		}
	}
	got, err := cr.ReadCold(ctx, []string{b, none, a, b}, 3)
	if err != nil || len(got) != 4 {
		t.Fatalf("read cold: %d answers, %v", len(got), err)
	}
	check(got, []string{"0,1", "", "0,1,2", "0,1"}, 0)
	if ss, ok := s.(eventstore.SnapshotStore); ok {
		if err := ss.WriteSnapshot(ctx, eventstore.Snapshot{Stream: a, Revision: 2, Data: []byte("a-snap")}); err != nil {
			t.Fatal(err)
		}
		if got, err = cr.ReadCold(ctx, []string{b, none, a, b}, 2); err != nil || len(got) != 4 {
			t.Fatalf("read cold after a snapshot: %d answers, %v", len(got), err)
		}
		check(got, []string{"0,1", "", "2,3", "0,1"}, 2)
	}
	if _, err := cr.ReadCold(ctx, []string{a}, 0); err == nil {
		t.Fatal("max 0 was not refused")
	}
}
