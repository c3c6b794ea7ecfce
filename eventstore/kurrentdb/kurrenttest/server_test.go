package kurrenttest_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/EventStore/EventStore-Client-Go/v4/protos/serverfeatures"
	"github.com/EventStore/EventStore-Client-Go/v4/protos/shared"
	api "github.com/EventStore/EventStore-Client-Go/v4/protos/streams"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ledgerworks/ledger/internal/testing/testcert"
)

// --- helpers -----------------------------------------------------------------

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func raw(t *testing.T, s *kurrenttest.Server) api.StreamsClient {
	t.Helper()
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return api.NewStreamsClient(conn)
}

func client(t *testing.T, s *kurrenttest.Server) *esdb.Client {
	t.Helper()
	return kurrenttest.Client(t, s.ConnectionString())
}

func ids(n int) []uuid.UUID {
	out := make([]uuid.UUID, n)
	for i := range out {
		out[i] = uuid.New()
	}
	return out
}

func events(idList ...uuid.UUID) []esdb.EventData {
	out := make([]esdb.EventData, len(idList))
	for i, id := range idList {
		out[i] = esdb.EventData{EventID: id, EventType: "Test", ContentType: esdb.ContentTypeJson, Data: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	return out
}

func mustAppend(t *testing.T, c *esdb.Client, stream string, exp esdb.ExpectedRevision, idList ...uuid.UUID) *esdb.WriteResult {
	t.Helper()
	wr, err := c.AppendToStream(ctxT(t), stream, esdb.AppendToStreamOptions{ExpectedRevision: exp}, events(idList...)...)
	if err != nil {
		t.Fatalf("append to %s (%T %v): %v", stream, exp, exp, err)
	}
	return wr
}

// rawAppend appends through the generated client, so the test sees the response as sent.
func rawAppend(t *testing.T, c api.StreamsClient, stream string, opt *api.AppendReq_Options, idList ...uuid.UUID) *api.AppendResp {
	t.Helper()
	resp, err := rawAppendErr(ctxT(t), c, stream, opt, idList...)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func rawAppendErr(ctx context.Context, c api.StreamsClient, stream string, opt *api.AppendReq_Options, idList ...uuid.UUID) (*api.AppendResp, error) {
	msgs := make([]*api.AppendReq_ProposedMessage, len(idList))
	for i, id := range idList {
		msgs[i] = proposal(id, "Test", []byte(`{}`))
	}
	return rawAppendMsgs(ctx, c, stream, opt, msgs...)
}

func proposal(id uuid.UUID, eventType string, data []byte) *api.AppendReq_ProposedMessage {
	return &api.AppendReq_ProposedMessage{
		Id:       kurrenttest.UUIDToProto(id, false),
		Metadata: map[string]string{"type": eventType, "content-type": "application/json"},
		Data:     data,
	}
}

func rawAppendMsgs(ctx context.Context, c api.StreamsClient, stream string, opt *api.AppendReq_Options, msgs ...*api.AppendReq_ProposedMessage) (*api.AppendResp, error) {
	ac, err := c.Append(ctx)
	if err != nil {
		return nil, err
	}
	opt.StreamIdentifier = &shared.StreamIdentifier{StreamName: []byte(stream)}
	if err := ac.Send(&api.AppendReq{Content: &api.AppendReq_Options_{Options: opt}}); err != nil {
		if errors.Is(err, io.EOF) { // the server answered early: the status comes with the reply
			return ac.CloseAndRecv()
		}
		return nil, err
	}
	for _, m := range msgs {
		err := ac.Send(&api.AppendReq{Content: &api.AppendReq_ProposedMessage_{ProposedMessage: m}})
		if errors.Is(err, io.EOF) {
			return ac.CloseAndRecv()
		}
		if err != nil {
			return nil, err
		}
	}
	return ac.CloseAndRecv()
}

func expRev(r uint64) *api.AppendReq_Options {
	return &api.AppendReq_Options{ExpectedStreamRevision: &api.AppendReq_Options_Revision{Revision: r}}
}

func expNoStream() *api.AppendReq_Options {
	return &api.AppendReq_Options{ExpectedStreamRevision: &api.AppendReq_Options_NoStream{NoStream: &shared.Empty{}}}
}

func expAny() *api.AppendReq_Options {
	return &api.AppendReq_Options{ExpectedStreamRevision: &api.AppendReq_Options_Any{Any: &shared.Empty{}}}
}

func expStreamExists() *api.AppendReq_Options {
	return &api.AppendReq_Options{ExpectedStreamRevision: &api.AppendReq_Options_StreamExists{StreamExists: &shared.Empty{}}}
}

// readAllRaw collects every response of a finite read.
func readAllRaw(t *testing.T, rc api.Streams_ReadClient) []*api.ReadResp {
	t.Helper()
	var out []*api.ReadResp
	for {
		m, err := rc.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
}

func structured() *api.ReadReq_Options_UUIDOption {
	return &api.ReadReq_Options_UUIDOption{Content: &api.ReadReq_Options_UUIDOption_Structured{Structured: &shared.Empty{}}}
}

func streamReadReq(stream string, from uint64, backwards bool, count uint64) *api.ReadReq {
	dir := api.ReadReq_Options_Forwards
	if backwards {
		dir = api.ReadReq_Options_Backwards
	}
	return &api.ReadReq{Options: &api.ReadReq_Options{
		StreamOption: &api.ReadReq_Options_Stream{Stream: &api.ReadReq_Options_StreamOptions{
			StreamIdentifier: &shared.StreamIdentifier{StreamName: []byte(stream)},
			RevisionOption:   &api.ReadReq_Options_StreamOptions_Revision{Revision: from},
		}},
		ReadDirection: dir,
		CountOption:   &api.ReadReq_Options_Count{Count: count},
		FilterOption:  &api.ReadReq_Options_NoFilter{NoFilter: &shared.Empty{}},
		UuidOption:    structured(),
	}}
}

func allReadReq(from *api.ReadReq_Options_AllOptions, count uint64) *api.ReadReq {
	return &api.ReadReq{Options: &api.ReadReq_Options{
		StreamOption: &api.ReadReq_Options_All{All: from},
		CountOption:  &api.ReadReq_Options_Count{Count: count},
		FilterOption: &api.ReadReq_Options_NoFilter{NoFilter: &shared.Empty{}},
		UuidOption:   structured(),
	}}
}

func subAllReq(from *api.ReadReq_Options_AllOptions, filter *api.ReadReq_Options_FilterOptions) *api.ReadReq {
	req := &api.ReadReq{Options: &api.ReadReq_Options{
		StreamOption: &api.ReadReq_Options_All{All: from},
		CountOption:  &api.ReadReq_Options_Subscription{Subscription: &api.ReadReq_Options_SubscriptionOptions{}},
		FilterOption: &api.ReadReq_Options_NoFilter{NoFilter: &shared.Empty{}},
		UuidOption:   structured(),
	}}
	if filter != nil {
		req.Options.FilterOption = &api.ReadReq_Options_Filter{Filter: filter}
	}
	return req
}

func allStart() *api.ReadReq_Options_AllOptions {
	return &api.ReadReq_Options_AllOptions{AllOption: &api.ReadReq_Options_AllOptions_Start{Start: &shared.Empty{}}}
}

func allAt(pos uint64) *api.ReadReq_Options_AllOptions { return allAtPair(pos, pos) }

func allAtPair(commit, prepare uint64) *api.ReadReq_Options_AllOptions {
	return &api.ReadReq_Options_AllOptions{AllOption: &api.ReadReq_Options_AllOptions_Position{
		Position: &api.ReadReq_Options_Position{CommitPosition: commit, PreparePosition: prepare}}}
}

func prefixFilter(window, multiplier uint32, prefixes ...string) *api.ReadReq_Options_FilterOptions {
	return &api.ReadReq_Options_FilterOptions{
		Filter:                       &api.ReadReq_Options_FilterOptions_StreamIdentifier{StreamIdentifier: &api.ReadReq_Options_FilterOptions_Expression{Prefix: prefixes}},
		Window:                       &api.ReadReq_Options_FilterOptions_Max{Max: window},
		CheckpointIntervalMultiplier: multiplier,
	}
}

// kind names a ReadResp's content for compact assertions: "event:<stream>/<rev>",
// "checkpoint:<pos>", "confirmation", "caught_up", "stream_not_found".
func kind(m *api.ReadResp) string {
	switch c := m.Content.(type) {
	case *api.ReadResp_Event:
		e := c.Event.GetEvent()
		return fmt.Sprintf("event:%s/%d", e.GetStreamIdentifier().GetStreamName(), e.GetStreamRevision())
	case *api.ReadResp_Checkpoint_:
		if c.Checkpoint.GetCommitPosition() != c.Checkpoint.GetPreparePosition() {
			return fmt.Sprintf("checkpoint:%d/%d", c.Checkpoint.GetCommitPosition(), c.Checkpoint.GetPreparePosition())
		}
		return fmt.Sprintf("checkpoint:%d", c.Checkpoint.GetCommitPosition())
	case *api.ReadResp_Confirmation:
		return "confirmation"
	case *api.ReadResp_CaughtUp_:
		return "caught_up"
	case *api.ReadResp_StreamNotFound_:
		return "stream_not_found"
	case *api.ReadResp_LastStreamPosition:
		return fmt.Sprintf("last_stream_position:%d", c.LastStreamPosition)
	}
	return fmt.Sprintf("%T", m.Content)
}

// recvKinds receives n messages from a subscription.
func recvKinds(t *testing.T, rc api.Streams_ReadClient, n int) []string {
	t.Helper()
	out := make([]string, 0, n)
	for len(out) < n {
		m, err := rc.Recv()
		if err != nil {
			t.Fatalf("after %v: %v", out, err)
		}
		out = append(out, kind(m))
	}
	return out
}

func equal(t *testing.T, got, want []string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// --- connection ----------------------------------------------------------------

func TestClientConnectsAndRoundTrips(t *testing.T) {
	s, url := kurrenttest.Start(t)
	if url != "kurrentdb://"+s.Addr()+"?tls=false" {
		t.Fatalf("url %q", url)
	}
	c := client(t, s)
	id := uuid.New()
	wr := mustAppend(t, c, "acct-1", esdb.NoStream{}, id)
	if wr.NextExpectedVersion != 0 || wr.CommitPosition == 0 || wr.CommitPosition != wr.PreparePosition {
		t.Fatalf("write result %+v", wr)
	}
	rs, err := c.ReadStream(ctxT(t), "acct-1", esdb.ReadStreamOptions{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	ev, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got := ev.OriginalEvent()
	if got.EventID != id || got.EventType != "Test" || got.ContentType != "application/json" || got.StreamID != "acct-1" ||
		got.Position.Commit != wr.CommitPosition || string(got.Data) != `{"i":0}` {
		t.Fatalf("read back %+v", got)
	}
	if _, err := rs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF, got %v", err)
	}
	if s.Requests(kurrenttest.MethodGetSupportedMethods) != 1 {
		t.Fatalf("the client probes ServerFeatures once on connect, got %d", s.Requests(kurrenttest.MethodGetSupportedMethods))
	}
}

func TestGossipDiscovery(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	// Two gossip seeds put the client in cluster mode: it reads gossip first.
	c := kurrenttest.Client(t, "esdb://"+s.Addr()+","+s.Addr()+"?tls=false")
	mustAppend(t, c, "acct-g", esdb.Any{}, uuid.New())
	if s.Requests(kurrenttest.MethodGossipRead) == 0 {
		t.Fatal("gossip was not read")
	}
}

// --- IndexWriter rules -------------------------------------------------------------

func TestAppendExactAtHeadWritesWithoutIdempotencyCheck(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	c := client(t, s)
	a := ids(2)
	mustAppend(t, c, "s", esdb.NoStream{}, a...)
	// The same IDs again, expecting the head (1): written again, at 2 and 3.
	wr := mustAppend(t, c, "s", esdb.Revision(1), a...)
	if wr.NextExpectedVersion != 3 {
		t.Fatalf("current revision %d, want 3", wr.NextExpectedVersion)
	}
}

func TestAppendExactBeyondHeadIsWrongExpectedVersion(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	rawAppend(t, rc, "s", expNoStream(), ids(2)...)
	resp := rawAppend(t, rc, "s", expRev(5), ids(1)...)
	w := resp.GetWrongExpectedVersion()
	if w == nil || w.GetCurrentRevision() != 1 || w.GetExpectedRevision() != 5 || w.GetCurrentRevision_20_6_0() != 1 {
		t.Fatalf("response %v", resp)
	}
	// Exact on a missing stream: current is no_stream.
	resp = rawAppend(t, rc, "missing", expRev(0), ids(1)...)
	if resp.GetWrongExpectedVersion().GetCurrentNoStream() == nil {
		t.Fatalf("response %v", resp)
	}
}

func TestAppendIdempotentBeforeHeadReturnsOriginalWrite(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	first := ids(3)
	orig := rawAppend(t, rc, "s", expNoStream(), first...).GetSuccess()
	rawAppend(t, rc, "s", expRev(2), ids(2)...) // the stream moves on to 4

	// The whole batch again at its original expected revision: the original answer.
	again := rawAppend(t, rc, "s", expNoStream(), first...).GetSuccess()
	if again == nil || again.GetCurrentRevision() != 2 || again.GetPosition().GetCommitPosition() != orig.GetPosition().GetCommitPosition() ||
		again.GetPosition().GetPreparePosition() != orig.GetPosition().GetPreparePosition() {
		t.Fatalf("idempotent answer %v, original %v", again, orig)
	}
	// A prefix of the batch: the original revisions and the position of its last event.
	mid := rawAppend(t, rc, "s", expRev(0), first[1]).GetSuccess()
	if mid == nil || mid.GetCurrentRevision() != 1 {
		t.Fatalf("idempotent answer %v", mid)
	}
	// Nothing was written by the re-appends.
	msgs := readAllRaw(t, mustRead(t, rc, streamReadReq("s", 0, false, 100)))
	if len(msgs) != 5 {
		t.Fatalf("stream has %d events, want 5", len(msgs))
	}
}

func mustRead(t *testing.T, rc api.StreamsClient, req *api.ReadReq) api.Streams_ReadClient {
	t.Helper()
	r, err := rc.Read(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAppendIdempotencyMismatches(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	a := ids(3)
	rawAppend(t, rc, "s", expNoStream(), a...)

	cases := []struct {
		name string
		opt  *api.AppendReq_Options
		ids  []uuid.UUID
	}{
		{"first differs", expNoStream(), []uuid.UUID{uuid.New(), a[1]}},
		{"later differs (corrupted idempotency)", expNoStream(), []uuid.UUID{a[0], uuid.New()}},
		{"batch runs past the head", expRev(1), []uuid.UUID{a[2], uuid.New()}},
		{"right IDs, wrong offset", expRev(0), []uuid.UUID{a[0]}},
		{"no events before the head", expRev(0), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := rawAppend(t, rc, "s", tc.opt, tc.ids...)
			if w := resp.GetWrongExpectedVersion(); w == nil || w.GetCurrentRevision() != 2 {
				t.Fatalf("want wrong expected version with current 2, got %v", resp)
			}
		})
	}
	if n := len(readAllRaw(t, mustRead(t, rc, streamReadReq("s", 0, false, 100)))); n != 3 {
		t.Fatalf("stream has %d events, want 3", n)
	}
}

func TestAppendAnyIdempotencyFromRecentIDsOnly(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithIDCacheSize(4))
	rc := raw(t, s)
	a := ids(2)
	orig := rawAppend(t, rc, "s", expAny(), a...).GetSuccess()

	again := rawAppend(t, rc, "s", expAny(), a...).GetSuccess()
	if again.GetCurrentRevision() != 1 || again.GetPosition().GetCommitPosition() != orig.GetPosition().GetCommitPosition() {
		t.Fatalf("Any re-append: %v, original %v", again, orig)
	}
	// First ID known, second not: corrupted idempotency, answered as wrong expected version.
	if w := rawAppend(t, rc, "s", expAny(), a[0], uuid.New()).GetWrongExpectedVersion(); w == nil || w.GetExpectedAny() == nil || w.GetCurrentRevision() != 1 {
		t.Fatal("want wrong expected version for a half-known batch")
	}
	// Push the IDs out of the bounded cache: the same batch is written again.
	rawAppend(t, rc, "other", expAny(), ids(4)...)
	dup := rawAppend(t, rc, "s", expAny(), a...).GetSuccess()
	if dup.GetCurrentRevision() != 3 {
		t.Fatalf("after eviction Any writes again: current %d, want 3", dup.GetCurrentRevision())
	}
	// A known ID of another stream does not make an append to this one idempotent.
	b := ids(1)
	rawAppend(t, rc, "x", expAny(), b...)
	if got := rawAppend(t, rc, "y", expAny(), b...).GetSuccess(); got.GetCurrentRevision() != 0 {
		t.Fatalf("append to y: %v", got)
	}
}

func TestAppendStreamExists(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	resp := rawAppend(t, rc, "s", expStreamExists(), ids(1)...)
	if w := resp.GetWrongExpectedVersion(); w == nil || w.GetCurrentNoStream() == nil || w.GetExpectedStreamExists() == nil {
		t.Fatalf("StreamExists on a missing stream: %v", resp)
	}
	// A stream with metadata counts as existing.
	rawAppend(t, rc, "$$s", expAny(), ids(1)...)
	if got := rawAppend(t, rc, "s", expStreamExists(), ids(1)...).GetSuccess(); got.GetCurrentRevision() != 0 {
		t.Fatalf("StreamExists after metadata: %v", got)
	}
	a := ids(1)
	rawAppend(t, rc, "s", expStreamExists(), a...)
	if got := rawAppend(t, rc, "s", expStreamExists(), a...).GetSuccess(); got.GetCurrentRevision() != 1 {
		t.Fatalf("StreamExists re-append is idempotent from recent IDs: %v", got)
	}
}

func TestAppendNextRevisionIsNotDeduped(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	c := client(t, s)
	a := ids(1)
	mustAppend(t, c, "s", esdb.NoStream{}, a...)
	// A retry that reloaded the stream expects the new head: written again.
	if wr := mustAppend(t, c, "s", esdb.Revision(0), a...); wr.NextExpectedVersion != 1 {
		t.Fatalf("current %d, want 1", wr.NextExpectedVersion)
	}
}

func TestAppendRequiresTypeAndContentType(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	ac, err := rc.Append(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	opt := expAny()
	opt.StreamIdentifier = &shared.StreamIdentifier{StreamName: []byte("s")}
	_ = ac.Send(&api.AppendReq{Content: &api.AppendReq_Options_{Options: opt}})
	_ = ac.Send(&api.AppendReq{Content: &api.AppendReq_ProposedMessage_{ProposedMessage: &api.AppendReq_ProposedMessage{
		Id: kurrenttest.UUIDToProto(uuid.New(), false), Metadata: map[string]string{"type": "T"},
	}}})
	if _, err := ac.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("want InvalidArgument, got %v", err)
	}
}

func TestWrongExpectedVersionThroughClient(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	c := client(t, s)
	mustAppend(t, c, "s", esdb.NoStream{}, ids(3)...)
	_, err := c.AppendToStream(ctxT(t), "s", esdb.AppendToStreamOptions{ExpectedRevision: esdb.Revision(7)}, events(uuid.New())...)
	var e *esdb.Error
	if !errors.As(err, &e) || e.Code() != esdb.ErrorCodeWrongExpectedVersion {
		t.Fatalf("want wrong expected version, got %v", err)
	}
	if want := "expecting '7' but got '2'"; !contains(err.Error(), want) {
		t.Fatalf("error %q lacks %q", err, want)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// --- metadata --------------------------------------------------------------------

func TestCreatedIsTicksSinceUnixEpoch(t *testing.T) {
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456700, time.UTC)
	s, _ := kurrenttest.Start(t, kurrenttest.WithClock(func() time.Time { return at }))
	rc := raw(t, s)
	rawAppend(t, rc, "s", expAny(), ids(1)...)
	msgs := readAllRaw(t, mustRead(t, rc, streamReadReq("s", 0, false, 1)))
	md := msgs[0].GetEvent().GetEvent().GetMetadata()
	if md["created"] != strconv.FormatInt(at.UnixNano()/100, 10) || md["type"] != "Test" || md["content-type"] != "application/json" {
		t.Fatalf("metadata %v", md)
	}
	c := client(t, s)
	rs, err := c.ReadStream(ctxT(t), "s", esdb.ReadStreamOptions{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	ev, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !ev.OriginalEvent().CreatedDate.Equal(at) {
		t.Fatalf("created %v, want %v", ev.OriginalEvent().CreatedDate, at)
	}
}

// --- reads ---------------------------------------------------------------------------

func TestReadStreamNotFound(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	msgs := readAllRaw(t, mustRead(t, rc, streamReadReq("nope", 0, false, 10)))
	if len(msgs) != 1 || kind(msgs[0]) != "stream_not_found" || string(msgs[0].GetStreamNotFound().GetStreamIdentifier().GetStreamName()) != "nope" {
		t.Fatalf("messages %v", msgs)
	}
	c := client(t, s)
	rs, err := c.ReadStream(ctxT(t), "nope", esdb.ReadStreamOptions{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	_, err = rs.Recv()
	var e *esdb.Error
	if !errors.As(err, &e) || e.Code() != esdb.ErrorCodeResourceNotFound {
		t.Fatalf("want ResourceNotFound, got %v", err)
	}
}

func TestReadStreamDirectionsAndCounts(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	rawAppend(t, rc, "s", expNoStream(), ids(5)...)
	read := func(req *api.ReadReq) []string {
		var out []string
		for _, m := range readAllRaw(t, mustRead(t, rc, req)) {
			out = append(out, kind(m))
		}
		return out
	}
	equal(t, read(streamReadReq("s", 1, false, 2)), []string{"event:s/1", "event:s/2"})
	equal(t, read(streamReadReq("s", 3, true, 10)), []string{"event:s/3", "event:s/2", "event:s/1", "event:s/0"})
	equal(t, read(streamReadReq("s", 99, true, 2)), []string{"event:s/4", "event:s/3"})
	equal(t, read(streamReadReq("s", 9, false, 10)), nil) // past the end of an existing stream: nothing
	equal(t, read(streamReadReq("s", 0, false, 0)), nil)  // a count of zero reads nothing
	end := streamReadReq("s", 0, true, 1)
	end.Options.GetStream().RevisionOption = &api.ReadReq_Options_StreamOptions_End{End: &shared.Empty{}}
	equal(t, read(end), []string{"event:s/4"})
	// last_stream_position only for clients that ask for it (this client would panic on it).
	compat := streamReadReq("s", 0, false, 1)
	compat.Options.ControlOption = &api.ReadReq_Options_ControlOption{Compatibility: 1}
	equal(t, read(compat), []string{"event:s/0", "last_stream_position:4"})
}

func TestReadAllPositions(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithEmptyLog())
	rc := raw(t, s)
	var pos []uint64
	for i := range 4 {
		r := rawAppend(t, rc, fmt.Sprintf("s%d", i), expNoStream(), ids(1)...)
		pos = append(pos, r.GetSuccess().GetPosition().GetCommitPosition())
	}
	if !(pos[0] > 0 && pos[0] < pos[1] && pos[1] < pos[2] && pos[2] < pos[3]) {
		t.Fatalf("positions %v", pos)
	}
	readAll := func(from *api.ReadReq_Options_AllOptions, backwards bool, count uint64) []string {
		req := allReadReq(from, count)
		if backwards {
			req.Options.ReadDirection = api.ReadReq_Options_Backwards
		}
		var out []string
		for _, m := range readAllRaw(t, mustRead(t, rc, req)) {
			out = append(out, kind(m))
		}
		return out
	}
	equal(t, readAll(allStart(), false, 2), []string{"event:s0/0", "event:s1/0"})
	equal(t, readAll(allAt(pos[1]), false, 10), []string{"event:s1/0", "event:s2/0", "event:s3/0"}) // forwards: inclusive
	equal(t, readAll(allAt(pos[2]), true, 10), []string{"event:s1/0", "event:s0/0"})                // backwards: exclusive
	// Backwards compares post-positions: from (X, 0) the record ending at X is left out.
	equal(t, readAll(allAtPair(pos[2], 0), true, 10), []string{"event:s0/0"})
	equal(t, readAll(allAtPair(pos[2], 0), false, 1), []string{"event:s2/0"})
	end := &api.ReadReq_Options_AllOptions{AllOption: &api.ReadReq_Options_AllOptions_End{End: &shared.Empty{}}}
	equal(t, readAll(end, true, 1), []string{"event:s3/0"})
	equal(t, readAll(end, false, 1), nil)
}

func TestReadRequiresUUIDOption(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	req := streamReadReq("s", 0, false, 1)
	req.Options.UuidOption = nil
	r, err := rc.Read(ctxT(t), req)
	if err == nil {
		_, err = r.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("want InvalidArgument, got %v", err)
	}
}

// --- subscriptions ---------------------------------------------------------------------

func TestSubscribeAllConfirmationFirstExclusiveStartAndCaughtUp(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	p0 := rawAppend(t, rc, "a", expNoStream(), ids(1)...).GetSuccess().GetPosition().GetCommitPosition()
	rawAppend(t, rc, "b", expNoStream(), ids(1)...)

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	sub, err := rc.Read(ctx, subAllReq(allAt(p0), nil))
	if err != nil {
		t.Fatal(err)
	}
	equal(t, recvKinds(t, sub, 3), []string{"confirmation", "event:b/0", "caught_up"})
	rawAppend(t, rc, "c", expNoStream(), ids(1)...)
	equal(t, recvKinds(t, sub, 1), []string{"event:c/0"})
	devtest.Eventually(t, 2*time.Second, "one subscription", func() bool { return s.Subscriptions() == 1 })
	cancel()
	devtest.Eventually(t, 2*time.Second, "no subscription", func() bool { return s.Subscriptions() == 0 })
}

// TestSubscribeAllFromBetweenEvents: since 24.2 the server sends every event
// strictly after the start position; 23.10 started after the first event at or
// after it, so a start position no event sits at ((commit, 0) before an event,
// the form of a catch-up checkpoint) lost the next event (the backend therefore
// starts from an event's position: eventstore/kurrentdb startFor). A position
// inside a record is refused.
func TestSubscribeAllFromBetweenEvents(t *testing.T) {
	for release, want := range map[kurrenttest.Release][]string{
		kurrenttest.DefaultRelease: {"confirmation", "event:b/0", "event:c/0", "caught_up"},
		kurrenttest.Release23_10:   {"confirmation", "event:c/0", "caught_up"},
	} {
		t.Run(string(release), func(t *testing.T) {
			s, _ := kurrenttest.Start(t, kurrenttest.WithRelease(release))
			rc := raw(t, s)
			p0 := rawAppend(t, rc, "a", expNoStream(), ids(1)...).GetSuccess().GetPosition().GetCommitPosition()
			p1 := rawAppend(t, rc, "b", expNoStream(), ids(1)...).GetSuccess().GetPosition().GetCommitPosition()
			rawAppend(t, rc, "c", expNoStream(), ids(1)...)
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			sub, err := rc.Read(ctx, subAllReq(allAtPair(p1, 0), nil))
			if err != nil {
				t.Fatal(err)
			}
			equal(t, recvKinds(t, sub, len(want)), want)

			inside, err := rc.Read(ctx, subAllReq(allAt(p0+1), nil))
			if err != nil {
				t.Fatal(err)
			}
			equal(t, recvKinds(t, inside, 1), []string{"confirmation"})
			if _, err := inside.Recv(); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("a subscription from inside a record: %v, want InvalidArgument", err)
			}
			read, err := rc.Read(ctx, allReadReq(allAt(p0+1), 10))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := read.Recv(); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("a read from inside a record: %v, want InvalidArgument", err)
			}
		})
	}
}

func TestSubscribeAllFilteredCheckpoints(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithEmptyLog())
	rc := raw(t, s)
	// Ten events: acct-0..acct-9 at even indexes are "acct-", odd ones "other-".
	pos := appendMixed(t, rc, 10, func(i int) bool { return i%2 == 0 })
	// Window 3, multiplier 1: a checkpoint every 3 considered events.
	sub := subscribeAcct(t, rc, 3)
	// Catch-up pages [0..2] [3..5] [6..8] [9]: a checkpoint after each full page that
	// is not the last, at the last event sent in it (or where it began), and one
	// when catch-up goes live.
	equal(t, recvKinds(t, sub, 11), []string{
		"confirmation",
		"event:acct-0/0", "event:acct-2/0", fmt.Sprintf("checkpoint:%d", pos[2]),
		"event:acct-4/0", fmt.Sprintf("checkpoint:%d", pos[4]),
		"event:acct-6/0", "event:acct-8/0", fmt.Sprintf("checkpoint:%d", pos[8]),
		fmt.Sprintf("checkpoint:%d/0", pos[9]),
		"caught_up",
	})
	// Live: 10 events considered so far, counter at 1 (10 mod 3); two more non-matching
	// events reach 3: a checkpoint at the last of them.
	rawAppend(t, rc, "other-x", expNoStream(), ids(1)...)
	last := rawAppend(t, rc, "other-y", expNoStream(), ids(1)...).GetSuccess().GetPosition().GetCommitPosition()
	equal(t, recvKinds(t, sub, 1), []string{fmt.Sprintf("checkpoint:%d", last)})
	rawAppend(t, rc, "acct-z", expNoStream(), ids(1)...)
	equal(t, recvKinds(t, sub, 1), []string{"event:acct-z/0"})
}

// appendMixed appends one event to each of n streams, acct-i where acct(i) and
// other-i elsewhere, and returns their positions.
func appendMixed(t *testing.T, rc api.StreamsClient, n int, acct func(int) bool) []uint64 {
	t.Helper()
	var pos []uint64
	for i := range n {
		stream := fmt.Sprintf("other-%d", i)
		if acct(i) {
			stream = fmt.Sprintf("acct-%d", i)
		}
		pos = append(pos, rawAppend(t, rc, stream, expNoStream(), ids(1)...).GetSuccess().GetPosition().GetCommitPosition())
	}
	return pos
}

// subscribeAcct subscribes to $all from Start, filtered on the prefix "acct-"
// with the search window and a checkpoint every window considered events.
func subscribeAcct(t *testing.T, rc api.StreamsClient, window uint32) api.Streams_ReadClient {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	t.Cleanup(cancel)
	sub, err := rc.Read(ctx, subAllReq(allStart(), prefixFilter(window, 1, "acct-")))
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// TestSubscribeAllCheckpointWherePageWasReadFrom: a catch-up page without a
// match checkpoints where it was read from, the previous page's NextPos:
// (post-position of its last record, 0), a position no event sits at.
func TestSubscribeAllCheckpointWherePageWasReadFrom(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithEmptyLog())
	rc := raw(t, s)
	pos := appendMixed(t, rc, 7, func(i int) bool { return i == 0 })
	sub := subscribeAcct(t, rc, 2)
	// Pages [0 1] [2 3] [4 5] [6]; the last checkpoint is sent as catch-up goes live.
	equal(t, recvKinds(t, sub, 7), []string{
		"confirmation",
		"event:acct-0/0", fmt.Sprintf("checkpoint:%d", pos[0]),
		fmt.Sprintf("checkpoint:%d/0", pos[2]),
		fmt.Sprintf("checkpoint:%d/0", pos[4]),
		fmt.Sprintf("checkpoint:%d/0", pos[6]),
		"caught_up",
	})
	// 23.10 is not modelled with the going-live checkpoint.
	s23, _ := kurrenttest.Start(t, kurrenttest.WithEmptyLog(), kurrenttest.WithRelease(kurrenttest.Release23_10))
	rc23 := raw(t, s23)
	appendMixed(t, rc23, 3, func(i int) bool { return i == 0 })
	equal(t, recvKinds(t, subscribeAcct(t, rc23, 2), 4)[3:], []string{"caught_up"})
}

func TestSubscribeAllEventTypeAndRegexFilters(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithEmptyLog())
	c := client(t, s)
	mustAppend(t, c, "a", esdb.Any{}, uuid.New())
	_, err := c.AppendToStream(ctxT(t), "b", esdb.AppendToStreamOptions{}, esdb.EventData{EventID: uuid.New(), EventType: "$system", ContentType: esdb.ContentTypeJson})
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, c, "c", esdb.Any{}, uuid.New())
	for _, tc := range []struct {
		name   string
		filter *esdb.SubscriptionFilter
		want   []string
	}{
		{"exclude system event types", esdb.ExcludeSystemEventsFilter(), []string{"a", "c"}},
		{"event type prefix", &esdb.SubscriptionFilter{Type: esdb.EventFilterType, Prefixes: []string{"$sys"}}, []string{"b"}},
		{"stream regex", &esdb.SubscriptionFilter{Type: esdb.StreamFilterType, Regex: "^[bc]$"}, []string{"b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub, err := c.SubscribeToAll(ctxT(t), esdb.SubscribeToAllOptions{From: esdb.Start{}, Filter: tc.filter})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			var got []string
			for {
				ev := sub.Recv()
				if ev.SubscriptionDropped != nil {
					t.Fatal(ev.SubscriptionDropped.Error)
				}
				if ev.CaughtUp != nil {
					break
				}
				if ev.EventAppeared != nil {
					got = append(got, ev.EventAppeared.OriginalEvent().StreamID)
				}
			}
			equal(t, got, tc.want)
		})
	}
}

func TestSubscribeAllRejectsZeroCheckpointMultiplier(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	sub, err := rc.Read(ctxT(t), subAllReq(allStart(), prefixFilter(3, 0, "a")))
	if err == nil {
		_, err = sub.Recv()
	}
	if status.Code(err) == codes.OK {
		t.Fatal("want an error")
	}
}

func TestSubscribeStream(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	c := client(t, s)
	mustAppend(t, c, "s", esdb.NoStream{}, ids(3)...)
	sub, err := c.SubscribeToStream(ctxT(t), "s", esdb.SubscribeToStreamOptions{From: esdb.Revision(0)})
	if err != nil {
		t.Fatal(err) // the client itself requires the confirmation first
	}
	defer sub.Close()
	next := func() string {
		ev := sub.Recv()
		switch {
		case ev.EventAppeared != nil:
			return fmt.Sprintf("event:%d", ev.EventAppeared.OriginalEvent().EventNumber)
		case ev.CaughtUp != nil:
			return "caught_up"
		case ev.SubscriptionDropped != nil:
			return "dropped:" + ev.SubscriptionDropped.Error.Error()
		}
		return "?"
	}
	equal(t, []string{next(), next(), next()}, []string{"event:1", "event:2", "caught_up"})
	mustAppend(t, c, "s", esdb.Revision(2), uuid.New())
	equal(t, []string{next()}, []string{"event:3"})
}

// --- tombstones ------------------------------------------------------------------------

func TestTombstone(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	c := client(t, s)
	mustAppend(t, c, "s", esdb.NoStream{}, ids(2)...)
	if _, err := c.TombstoneStream(ctxT(t), "s", esdb.TombstoneStreamOptions{ExpectedRevision: esdb.Revision(0)}); err == nil {
		t.Fatal("tombstone with a wrong expected revision succeeded")
	}
	if _, err := c.TombstoneStream(ctxT(t), "s", esdb.TombstoneStreamOptions{ExpectedRevision: esdb.Revision(1)}); err != nil {
		t.Fatal(err)
	}
	// Reads and appends fail with FailedPrecondition and the stream-deleted trailers.
	rc := raw(t, s)
	var trailer metadata.MD
	r, err := rc.Read(ctxT(t), streamReadReq("s", 0, false, 10), grpc.Trailer(&trailer))
	if err == nil {
		_, err = r.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition || trailer.Get("exception")[0] != "stream-deleted" || trailer.Get("stream-name")[0] != "s" {
		t.Fatalf("read of a tombstoned stream: %v, trailers %v", err, trailer)
	}
	rs, err := c.ReadStream(ctxT(t), "s", esdb.ReadStreamOptions{}, 10)
	if err == nil {
		_, err = rs.Recv()
		rs.Close()
	}
	var e *esdb.Error
	if !errors.As(err, &e) || e.Code() != esdb.ErrorCodeStreamDeleted {
		t.Fatalf("client read: %v", err)
	}
	_, err = c.AppendToStream(ctxT(t), "s", esdb.AppendToStreamOptions{}, events(uuid.New())...)
	if !errors.As(err, &e) || e.Code() != esdb.ErrorCodeStreamDeleted {
		t.Fatalf("client append: %v", err)
	}
	// The tombstone itself is in $all.
	rs, err = c.ReadAll(ctxT(t), esdb.ReadAllOptions{Direction: esdb.Backwards, From: esdb.End{}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	ev, err := rs.Recv()
	if err != nil || ev.OriginalEvent().EventType != "$streamDeleted" || ev.OriginalEvent().EventNumber != uint64(kurrenttest.DeletedStream) {
		t.Fatalf("last of $all: %+v, %v", ev, err)
	}
}

// --- faults --------------------------------------------------------------------------

func TestUnavailable(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	s.SetUnavailable(true)
	if _, err := rawAppendErr(ctxT(t), rc, "s", expAny(), ids(1)...); status.Code(err) != codes.Unavailable {
		t.Fatalf("want Unavailable, got %v", err)
	}
	s.SetUnavailable(false)
	rawAppend(t, rc, "s", expAny(), ids(1)...)

	s.FailNext(kurrenttest.MethodAppend, 2, codes.Unavailable)
	for range 2 {
		if _, err := rawAppendErr(ctxT(t), rc, "s", expAny(), ids(1)...); status.Code(err) != codes.Unavailable {
			t.Fatalf("want Unavailable, got %v", err)
		}
	}
	rawAppend(t, rc, "s", expAny(), ids(1)...)
}

func TestStallAppends(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	rc := raw(t, s)
	for _, commit := range []bool{false, true} {
		t.Run(fmt.Sprintf("commit=%v", commit), func(t *testing.T) {
			stream := fmt.Sprintf("s-%v", commit)
			s.StallAppends(1, commit)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if _, err := rawAppendErr(ctx, rc, stream, expNoStream(), ids(1)...); status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("want DeadlineExceeded, got %v", err)
			}
			msgs := readAllRaw(t, mustRead(t, rc, streamReadReq(stream, 0, false, 10)))
			wantKind := "stream_not_found"
			if commit {
				wantKind = "event:" + stream + "/0"
			}
			if len(msgs) != 1 || kind(msgs[0]) != wantKind {
				t.Fatalf("after the stalled append: %v", msgs)
			}
		})
	}
}

func TestDropSubscriptions(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	c := client(t, s)
	mustAppend(t, c, "s", esdb.NoStream{}, uuid.New())
	sub, err := c.SubscribeToAll(ctxT(t), esdb.SubscribeToAllOptions{From: esdb.Start{}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if ev := sub.Recv(); ev.EventAppeared == nil {
		t.Fatalf("want the event, got %+v", ev)
	}
	devtest.Eventually(t, 2*time.Second, "one subscription", func() bool { return s.Subscriptions() == 1 })
	if n := s.DropSubscriptions(); n != 1 {
		t.Fatalf("dropped %d", n)
	}
	for {
		ev := sub.Recv()
		if ev.SubscriptionDropped != nil {
			if status.Code(ev.SubscriptionDropped.Error) != codes.Unavailable {
				t.Fatalf("dropped with %v", ev.SubscriptionDropped.Error)
			}
			break
		}
	}
	devtest.Eventually(t, 2*time.Second, "no subscription", func() bool { return s.Subscriptions() == 0 })
}

// TestClientNeverSendsRequiresLeader: EventStore-Client-Go v4.2.0 puts the
// requires-leader header into an incoming context (configureGrpcCall), so it
// never reaches the server, even with RequiresLeader set: a real follower
// forwards such a write to the leader instead of answering NotLeader. If this
// fails after a client upgrade, followers will start answering NotLeader.
func TestClientNeverSendsRequiresLeader(t *testing.T) {
	s, _ := kurrenttest.Start(t)
	c := client(t, s)
	opts := esdb.AppendToStreamOptions{ExpectedRevision: esdb.Any{}, RequiresLeader: true}
	if _, err := c.AppendToStream(ctxT(t), "s", opts, events(uuid.New())...); err != nil {
		t.Fatal(err)
	}
	if n := s.RequiresLeaderCalls(); n != 0 {
		t.Fatalf("%d calls carried requires-leader: the client now sends it", n)
	}
}

func TestFaultsPastTheWrite(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithCommitTimeout(20*time.Millisecond))
	rc := raw(t, s)
	id := ids(1)
	s.FailAppendsAfterWrite(1, codes.Aborted)
	if _, err := rawAppendErr(ctxT(t), rc, "a", expNoStream(), id...); status.Code(err) != codes.Aborted {
		t.Fatalf("want Aborted after the write, got %v", err)
	}
	if resp := rawAppend(t, rc, "a", expNoStream(), id...); resp.GetSuccess().GetCurrentRevision() != 0 {
		t.Fatalf("retry: %v", resp)
	}

	s.HoldReplication(true)
	held := ids(1)
	for range 2 { // the write, then its retry (IdempotentNotReady)
		if _, err := rawAppendErr(ctxT(t), rc, "b", expNoStream(), held...); status.Code(err) != codes.Aborted {
			t.Fatalf("want Aborted while replication is held, got %v", err)
		}
	}
	if resp, err := rawAppendErr(ctxT(t), rc, "b", expNoStream(), ids(1)...); err != nil || resp.GetWrongExpectedVersion() == nil {
		t.Fatalf("another batch at the held write's revision: %v, %v; want a wrong expected version", resp, err)
	}
	s.HoldReplication(false)
	if resp := rawAppend(t, rc, "b", expNoStream(), held...); resp.GetSuccess().GetCurrentRevision() != 0 {
		t.Fatalf("retry after replication: %v", resp)
	}

	// The leader's endpoint in the trailers is checked through the client
	// (TestNotLeaderIsRetriedOnTheLeader in the backend's tests).
	s.NotLeaderNext(1, "")
	if _, err := rawAppendErr(ctxT(t), rc, "c", expAny(), ids(1)...); status.Code(err) != codes.NotFound {
		t.Fatalf("want NotFound (leader info), got %v", err)
	}
	if msgs := readAllRaw(t, mustRead(t, rc, streamReadReq("c", 0, false, 10))); len(msgs) != 1 || kind(msgs[0]) != "stream_not_found" {
		t.Fatalf("the refused append was written: %v", msgs)
	}
}

// TestAppendLimits: an append over the maximum size, counted as
// Event.SizeOnDisk, and an event with an empty type are refused while the
// server reads them, and nothing is written.
func TestAppendLimits(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithMaxAppendSize(100))
	rc := raw(t, s)
	// 2*len("Test") + 92 = 100: at the limit.
	if _, err := rawAppendMsgs(ctxT(t), rc, "a", expAny(), proposal(uuid.New(), "Test", make([]byte, 92))); err != nil {
		t.Fatalf("an append at the limit: %v", err)
	}
	over := []*api.AppendReq_ProposedMessage{proposal(uuid.New(), "Test", make([]byte, 50)), proposal(uuid.New(), "Test", make([]byte, 50))}
	_, err := rawAppendMsgs(ctxT(t), rc, "b", expAny(), over...)
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != "Maximum Append Size of 100 Exceeded." {
		t.Fatalf("an append over the limit: %v", err)
	}
	if _, err := rawAppendMsgs(ctxT(t), rc, "c", expAny(), proposal(uuid.New(), "", nil)); status.Code(err) != codes.Unknown {
		t.Fatalf("an event without type: %v", err)
	}
	for _, stream := range []string{"b", "c"} {
		if msgs := readAllRaw(t, mustRead(t, rc, streamReadReq(stream, 0, false, 10))); len(msgs) != 1 || kind(msgs[0]) != "stream_not_found" {
			t.Fatalf("%s was written: %v", stream, msgs)
		}
	}
}

// TestSecured: over TLS, with users, stream operations need credentials, a
// wrong password is Unauthenticated, and $all is for $admins only.
func TestSecured(t *testing.T) {
	ca := testcert.NewCA(t)
	s, _ := kurrenttest.Start(t, kurrenttest.WithTLS(ca.Issue(t, "kurrentdb", true).Pair(t)),
		kurrenttest.WithUsers(kurrenttest.User{Name: "admin", Password: "a", Admin: true}, kurrenttest.User{Name: "reader", Password: "r"}))
	caFile := testcert.WriteFile(t, "ca.crt", ca.CertPEM)
	connect := func(userinfo string) *esdb.Client {
		return kurrenttest.Client(t, "esdb://"+userinfo+s.Addr()+"?tlsCAFile="+caFile)
	}
	readAll := func(c *esdb.Client) error {
		rs, err := c.ReadAll(ctxT(t), esdb.ReadAllOptions{}, 10)
		if err != nil {
			return err
		}
		defer rs.Close()
		_, err = rs.Recv()
		return err
	}
	code := func(err error) esdb.ErrorCode {
		var e *esdb.Error
		if !errors.As(err, &e) {
			return esdb.ErrorCodeUnknown
		}
		return e.Code()
	}
	admin, reader := connect("admin:a@"), connect("reader:r@")
	mustAppend(t, admin, "s", esdb.NoStream{}, uuid.New())
	mustAppend(t, reader, "s", esdb.Revision(0), uuid.New())
	if err := readAll(admin); err != nil {
		t.Fatalf("admin reads $all: %v", err)
	}
	if err := readAll(reader); code(err) != esdb.ErrorCodeAccessDenied {
		t.Fatalf("reader reads $all: %v, want access denied", err)
	}
	if _, err := reader.SubscribeToAll(ctxT(t), esdb.SubscribeToAllOptions{}); code(err) != esdb.ErrorCodeAccessDenied {
		t.Fatalf("reader subscribes to $all: %v, want access denied", err)
	}
	_, err := connect("").AppendToStream(ctxT(t), "s", esdb.AppendToStreamOptions{}, events(uuid.New())...)
	if code(err) != esdb.ErrorCodeAccessDenied {
		t.Fatalf("anonymous append: %v, want access denied", err)
	}
	_, err = connect("admin:wrong@").AppendToStream(ctxT(t), "s", esdb.AppendToStreamOptions{}, events(uuid.New())...)
	if code(err) != esdb.ErrorCodeUnauthenticated {
		t.Fatalf("wrong password: %v, want unauthenticated", err)
	}
}

// TestBadCredentialsAreRefusedBeforeRouting: a secure node authenticates every
// call before it looks at the method (AuthenticationMiddleware), so wrong
// credentials are Unauthenticated on ServerFeatures, which needs none, and on
// a service the test server does not implement (the suite's
// callWithTLSAndInvalidOverrideCredentials creates a persistent subscription
// with them); with right ones the latter is Unimplemented.
func TestBadCredentialsAreRefusedBeforeRouting(t *testing.T) {
	ca := testcert.NewCA(t)
	s, _ := kurrenttest.Start(t, kurrenttest.WithTLS(ca.Issue(t, "kurrentdb", true).Pair(t)),
		kurrenttest.WithUsers(kurrenttest.User{Name: "admin", Password: "a", Admin: true}))
	caFile := testcert.WriteFile(t, "ca.crt", ca.CertPEM)
	c := kurrenttest.Client(t, "esdb://admin:a@"+s.Addr()+"?tlsCAFile="+caFile)
	code := func(err error) esdb.ErrorCode {
		var e *esdb.Error
		if !errors.As(err, &e) {
			return esdb.ErrorCodeUnknown
		}
		return e.Code()
	}
	create := func(login, password string) error {
		return c.CreatePersistentSubscription(ctxT(t), "s", "g", esdb.PersistentStreamSubscriptionOptions{
			Authenticated: &esdb.Credentials{Login: login, Password: password},
		})
	}
	if err := create("invalid", "invalid"); code(err) != esdb.ErrorCodeUnauthenticated {
		t.Errorf("an unimplemented call with wrong credentials: %v, want unauthenticated", err)
	}
	if err := create("admin", "a"); code(err) != esdb.ErrorCodeUnsupportedFeature {
		t.Errorf("an unimplemented call with right credentials: %v, want unsupported (Unimplemented)", err)
	}

	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(credentials.NewClientTLSFromCert(ca.Pool(), "")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	features := serverfeatures.NewServerFeaturesClient(conn)
	basic := func(userinfo string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(userinfo)))
	}
	if _, err := features.GetSupportedMethods(basic("admin:wrong"), &shared.Empty{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("ServerFeatures with wrong credentials: %v, want Unauthenticated", err)
	}
	if _, err := features.GetSupportedMethods(ctxT(t), &shared.Empty{}); err != nil {
		t.Errorf("ServerFeatures without credentials: %v", err)
	}
	if _, err := features.GetSupportedMethods(basic("admin:a"), &shared.Empty{}); err != nil {
		t.Errorf("ServerFeatures with credentials: %v", err)
	}
}

// TestRefusedAppendIsAnsweredAfterItsRequest: an append refused for its
// credentials (wrong ones: Unauthenticated; none: PermissionDenied) is answered
// once the server has read the request. Answered earlier, the client's Send
// reports only io.EOF, and client v4.2.0 returns that ("unexpected exception:
// EOF", ErrorCodeUnknown) instead of reading the status: a race a node's
// authentication usually loses to a small request, but which the in-process
// server won often enough to make the suite's
// appendToSystemStreamWithIncorrectCredentials flaky. Here the request is
// larger than flow control lets a client send unread (the server's window
// grows to 16 MiB at most), so on the old code a Send always failed.
func TestRefusedAppendIsAnsweredAfterItsRequest(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithUsers(kurrenttest.User{Name: "admin", Password: "a", Admin: true}))
	rc := raw(t, s)
	big := proposal(uuid.New(), "Test", make([]byte, 1<<20))
	for _, tc := range []struct {
		name, userinfo string
		want           codes.Code
	}{
		{"wrong password", "admin:wrong", codes.Unauthenticated},
		{"no credentials", "", codes.PermissionDenied},
	} {
		ctx := ctxT(t)
		if tc.userinfo != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(tc.userinfo)))
		}
		ac, err := rc.Append(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = ac.Send(&api.AppendReq{Content: &api.AppendReq_Options_{Options: &api.AppendReq_Options{
			StreamIdentifier:       &shared.StreamIdentifier{StreamName: []byte("s")},
			ExpectedStreamRevision: &api.AppendReq_Options_Any{Any: &shared.Empty{}},
		}}})
		for i := 0; i < 24 && err == nil; i++ {
			err = ac.Send(&api.AppendReq{Content: &api.AppendReq_ProposedMessage_{ProposedMessage: big}})
		}
		if err != nil {
			t.Errorf("%s: sending the request: %v, want it read before the answer", tc.name, err)
		}
		if _, err := ac.CloseAndRecv(); status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestStreamMetadataTruncatesReads: $tb, $maxCount and $maxAge leave events
// out of stream reads (revisions unchanged); a soft delete ($tb at the deleted
// marker) reads as not found.
func TestStreamMetadataTruncatesReads(t *testing.T) {
	clk := devtest.NewClock()
	s, _ := kurrenttest.Start(t, kurrenttest.WithClock(clk.Now))
	c := client(t, s)
	mustAppend(t, c, "s", esdb.NoStream{}, ids(2)...)
	clk.Advance(time.Hour)
	mustAppend(t, c, "s", esdb.Revision(1), ids(3)...)
	rc := raw(t, s)
	read := func(from uint64, backwards bool) []string {
		var out []string
		for _, m := range readAllRaw(t, mustRead(t, rc, streamReadReq("s", from, backwards, 10))) {
			out = append(out, kind(m))
		}
		return out
	}
	setMeta := func(m esdb.StreamMetadata) {
		t.Helper()
		if _, err := c.SetStreamMetadata(ctxT(t), "s", esdb.AppendToStreamOptions{}, m); err != nil {
			t.Fatal(err)
		}
	}
	setMeta(esdb.StreamMetadata{})
	equal(t, read(0, false), []string{"event:s/0", "event:s/1", "event:s/2", "event:s/3", "event:s/4"})
	var m esdb.StreamMetadata
	m.SetTruncateBefore(3)
	setMeta(m)
	equal(t, read(0, false), []string{"event:s/3", "event:s/4"})
	equal(t, read(4, true), []string{"event:s/4", "event:s/3"})
	sub, err := c.SubscribeToStream(ctxT(t), "s", esdb.SubscribeToStreamOptions{From: esdb.Start{}})
	if err != nil {
		t.Fatal(err)
	}
	if ev := sub.Recv(); ev.EventAppeared == nil || ev.EventAppeared.OriginalEvent().EventNumber != 3 {
		t.Fatalf("a subscription to the truncated stream began with %+v, want event 3", ev)
	}
	_ = sub.Close()
	m = esdb.StreamMetadata{}
	m.SetMaxCount(4)
	setMeta(m)
	equal(t, read(0, false), []string{"event:s/1", "event:s/2", "event:s/3", "event:s/4"})
	m = esdb.StreamMetadata{}
	m.SetMaxAge(30 * time.Minute)
	setMeta(m)
	equal(t, read(0, false), []string{"event:s/2", "event:s/3", "event:s/4"})
	m = esdb.StreamMetadata{}
	m.SetTruncateBefore(math.MaxInt64)
	setMeta(m)
	equal(t, read(0, false), []string{"stream_not_found"})
}
