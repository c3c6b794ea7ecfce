package kurrenttest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/EventStore/EventStore-Client-Go/v4/protos/shared"
	api "github.com/EventStore/EventStore-Client-Go/v4/protos/streams"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// readBatchSize is the server's page size (Enumerators.ReadBatchSize) and the
// default search window of a filtered subscription.
const readBatchSize = 32

type streamsServer struct {
	api.UnimplementedStreamsServer
	s *Server
}

// streamDeleted is RpcExceptions.StreamDeleted: FailedPrecondition with the
// trailers the client turns into ErrorCodeStreamDeleted.
func streamDeleted(ctx context.Context, setTrailer func(metadata.MD), stream string) error {
	setTrailer(metadata.Pairs("exception", "stream-deleted", "stream-name", stream))
	return status.Errorf(codes.FailedPrecondition, "Event stream '%s' is deleted.", stream)
}

func wrongExpectedVersionTrailer(stream string, exp expected, actual int64) metadata.MD {
	return metadata.Pairs(
		"exception", "wrong-expected-version",
		"stream-name", stream,
		"expected-version", strconv.FormatInt(exp.version(), 10),
		"actual-version", strconv.FormatInt(actual, 10),
	)
}

func uuidFromProto(u *shared.UUID) (uuid.UUID, error) {
	switch v := u.GetValue().(type) {
	case *shared.UUID_Structured_:
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], uint64(v.Structured.GetMostSignificantBits()))
		binary.BigEndian.PutUint64(b[8:], uint64(v.Structured.GetLeastSignificantBits()))
		return uuid.UUID(b), nil
	case *shared.UUID_String_:
		return uuid.Parse(v.String_)
	}
	return uuid.Nil, errors.New("missing event id")
}

func uuidToProto(id uuid.UUID, asString bool) *shared.UUID {
	if asString {
		return &shared.UUID{Value: &shared.UUID_String_{String_: id.String()}}
	}
	return &shared.UUID{Value: &shared.UUID_Structured_{Structured: &shared.UUID_Structured{
		MostSignificantBits:  int64(binary.BigEndian.Uint64(id[:8])),
		LeastSignificantBits: int64(binary.BigEndian.Uint64(id[8:])),
	}}}
}

// Append implements Streams.Append with the server's IndexWriter rules.
func (ss *streamsServer) Append(srv api.Streams_AppendServer) error {
	first, err := srv.Recv()
	if err != nil {
		return err
	}
	opts := first.GetOptions()
	if opts == nil {
		return status.Error(codes.Unknown, "Operation is not valid due to the current state of the object.")
	}
	if err := ss.s.authorizeWrite(srv.Context()); err != nil {
		ss.s.readRequest(srv)
		return err
	}
	stream := string(opts.GetStreamIdentifier().GetStreamName())
	exp, err := expectedOf(opts)
	if err != nil {
		return err
	}

	events, err := ss.receiveEvents(srv)
	if err != nil {
		return err
	}

	ctx := srv.Context()
	if err := ss.s.notLeaderAnswer(srv.SetTrailer); err != nil {
		return err
	}
	if err := ss.s.failAppendTo(stream); err != nil {
		return err
	}
	if stall, commit := ss.s.nextStall(); stall {
		if commit {
			ss.s.db.append(stream, exp, events)
		}
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}

	out := ss.s.db.append(stream, exp, events)
	if err := ss.afterWrite(ctx, out); err != nil {
		return err
	}
	resp := &api.AppendResp{}
	switch out.decision {
	case decisionDeleted:
		return streamDeleted(ctx, srv.SetTrailer, stream)
	case decisionOK, decisionIdempotent:
		resp.Result = &api.AppendResp_Success_{Success: appendSuccess(out)}
	case decisionWrongExpectedVersion, decisionCorruptedIdempotency:
		// Corrupted idempotency (part of the batch matches, part does not) is
		// answered as a wrong expected version, as the server does.
		resp.Result = &api.AppendResp_WrongExpectedVersion_{WrongExpectedVersion: wrongExpectedVersion(exp, out.current)}
	}
	return srv.SendAndClose(resp)
}

// expectedOf is an append's expected stream revision, refused as the server
// refuses one it does not know.
func expectedOf(opts *api.AppendReq_Options) (expected, error) {
	switch v := opts.GetExpectedStreamRevision().(type) {
	case *api.AppendReq_Options_Revision:
		return expected{kind: expectRevision, rev: v.Revision}, nil
	case *api.AppendReq_Options_NoStream:
		return expected{kind: expectNoStream}, nil
	case *api.AppendReq_Options_Any:
		return expected{kind: expectAny}, nil
	case *api.AppendReq_Options_StreamExists:
		return expected{kind: expectStreamExists}, nil
	default:
		return expected{}, status.Errorf(codes.InvalidArgument, "'%v' is not a valid expected stream revision", v)
	}
}

// appendSuccess is the success answer of a written or idempotent append: the
// stream's current revision (no_stream when an empty append found none) and the
// position, when the write has one to show.
func appendSuccess(out appendOutcome) *api.AppendResp_Success {
	success := &api.AppendResp_Success{}
	if out.last == -1 {
		success.CurrentRevisionOption = &api.AppendResp_Success_NoStream{NoStream: &shared.Empty{}}
	} else {
		success.CurrentRevisionOption = &api.AppendResp_Success_CurrentRevision{CurrentRevision: uint64(out.last)}
	}
	if out.hasPos {
		success.PositionOption = &api.AppendResp_Success_Position{Position: &api.AppendResp_Position{
			CommitPosition: out.pos, PreparePosition: out.pos,
		}}
	} else {
		success.PositionOption = &api.AppendResp_Success_NoPosition{NoPosition: &shared.Empty{}}
	}
	return success
}

// receiveEvents reads the proposed events of an append, refusing them as the
// server does while it reads (Streams.Append): a missing type or content type,
// an empty type or ID (the Event constructor's ArgumentException, which reaches
// the client as Unknown), and a request over the maximum append size, counted
// with Event.SizeOnDisk. The refusal ends the call while the client may still be
// sending, so the client can lose the status and see only io.EOF.
func (ss *streamsServer) receiveEvents(srv api.Streams_AppendServer) ([]proposed, error) {
	var events []proposed
	size := 0
	for {
		req, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return nil, err
		}
		msg := req.GetProposedMessage()
		if msg == nil {
			return nil, status.Error(codes.Unknown, "Operation is not valid due to the current state of the object.")
		}
		for _, key := range []string{"type", "content-type"} {
			if _, ok := msg.GetMetadata()[key]; !ok {
				srv.SetTrailer(metadata.Pairs("exception", "missing-required-metadata-property", "required-metadata-properties", "type,content-type"))
				return nil, status.Errorf(codes.InvalidArgument, "Required Metadata Property '%s' is missing", key)
			}
		}
		id, err := uuidFromProto(msg.GetId())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "invalid event id: %v", err)
		}
		e := proposed{
			id:          id,
			eventType:   msg.GetMetadata()["type"],
			contentType: msg.GetMetadata()["content-type"],
			data:        msg.GetData(),
			meta:        msg.GetCustomMetadata(),
		}
		if max := ss.s.cfg.maxAppendEventSize; max > 0 && sizeOnDisk(e) > max {
			srv.SetTrailer(metadata.Pairs("exception", "maximum-append-event-size-exceeded", "maximum-append-event-size", strconv.Itoa(max),
				"event-id", e.id.String(), "proposed-append-event-size", strconv.Itoa(sizeOnDisk(e))))
			return nil, status.Errorf(codes.InvalidArgument, "Event with Id: %s, Size: %d, exceeds Maximum Append Event Size of %d.", e.id, sizeOnDisk(e), max)
		}
		size += sizeOnDisk(e)
		if max := ss.s.cfg.maxAppendSize; size > max {
			srv.SetTrailer(metadata.Pairs("exception", "maximum-append-size-exceeded", "maximum-append-size", strconv.Itoa(max)))
			return nil, status.Errorf(codes.InvalidArgument, "Maximum Append Size of %d Exceeded.", max)
		}
		if e.eventType == "" || e.id == uuid.Nil {
			return nil, status.Error(codes.Unknown, "Exception was thrown by handler.")
		}
		events = append(events, e)
	}
}

// sizeOnDisk is what an event counts towards the maximum append size: its data,
// its metadata and its type in UTF-16 (Event.SizeOnDisk).
func sizeOnDisk(e proposed) int {
	return len(e.data) + len(e.meta) + 2*len(utf16.Encode([]rune(e.eventType)))
}

// afterWrite waits for a write to commit (see HoldReplication) and applies
// FailAppendsAfterWrite. An IdempotentNotReady retry times out.
func (ss *streamsServer) afterWrite(ctx context.Context, out appendOutcome) error {
	switch {
	case out.decision == decisionNotReady:
		return ss.s.awaitTimeout(ctx)
	case out.pending:
		if err := ss.s.awaitCommit(ctx, out.pos); err != nil {
			return err
		}
	}
	if out.decision == decisionOK && out.hasPos {
		if code, ok := ss.s.nextAfterWrite(); ok {
			if code == codes.Aborted {
				return commitTimedOut()
			}
			return status.Error(code, "fault injected by the test server after the write")
		}
	}
	return nil
}

func wrongExpectedVersion(exp expected, current int64) *api.AppendResp_WrongExpectedVersion {
	w := &api.AppendResp_WrongExpectedVersion{}
	empty := &shared.Empty{}
	switch exp.kind {
	case expectAny:
		w.ExpectedRevisionOption = &api.AppendResp_WrongExpectedVersion_ExpectedAny{ExpectedAny: empty}
		w.ExpectedRevisionOption_20_6_0 = &api.AppendResp_WrongExpectedVersion_Any_20_6_0{Any_20_6_0: empty}
	case expectStreamExists:
		w.ExpectedRevisionOption = &api.AppendResp_WrongExpectedVersion_ExpectedStreamExists{ExpectedStreamExists: empty}
		w.ExpectedRevisionOption_20_6_0 = &api.AppendResp_WrongExpectedVersion_StreamExists_20_6_0{StreamExists_20_6_0: empty}
	case expectNoStream:
		w.ExpectedRevisionOption = &api.AppendResp_WrongExpectedVersion_ExpectedNoStream{ExpectedNoStream: empty}
		w.ExpectedRevisionOption_20_6_0 = &api.AppendResp_WrongExpectedVersion_ExpectedRevision_20_6_0{ExpectedRevision_20_6_0: ^uint64(0)}
	case expectRevision:
		w.ExpectedRevisionOption = &api.AppendResp_WrongExpectedVersion_ExpectedRevision{ExpectedRevision: exp.rev}
		w.ExpectedRevisionOption_20_6_0 = &api.AppendResp_WrongExpectedVersion_ExpectedRevision_20_6_0{ExpectedRevision_20_6_0: exp.rev}
	}
	if current == -1 {
		w.CurrentRevisionOption = &api.AppendResp_WrongExpectedVersion_CurrentNoStream{CurrentNoStream: empty}
		w.CurrentRevisionOption_20_6_0 = &api.AppendResp_WrongExpectedVersion_NoStream_20_6_0{NoStream_20_6_0: empty}
	} else {
		w.CurrentRevisionOption = &api.AppendResp_WrongExpectedVersion_CurrentRevision{CurrentRevision: uint64(current)}
		w.CurrentRevisionOption_20_6_0 = &api.AppendResp_WrongExpectedVersion_CurrentRevision_20_6_0{CurrentRevision_20_6_0: uint64(current)}
	}
	return w
}

// Tombstone implements Streams.Tombstone: a $streamDeleted record, after which
// the stream can be neither read nor written.
func (ss *streamsServer) Tombstone(ctx context.Context, req *api.TombstoneReq) (*api.TombstoneResp, error) {
	opts := req.GetOptions()
	r, err := ss.deleteStream(ctx, string(opts.GetStreamIdentifier().GetStreamName()), opts.GetExpectedStreamRevision(), ss.s.db.tombstone)
	if err != nil {
		return nil, err
	}
	return &api.TombstoneResp{PositionOption: &api.TombstoneResp_Position_{Position: &api.TombstoneResp_Position{
		CommitPosition: r.pos, PreparePosition: r.pos,
	}}}, nil
}

// deleteStream runs a tombstone or a soft delete (del) after its ACL check,
// and returns the record it wrote or the refusal.
func (ss *streamsServer) deleteStream(ctx context.Context, stream string, rev any, del func(string, expected) (appendOutcome, *record)) (*record, error) {
	if err := ss.s.authorizeWrite(ctx); err != nil {
		return nil, err
	}
	exp, err := deleteExpected(rev)
	if err != nil {
		return nil, err
	}
	out, r := del(stream, exp)
	return r, deleteRefused(ctx, stream, exp, out)
}

// deleteExpected decodes the expected revision of a tombstone or a soft
// delete, whose options have the same shape.
func deleteExpected(rev any) (expected, error) {
	switch v := rev.(type) {
	case *api.TombstoneReq_Options_Revision:
		return expected{kind: expectRevision, rev: v.Revision}, nil
	case *api.DeleteReq_Options_Revision:
		return expected{kind: expectRevision, rev: v.Revision}, nil
	case *api.TombstoneReq_Options_NoStream, *api.DeleteReq_Options_NoStream:
		return expected{kind: expectNoStream}, nil
	case *api.TombstoneReq_Options_Any, *api.DeleteReq_Options_Any:
		return expected{kind: expectAny}, nil
	case *api.TombstoneReq_Options_StreamExists, *api.DeleteReq_Options_StreamExists:
		return expected{kind: expectStreamExists}, nil
	}
	return expected{}, status.Errorf(codes.InvalidArgument, "'%v' is not a valid expected stream revision", rev)
}

// deleteRefused is the answer to a tombstone or a soft delete the IndexWriter
// refused, nil when it did not.
func deleteRefused(ctx context.Context, stream string, exp expected, out appendOutcome) error {
	setTrailer := func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }
	switch out.decision {
	case decisionOK:
		return nil
	case decisionDeleted:
		return streamDeleted(ctx, setTrailer, stream)
	}
	setTrailer(wrongExpectedVersionTrailer(stream, exp, out.current))
	return status.Errorf(codes.FailedPrecondition,
		"Delete failed due to WrongExpectedVersion. Stream: %s, Expected version: %d, Actual version: %d",
		stream, exp.version(), out.current)
}

// readOptions is a decoded ReadReq.
type readOptions struct {
	all          bool
	stream       string
	backwards    bool
	subscription bool
	count        uint64
	uuidString   bool
	compat       uint32
	lag          int // records the read lags behind the log (Server.SetReadLag)

	// stream start: fromStart, fromEnd or revision
	// all start: fromStart, fromEnd or (commit, prepare)
	fromStart, fromEnd bool
	revision           uint64
	commit, prepare    uint64

	filter   *eventFilter
	window   uint32 // filtered: max search window
	interval uint32 // filtered: checkpoint interval in considered events
}

type eventFilter struct {
	onType   bool // false: on the stream name
	prefixes []string
	re       *regexp.Regexp
}

func (f *eventFilter) match(r *record) bool {
	if f == nil {
		return true
	}
	subject := r.stream
	if f.onType {
		subject = r.eventType
	}
	if f.re != nil {
		return f.re.MatchString(subject)
	}
	for _, p := range f.prefixes {
		if strings.HasPrefix(subject, p) {
			return true
		}
	}
	return false
}

func decodeRead(req *api.ReadReq) (*readOptions, error) {
	o := req.GetOptions()
	if o == nil {
		return nil, status.Error(codes.InvalidArgument, "'options' is a required argument")
	}
	if o.GetUuidOption() == nil {
		return nil, status.Error(codes.InvalidArgument, "'uuidOption' is a required argument of type UUIDOption")
	}
	ro := &readOptions{
		backwards:  o.GetReadDirection() == api.ReadReq_Options_Backwards,
		uuidString: o.GetUuidOption().GetString_() != nil,
		compat:     o.GetControlOption().GetCompatibility(),
	}
	switch c := o.GetCountOption().(type) {
	case *api.ReadReq_Options_Count:
		ro.count = c.Count
	case *api.ReadReq_Options_Subscription:
		ro.subscription = true
	default:
		return nil, status.Error(codes.InvalidArgument, "a count or subscription option is required")
	}
	if err := decodeStreamOption(o, ro); err != nil {
		return nil, err
	}
	if f := o.GetFilter(); f != nil {
		if !ro.all {
			return nil, status.Errorf(codes.InvalidArgument, "The combination of (Stream, %v, %v, Filter) is invalid.", countCase(ro), o.GetReadDirection())
		}
		if err := decodeFilter(f, ro); err != nil {
			return nil, err
		}
	}
	if ro.subscription && ro.backwards {
		return nil, status.Errorf(codes.InvalidArgument, "The combination of (%v, Subscription, Backwards, %v) is invalid.", streamCase(ro), filterCase(ro))
	}
	return ro, nil
}

// decodeFilter reads a filtered $all read's filter (stream or event-type
// prefixes or a regex), its search window and, for a subscription, its
// checkpoint interval into ro.
func decodeFilter(f *api.ReadReq_Options_FilterOptions, ro *readOptions) error {
	var expr *api.ReadReq_Options_FilterOptions_Expression
	ef := &eventFilter{}
	switch {
	case f.GetStreamIdentifier() != nil:
		expr = f.GetStreamIdentifier()
	case f.GetEventType() != nil:
		expr = f.GetEventType()
		ef.onType = true
	default:
		return status.Error(codes.InvalidArgument, "a filter needs a stream identifier or an event type expression")
	}
	if expr.GetRegex() != "" {
		re, err := regexp.Compile(expr.GetRegex())
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "invalid filter regex: %v", err)
		}
		ef.re = re
	} else {
		ef.prefixes = expr.GetPrefix()
	}
	ro.filter = ef
	switch w := f.GetWindow().(type) {
	case *api.ReadReq_Options_FilterOptions_Max:
		ro.window = w.Max
	case *api.ReadReq_Options_FilterOptions_Count:
		ro.window = readBatchSize
	default:
		return status.Errorf(codes.InvalidArgument, "'%v' is not a valid window", w)
	}
	if ro.window == 0 {
		ro.window = readBatchSize
	}
	if ro.subscription {
		if f.GetCheckpointIntervalMultiplier() == 0 {
			// ArgumentOutOfRangeException in AllSubscriptionFiltered's constructor.
			return status.Error(codes.Unknown, "Specified argument was out of the range of valid values. (Parameter 'checkpointIntervalMultiplier')")
		}
		ro.interval = f.GetCheckpointIntervalMultiplier() * ro.window
	}
	return nil
}

// decodeStreamOption reads which stream a read is of (one stream from a
// revision, or $all from a position) into ro.
func decodeStreamOption(o *api.ReadReq_Options, ro *readOptions) error {
	switch so := o.GetStreamOption().(type) {
	case *api.ReadReq_Options_Stream:
		ro.stream = string(so.Stream.GetStreamIdentifier().GetStreamName())
		switch rv := so.Stream.GetRevisionOption().(type) {
		case *api.ReadReq_Options_StreamOptions_Start:
			ro.fromStart = true
		case *api.ReadReq_Options_StreamOptions_End:
			ro.fromEnd = true
		case *api.ReadReq_Options_StreamOptions_Revision:
			ro.revision = rv.Revision
		default:
			return status.Error(codes.InvalidArgument, "a stream revision option is required")
		}
	case *api.ReadReq_Options_All:
		ro.all = true
		switch p := so.All.GetAllOption().(type) {
		case *api.ReadReq_Options_AllOptions_Start:
			ro.fromStart = true
		case *api.ReadReq_Options_AllOptions_End:
			ro.fromEnd = true
		case *api.ReadReq_Options_AllOptions_Position:
			ro.commit, ro.prepare = p.Position.GetCommitPosition(), p.Position.GetPreparePosition()
			if ro.commit == ^uint64(0) && ro.prepare == ^uint64(0) {
				ro.fromEnd = true
			}
		default:
			return status.Error(codes.InvalidArgument, "an $all position option is required")
		}
	default:
		return status.Error(codes.InvalidArgument, "a stream option is required")
	}
	return nil
}

func countCase(ro *readOptions) string {
	if ro.subscription {
		return "Subscription"
	}
	return "Count"
}

func streamCase(ro *readOptions) string {
	if ro.all {
		return "All"
	}
	return "Stream"
}

func filterCase(ro *readOptions) string {
	if ro.filter != nil {
		return "Filter"
	}
	return "NoFilter"
}

func eventResp(r *record, uuidString bool) *api.ReadResp {
	contentType := "application/octet-stream"
	if r.contentType == "application/json" {
		contentType = "application/json"
	}
	return &api.ReadResp{Content: &api.ReadResp_Event{Event: &api.ReadResp_ReadEvent{
		Event: &api.ReadResp_ReadEvent_RecordedEvent{
			Id:               uuidToProto(r.id, uuidString),
			StreamIdentifier: &shared.StreamIdentifier{StreamName: []byte(r.stream)},
			StreamRevision:   uint64(r.revision),
			// Self-committed events: commit position == prepare position.
			PreparePosition: r.pos,
			CommitPosition:  r.pos,
			Metadata: map[string]string{
				"type":         r.eventType,
				"created":      strconv.FormatInt(r.created, 10),
				"content-type": contentType,
			},
			Data:           r.data,
			CustomMetadata: r.meta,
		},
		Position: &api.ReadResp_ReadEvent_CommitPosition{CommitPosition: r.pos},
	}}}
}

// Read implements Streams.Read: stream and $all reads and subscriptions.
func (ss *streamsServer) Read(req *api.ReadReq, srv api.Streams_ReadServer) error {
	ro, err := decodeRead(req)
	if err != nil {
		return err
	}
	if err := ss.s.authorize(srv.Context(), ro.all); err != nil {
		return err
	}
	ro.lag = ss.s.lagOf(srv.Context())
	switch {
	case ro.subscription && ro.all:
		return ss.subscribeAll(ro, srv)
	case ro.subscription:
		return ss.subscribeStream(ro, srv)
	case ro.all:
		return ss.readAll(ro, srv)
	default:
		return ss.readStream(ro, srv)
	}
}

func (ss *streamsServer) readStream(ro *readOptions, srv api.Streams_ReadServer) error {
	v := ss.s.db.stream(ro.stream, ro.lag)
	events, exists := v.events, v.exists
	if v.tombstoned {
		return streamDeleted(srv.Context(), srv.SetTrailer, ro.stream)
	}
	first, softDeleted := ss.s.db.readableFrom(ro.stream, events)
	if !exists || softDeleted {
		return srv.Send(&api.ReadResp{Content: &api.ReadResp_StreamNotFound_{StreamNotFound: &api.ReadResp_StreamNotFound{
			StreamIdentifier: &shared.StreamIdentifier{StreamName: []byte(ro.stream)},
		}}})
	}
	last := int64(len(events)) - 1
	var sent uint64
	send := func(r *record) error {
		sent++
		return srv.Send(eventResp(r, ro.uuidString))
	}
	if ro.backwards {
		from := last
		if !ro.fromEnd && !ro.fromStart && int64(ro.revision) < last {
			from = int64(ro.revision)
		}
		if ro.fromStart {
			from = min(0, last)
		}
		for i := from; i >= first && sent < ro.count; i-- {
			if err := send(events[i]); err != nil {
				return err
			}
		}
	} else if !ro.fromEnd {
		from := uint64(first)
		if !ro.fromStart {
			from = max(ro.revision, uint64(first))
		}
		for i := from; i < uint64(len(events)) && sent < ro.count; i++ {
			if err := send(events[i]); err != nil {
				return err
			}
		}
	}
	if ro.compat >= 1 {
		return srv.Send(&api.ReadResp{Content: &api.ReadResp_LastStreamPosition{LastStreamPosition: uint64(last)}})
	}
	return nil
}

// before reports whether r, at (pos, pos), sits strictly before (commit, prepare).
func before(r *record, commit, prepare uint64) bool {
	return r.pos < commit || (r.pos == commit && r.pos < prepare)
}

// invalidPosition is RpcExceptions.InvalidPositionException.
func invalidPosition() error {
	return status.Error(codes.InvalidArgument, "Trying to read from an invalid position.")
}

// positional reports a $all read or subscription from a position (not Start or End).
func (ro *readOptions) positional() bool { return ro.all && !ro.fromStart && !ro.fromEnd }

func (ss *streamsServer) readAll(ro *readOptions, srv api.Streams_ReadServer) error {
	if ro.positional() && !ss.s.db.validPosition(ro.commit) {
		return invalidPosition()
	}
	all, _ := ss.s.db.snapshot(ro.lag)
	var sent uint64
	visit := func(r *record) (bool, error) {
		if sent >= ro.count {
			return false, nil
		}
		if !ro.filter.match(r) {
			return true, nil
		}
		sent++
		return true, srv.Send(eventResp(r, ro.uuidString))
	}
	if ro.backwards {
		// Backwards from a position: the records whose post-position is at or
		// before it (ReadAllEventsBackwardInternal): the records before an
		// event's position, but from (X, 0) not the record that ends at X.
		i := len(all)
		switch {
		case ro.fromStart:
			i = 0
		case ro.fromEnd:
		default:
			i = sort.Search(len(all), func(i int) bool {
				r := all[i]
				return r.end > ro.commit || (r.end == ro.commit && r.end > ro.prepare)
			})
		}
		for i--; i >= 0; i-- {
			more, err := visit(all[i])
			if err != nil || !more {
				return err
			}
		}
		return nil
	}
	// Forwards from a position: the record at it, then the ones after.
	i := 0
	switch {
	case ro.fromStart:
	case ro.fromEnd:
		i = len(all)
	default:
		i = firstAtOrAfter(all, ro.commit)
		for i < len(all) && before(all[i], ro.commit, ro.prepare) {
			i++
		}
	}
	for ; i < len(all); i++ {
		more, err := visit(all[i])
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// sender sends read responses unless the subscription was dropped or the
// caller went away.
type sender struct {
	srv api.Streams_ReadServer
	sub *subscription
}

func (s sender) send(resp *api.ReadResp) error {
	select {
	case err := <-s.sub.drop:
		return err
	case <-s.srv.Context().Done():
		return status.FromContextError(s.srv.Context().Err()).Err()
	default:
	}
	return s.srv.Send(resp)
}

// wait blocks until changed is closed, the subscription is dropped or the caller
// goes away.
func (s sender) wait(changed <-chan struct{}) error {
	select {
	case <-changed:
		return nil
	case err := <-s.sub.drop:
		return err
	case <-s.srv.Context().Done():
		return status.FromContextError(s.srv.Context().Err()).Err()
	}
}

// confirm registers a subscription and sends its confirmation; the caller
// unregisters snd.sub when the subscription ends, whether or not the
// confirmation was sent.
func (ss *streamsServer) confirm(srv api.Streams_ReadServer) (snd sender, err error) {
	snd = sender{srv: srv, sub: ss.s.register()}
	err = snd.send(&api.ReadResp{Content: &api.ReadResp_Confirmation{Confirmation: &api.ReadResp_SubscriptionConfirmation{
		SubscriptionId: uuid.NewString(),
	}}})
	return snd, err
}

var caughtUp = &api.ReadResp{Content: &api.ReadResp_CaughtUp_{CaughtUp: &api.ReadResp_CaughtUp{}}}

// position is a $all position: (commit, prepare).
type position struct{ commit, prepare uint64 }

func checkpoint(p position) *api.ReadResp {
	return &api.ReadResp{Content: &api.ReadResp_Checkpoint_{Checkpoint: &api.ReadResp_Checkpoint{
		CommitPosition: p.commit, PreparePosition: p.prepare,
	}}}
}

// subscribeAll is the $all catch-up subscription (Enumerators.AllSubscription and
// AllSubscriptionFiltered): confirmation first; then history in pages of the
// search window, with a checkpoint whenever a multiple of the checkpoint interval
// of events has been considered; caught_up; then live events, with a checkpoint
// at every interval-th considered event. The start position is exclusive when an
// event sits at it (see below for when none does).
func (ss *streamsServer) subscribeAll(ro *readOptions, srv api.Streams_ReadServer) error {
	snd, err := ss.confirm(srv)
	defer ss.s.unregister(snd.sub)
	if err != nil {
		return err
	}
	if ro.positional() && !ss.s.db.validPosition(ro.commit) {
		return invalidPosition() // after the confirmation, as the server does
	}
	sub := &allSubscription{s: ss.s, ro: ro, snd: snd}
	sub.seekStart()
	live, err := sub.catchUp()
	if err != nil {
		return err
	}
	switch {
	case ro.filter == nil:
	case ro.fromStart && !sub.matched && ss.s.release.maxCheckpoint():
		live = &position{math.MaxUint64, math.MaxUint64} // KDB-710
	case !ss.s.release.liveCheckpoint():
		live = nil
	}
	if live != nil {
		if err := snd.send(checkpoint(*live)); err != nil {
			return err
		}
	}
	if err := snd.send(caughtUp); err != nil {
		return err
	}
	return sub.live()
}

// allSubscription is one $all subscription's progress: the index in the log of
// the next event to consider, how many were considered since the last
// checkpoint, and whether the last page of the catch-up sent an event.
type allSubscription struct {
	s          *Server
	ro         *readOptions
	snd        sender
	next       int
	considered uint32
	matched    bool
}

// seekStart places the subscription at its start.
func (a *allSubscription) seekStart() {
	ro := a.ro
	all, _ := a.s.db.snapshot(ro.lag)
	switch {
	case ro.fromStart:
		a.s.noteStart("start")
	case ro.fromEnd:
		a.s.noteStart("end")
		a.next = len(all)
	default:
		a.s.noteStart(fmt.Sprintf("%d/%d", ro.commit, ro.prepare))
		// Strictly after the start position (24.2 and later); 23.10 skipped the
		// first event at or after it (ReadAllEventsForward(start, 1).NextPos),
		// which is exclusive when an event sits at it and loses the next event when
		// none does.
		next := firstAtOrAfter(all, ro.commit)
		for next < len(all) && before(all[next], ro.commit, ro.prepare) {
			next++
		}
		atStart := next < len(all) && all[next].pos == ro.commit && ro.commit == ro.prepare
		if next < len(all) && (atStart || a.s.release.skipsAfterStart()) {
			next++
		}
		a.next = next
	}
}

// catchUp sends the history page by page. It returns the checkpoint due when
// catch-up goes live (nil if none), and sets a.matched.
func (a *allSubscription) catchUp() (live *position, err error) {
	ro := a.ro
	first := true // the next page is the first
	start := position{}
	if ro.positional() {
		start = position{ro.commit, ro.prepare}
	}
	for {
		all, _ := a.s.db.snapshot(ro.lag)
		if a.next >= len(all) {
			return live, nil
		}
		if ro.filter == nil {
			for ; a.next < len(all); a.next++ {
				if err := a.snd.send(eventResp(all[a.next], ro.uuidString)); err != nil {
					return nil, err
				}
			}
			continue
		}
		end := min(a.next+int(ro.window), len(all))
		page := all[a.next:end]
		// The checkpoint of a page is the last event sent, else where the page
		// was read from (CatchUp: max(checkpoint, completed.CurrentPos)): the
		// start position for the first page, then the previous page's NextPos,
		// (post-position of its last record, 0), which no event sits at.
		cp := &position{commit: page[0].pos}
		if first {
			cp = &start
		}
		first, a.matched = false, false
		for _, r := range page {
			if ro.filter.match(r) {
				if err := a.snd.send(eventResp(r, ro.uuidString)); err != nil {
					return nil, err
				}
				cp, a.matched = &position{r.pos, r.pos}, true
			}
		}
		a.next = end
		a.considered += uint32(len(page))
		if a.next >= len(all) { // end of stream: go live
			return cp, nil
		}
		if a.considered >= ro.interval {
			a.considered %= ro.interval
			if err := a.snd.send(checkpoint(*cp)); err != nil {
				return nil, err
			}
		}
	}
}

// live sends events as they are written, with a checkpoint at every
// interval-th considered event, until the subscriber goes.
func (a *allSubscription) live() error {
	ro := a.ro
	for {
		all, changed := a.s.db.snapshot(ro.lag)
		for ; a.next < len(all); a.next++ {
			r := all[a.next]
			if ro.filter.match(r) {
				if err := a.snd.send(eventResp(r, ro.uuidString)); err != nil {
					return err
				}
			}
			if ro.filter != nil {
				a.considered++
				if a.considered >= ro.interval {
					a.considered = 0
					if err := a.snd.send(checkpoint(position{r.pos, r.pos})); err != nil {
						return err
					}
				}
			}
		}
		if err := a.snd.wait(changed); err != nil {
			return err
		}
	}
}

// subscribeStream is the stream catch-up subscription: confirmation, the events
// after the start revision (exclusive), caught_up, then live events.
func (ss *streamsServer) subscribeStream(ro *readOptions, srv api.Streams_ReadServer) error {
	snd, err := ss.confirm(srv)
	defer ss.s.unregister(snd.sub)
	if err != nil {
		return err
	}
	events := ss.s.db.stream(ro.stream, ro.lag).events
	next := uint64(0)
	switch {
	case ro.fromStart:
	case ro.fromEnd:
		next = uint64(len(events))
	default:
		next = ro.revision + 1
	}
	isCaughtUp := false
	for {
		_, changed := ss.s.db.snapshot(ro.lag)
		v := ss.s.db.stream(ro.stream, ro.lag)
		events, tombstoned := v.events, v.tombstoned
		if first, _ := ss.s.db.readableFrom(ro.stream, events); !isCaughtUp {
			next = max(next, uint64(first)) // catch-up reads leave out what metadata truncates
		}
		for ; next < uint64(len(events)); next++ {
			if err := snd.send(eventResp(events[next], ro.uuidString)); err != nil {
				return err
			}
		}
		if tombstoned {
			return streamDeleted(srv.Context(), srv.SetTrailer, ro.stream)
		}
		if !isCaughtUp {
			isCaughtUp = true
			if err := snd.send(caughtUp); err != nil {
				return err
			}
		}
		if err := snd.wait(changed); err != nil {
			return err
		}
	}
}
