package eventstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Revision is the zero-based index of an event in its stream.
type Revision = uint64

// Position is a point in the global order of "all". It is a pair so that every
// backend can express its own order: KurrentDB's (commit, prepare) positions, and
// the PostgreSQL store's (transaction id, sequence) pair. Positions compare
// lexicographically; the zero Position is the start of "all" (before any event).
type Position struct {
	Commit  uint64 `json:"commit"`
	Prepare uint64 `json:"prepare"`
}

// Start is the position before the first event of "all".
var Start = Position{}

// Compare returns -1, 0 or +1 as p is before, equal to or after q.
func (p Position) Compare(q Position) int {
	switch {
	case p.Commit < q.Commit:
		return -1
	case p.Commit > q.Commit:
		return 1
	case p.Prepare < q.Prepare:
		return -1
	case p.Prepare > q.Prepare:
		return 1
	}
	return 0
}

// String renders the position as "commit/prepare", the form clients see.
func (p Position) String() string {
	b := make([]byte, 0, 41)
	b = strconv.AppendUint(b, p.Commit, 10)
	b = append(b, '/')
	return string(strconv.AppendUint(b, p.Prepare, 10))
}

// ParsePosition parses the "commit/prepare" form of String.
func ParsePosition(s string) (Position, error) {
	c, pr, ok := strings.Cut(s, "/")
	commit, err1 := strconv.ParseUint(c, 10, 64)
	prepare, err2 := strconv.ParseUint(pr, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return Position{}, fmt.Errorf("eventstore: position %q is not of the form commit/prepare", s)
	}
	return Position{Commit: commit, Prepare: prepare}, nil
}

// ExpectedRevision is the optimistic-concurrency condition of an append.
type ExpectedRevision struct {
	kind expectedKind
	rev  Revision
}

type expectedKind uint8

const (
	expectAny expectedKind = iota
	expectNoStream
	expectStreamExists
	expectExact
)

var (
	// Any appends whatever the stream's state. Idempotent only when the first event's
	// ID is among the stream's recently written IDs: never rely on it.
	Any = ExpectedRevision{kind: expectAny}
	// NoStream requires that the stream has no events (an exact revision of "-1").
	NoStream = ExpectedRevision{kind: expectNoStream}
	// StreamExists requires that the stream has at least one event.
	StreamExists = ExpectedRevision{kind: expectStreamExists}
)

// Exact requires that the stream's last event is at revision r.
func Exact(r Revision) ExpectedRevision { return ExpectedRevision{kind: expectExact, rev: r} }

// ExactOrNoStream is Exact(uint64(last)) for last >= 0, NoStream for last == -1:
// the expected revision of a decision made on a stream whose last revision was last.
func ExactOrNoStream(last int64) ExpectedRevision {
	if last < 0 {
		return NoStream
	}
	return Exact(uint64(last))
}

// IsAny, IsNoStream, IsStreamExists report the kind; Exact returns (r, true) for exact.
func (e ExpectedRevision) IsAny() bool          { return e.kind == expectAny }
func (e ExpectedRevision) IsNoStream() bool     { return e.kind == expectNoStream }
func (e ExpectedRevision) IsStreamExists() bool { return e.kind == expectStreamExists }
func (e ExpectedRevision) Exact() (Revision, bool) {
	return e.rev, e.kind == expectExact
}

// LastBefore is the revision the stream's head must have for the append to be a
// fresh write: -1 for NoStream, r for Exact(r). ok is false for Any and StreamExists.
func (e ExpectedRevision) LastBefore() (last int64, ok bool) {
	switch e.kind {
	case expectNoStream:
		return -1, true
	case expectExact:
		return int64(e.rev), true
	}
	return 0, false
}

func (e ExpectedRevision) String() string {
	switch e.kind {
	case expectAny:
		return "any"
	case expectNoStream:
		return "no_stream"
	case expectStreamExists:
		return "stream_exists"
	}
	return fmt.Sprintf("%d", e.rev)
}

// EventData is an event to append. ID must be set by the caller: the ledger derives
// it deterministically so that the same intent always writes the same IDs.
type EventData struct {
	ID       uuid.UUID
	Type     string
	Data     []byte // JSON
	Metadata []byte // JSON
	// Subject, optional, names what the event is about within its stream (the
	// ledger's holds: "hold:<id>"); a SubjectReader finds a stream's events by it.
	// Other stores ignore it.
	Subject string
}

// RecordedEvent is an event as stored.
type RecordedEvent struct {
	ID       uuid.UUID
	Stream   string
	Revision Revision
	Position Position
	Type     string
	Data     []byte
	Metadata []byte
	Created  time.Time
}

// AppendResult describes a successful append. For an idempotent re-append it
// describes the original write.
type AppendResult struct {
	FirstRevision Revision
	LastRevision  Revision
	// Position is the global position of the last event written.
	Position Position
	// Idempotent is true when the events were already in the stream and nothing
	// was written. The PostgreSQL and memory stores report it; the KurrentDB server
	// answers a deduplicated append exactly like a fresh one, so there it is false.
	Idempotent bool
}

// StreamAppend is one stream's part of a multi-stream append.
type StreamAppend struct {
	Stream   string
	Expected ExpectedRevision
	Events   []EventData
	// MustBeNew refuses a repeat: where the stream already holds the part's
	// events (expected before the head), the append is refused (wrong expected
	// revision on Stream) instead of taken as idempotent. A multi-stream
	// append's other parts keep the rules of Appender. The ledger sets it on
	// the key's claim of an atomic command: every path reads the claim before
	// deciding, so a stored claim means another decision of the key was written
	// meanwhile, and the other parts, whose event IDs name the key's intent and
	// not its decision, must not be written beside it (chaos C4).
	MustBeNew bool
}

// Appender appends events to one stream with an expected revision.
//
// Idempotency follows KurrentDB's IndexWriter rules for Exact and NoStream:
//   - expected equal to the head: the events are written, without idempotency check;
//   - expected beyond the head: *WrongExpectedRevisionError;
//   - expected before the head: event i must already sit at revision expected+1+i
//     (SameEvent: its ID, and, where the store reports idempotent appends, its
//     type). All match: success, returning the original revisions and
//     position. The first does not match, a later one does not, or the batch
//     runs past the head: *WrongExpectedRevisionError.
//
// With Any, a batch whose first event ID is already in the stream returns the
// original write (only from a bounded recent-ID window on KurrentDB).
type Appender interface {
	Append(ctx context.Context, stream string, expected ExpectedRevision, events []EventData) (AppendResult, error)
}

// SameEvent reports whether e is the event stored with id and typ: the same
// ID and type. An event ID names an intent (a client key's i-th event in a
// stream), not a decision: two decisions of one key (two instances, one
// rejecting and one posting a transaction) share their IDs where they write
// the same streams, and a multi-stream append whose parts were taken as
// repeats by ID alone would write the streams only the second decision writes
// (chaos C4, seed 258958648: a transaction's legs under its
// TransactionRejected). So the stores that append to several streams at once
// (PostgreSQL, memory) repeat a part only where its events have the stored
// types too; KurrentDB's server compares IDs only. Data is not compared: a
// key's claim is claimed again, idempotently, with the revision of another
// attempt's decision in its data. Two decisions that write the same types
// (an atomic batch refused and applied) pass it: the guard against them is
// the caller's, a part that MustBeNew (StreamAppend), which the ledger sets
// on an atomic command's claim; this check is a second guard.
func SameEvent(e EventData, id uuid.UUID, typ string) bool {
	return e.ID == id && e.Type == typ
}

// MultiAppender appends to several streams atomically: all or none. Each stream's
// part follows the rules of Appender. A stream may be named by several parts, in
// revision order: each is decided on the head that the earlier parts leave, so
// one append carries several commands of one stream (the pipelined write path's
// group commit). A part to be written after one that was already stored
// (idempotent) is refused (wrong expected revision): it was decided on the events
// the earlier part carries, and the store holds events of those IDs, not
// necessarily those. A part that MustBeNew is refused (wrong expected revision)
// where its events are stored already. A part with no events is an assertion: it writes nothing,
// and the whole append is refused (wrong expected revision) unless its stream
// is at its expected revision, Exact or NoStream (a decision that read a
// stream it does not write, such as a refusal that names every account it
// read). The PostgreSQL and memory stores implement
// it; KurrentDB (through the v4 client) does not, and callers fall back to ordered
// single-stream appends whose steps are each idempotent.
type MultiAppender interface {
	AppendMulti(ctx context.Context, parts []StreamAppend) ([]AppendResult, error)
}

// HeldAppend is an append performed and not yet committed (the test capability
// storetest.HeldAppender): its stream stays locked, appends to it waiting,
// until Commit or Rollback ends it. The first of the two to be called ends it;
// any later call errors.
type HeldAppend struct {
	Commit   func() error
	Rollback func() error
}

// AppendOne is an Append made of one part of m's AppendMulti: how a store that
// appends to several streams at once appends to one.
func AppendOne(ctx context.Context, m MultiAppender, part StreamAppend) (AppendResult, error) {
	res, err := m.AppendMulti(ctx, []StreamAppend{part})
	if err != nil {
		return AppendResult{}, err
	}
	return res[0], nil
}

// Direction of a read.
type Direction uint8

const (
	Forwards Direction = iota
	Backwards
)

// StreamReader reads one stream. A stream that has no events returns
// ErrStreamNotFound.
type StreamReader interface {
	// ReadStream returns up to max events (max <= 0: all) starting at from,
	// in the given direction. Backwards with from == EndOfStream starts at the head.
	ReadStream(ctx context.Context, stream string, from Revision, dir Direction, max int) ([]RecordedEvent, error)
}

// EndOfStream as the from of a backwards read starts at the last event.
const EndOfStream Revision = ^Revision(0)

// AllReader reads "all" in global order. Events strictly after from are returned;
// a reader must never skip an event that becomes visible later at an earlier
// position (see the postgres backend).
type AllReader interface {
	ReadAll(ctx context.Context, after Position, max int) ([]RecordedEvent, error)
}

// Subscriber subscribes to "all" from a position (exclusive): catch-up, then live.
type Subscriber interface {
	SubscribeAll(ctx context.Context, after Position, opts SubscribeOptions) (Subscription, error)
}

// SubscribeOptions filter and shape a subscription.
type SubscribeOptions struct {
	// StreamPrefixes, when non-empty, keeps only events whose stream starts with one of them.
	StreamPrefixes []string
	// BufferSize bounds the events held for a slow consumer (default 512).
	BufferSize int
}

// Subscription delivers events in global order. Events is closed when the
// subscription ends; Err then tells why (nil after Close or context cancellation).
type Subscription interface {
	Events() <-chan RecordedEvent
	Err() error
	Close() error
}

// Store is the full contract a backend provides.
type Store interface {
	Appender
	StreamReader
	AllReader
	Subscriber
	// Head returns the position of the last event in "all" visible to readers.
	Head(ctx context.Context) (Position, error)
	Close() error
}

// ErrStreamNotFound is returned by ReadStream for a stream that has no events.
var ErrStreamNotFound = errors.New("eventstore: stream not found")

// ErrWrongExpectedRevision matches every *WrongExpectedRevisionError with errors.Is.
var ErrWrongExpectedRevision = errors.New("eventstore: wrong expected revision")

// ErrUnavailable marks infrastructure failures worth retrying (connection lost,
// deadline without an answer). Backends wrap their transport errors with it.
var ErrUnavailable = errors.New("eventstore: unavailable")

// WrongExpectedRevisionError carries the stream, what the append expected and the
// stream's actual last revision (-1 when it has no events).
type WrongExpectedRevisionError struct {
	Stream   string
	Expected ExpectedRevision
	Actual   int64
}

func (e *WrongExpectedRevisionError) Error() string {
	return fmt.Sprintf("eventstore: wrong expected revision on %q: expected %s, actual %d", e.Stream, e.Expected, e.Actual)
}

// Is makes errors.Is(err, ErrWrongExpectedRevision) true.
func (e *WrongExpectedRevisionError) Is(target error) bool { return target == ErrWrongExpectedRevision }

// ErrDuplicateEventID means an append would store an event ID that the store
// already holds outside the idempotency rules of Appender: in another stream, at
// another revision of the same stream (a write at the head that repeats an
// earlier one), or twice in one append. Stores that keep event IDs unique
// (EventLocator) return it, as a *DuplicateEventIDError; KurrentDB would write
// such an event a second time instead.
var ErrDuplicateEventID = errors.New("eventstore: duplicate event ID")

// DuplicateEventIDError names the event ID an append repeated, and the stream it
// was appending it to.
type DuplicateEventIDError struct {
	ID     uuid.UUID
	Stream string
}

func (e *DuplicateEventIDError) Error() string {
	return fmt.Sprintf("%v: %s (appending to %q)", ErrDuplicateEventID, e.ID, e.Stream)
}

func (e *DuplicateEventIDError) Is(target error) bool { return target == ErrDuplicateEventID }

// DuplicateIn is the error for an append of parts that repeated id: it names the
// first part carrying id (the stream is "" when none does).
func DuplicateIn(parts []StreamAppend, id uuid.UUID) *DuplicateEventIDError {
	for _, p := range parts {
		for _, e := range p.Events {
			if e.ID == id {
				return &DuplicateEventIDError{ID: id, Stream: p.Stream}
			}
		}
	}
	return &DuplicateEventIDError{ID: id}
}

// DurableReader is a store whose readers may see a write before it is as
// durable as an acknowledged append, and that can wait until it is. On
// PostgreSQL with a synchronous standby a reader sees a commit on the primary
// before the standby has it, and keeps seeing it after a cancelled wait for the
// standby (eventstore/postgres.ErrNotReplicated): a failover would lose it.
// Whoever tells a client that what it read was decided (a duplicate's reply, a
// lookup of a key) calls Durable first.
type DurableReader interface {
	// Durable returns once every write committed before the call is as
	// durable as an acknowledged append, or an error (ErrUnavailable when
	// that is unknown).
	Durable(ctx context.Context) error
}

// ErrEventNotFound is returned by EventLocator for an ID the store does not hold.
var ErrEventNotFound = errors.New("eventstore: event not found")

// EventLocator is a store whose event IDs are unique (a second event with an ID
// it holds is refused with ErrDuplicateEventID, wherever it would go), and that
// finds an event by its ID. The ledger derives an event's ID from the command's
// key, its stream and its index, so a store that locates events answers "was this
// key decided on this stream, and how" without the aggregate remembering every
// key. The PostgreSQL and memory stores implement it; KurrentDB does not.
type EventLocator interface {
	ReadEventByID(ctx context.Context, id uuid.UUID) (RecordedEvent, error)
	// EventsExist reports which of ids the store holds, in one request.
	EventsExist(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]bool, error)
	// ReadEventsByID returns the events of ids the store holds, by ID, in one
	// request: none (and no error) when it holds none of them.
	ReadEventsByID(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]RecordedEvent, error)
}

// SubjectReader finds the events of a stream written with a subject
// (EventData.Subject) in one indexed read, however long the stream: the ledger
// finds a hold its aggregate no longer keeps (a closed one) by its subject,
// rather than keeping every hold an account ever had. The PostgreSQL and memory
// stores implement it; KurrentDB does not.
type SubjectReader interface {
	// ReadStreamSubject returns up to max events (max <= 0: all) of stream
	// written with subject, in revision order; none (and no error) when there
	// are none.
	ReadStreamSubject(ctx context.Context, stream, subject string, max int) ([]RecordedEvent, error)
}

// StreamLister lists the streams a store holds by name: what the ledger's
// warming after a restart walks (every account stream, a page at a time).
// The PostgreSQL and memory stores implement it; KurrentDB does not.
type StreamLister interface {
	// ListStreams returns up to max (max >= 1) names of streams that start
	// with prefix and sort after `after` (in the store's order of names), in
	// that order; none when there are no more.
	ListStreams(ctx context.Context, prefix, after string, max int) ([]string, error)
}

// ColdReader reads the start of many streams in one request: what the
// ledger's cold loads of concurrent commands need, grouped as their appends
// are. The PostgreSQL and memory stores implement it; KurrentDB does not.
type ColdReader interface {
	// ReadCold returns, for each of streams in order, its latest snapshot
	// (nil when it has none, or the store keeps none) and up to max events
	// (max >= 1) of the stream from the snapshot's revision on, the event at
	// that revision first, or from its start; no events (and no error) for a
	// stream that does not exist.
	ReadCold(ctx context.Context, streams []string, max int) ([]ColdStream, error)
}

// ColdStream is what ColdReader read of one stream.
type ColdStream struct {
	Snapshot *Snapshot
	Events   []RecordedEvent
}

// Snapshot is a stream's state at a revision, opaque to the store: the ledger's
// snapshots of account aggregates (domain.EncodeSnapshot).
type Snapshot struct {
	Stream   string
	Revision Revision
	Data     []byte
	Taken    time.Time // set by the store
}

// ErrSnapshotNotFound is returned by SnapshotStore for a stream without one.
var ErrSnapshotNotFound = errors.New("eventstore: no snapshot")

// SnapshotStore keeps the latest snapshot of each stream beside the events. A
// snapshot is an optimisation, never a source of truth: readers check it against
// the stream and ignore it when it does not match. The PostgreSQL store keeps
// them in a table, the memory store in a map, KurrentDB in a system stream per
// stream (kurrentdb.SnapshotStreamPrefix), out of "all".
type SnapshotStore interface {
	// WriteSnapshot keeps s unless the stream has a snapshot at a later revision.
	WriteSnapshot(ctx context.Context, s Snapshot) error
	// ReadSnapshot returns the stream's latest snapshot, or ErrSnapshotNotFound.
	ReadSnapshot(ctx context.Context, stream string) (Snapshot, error)
	// ReadSnapshots lists up to max snapshots of streams after `after`, in
	// stream order (the audit's walk over all of them).
	ReadSnapshots(ctx context.Context, after string, max int) ([]Snapshot, error)
}
