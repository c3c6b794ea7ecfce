package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// Events out (invariant 8, PROTOCOL.md §4.1; the chaos checker's C9 as a user
// command): LEDGER_EVENTS holds every stored event up to the publisher's
// checkpoint, in the order of "all", each under its ID (Nats-Msg-Id), and no
// event the store does not hold. Events stored after the checkpoint are pending,
// not missing: the publisher has yet to reach them. A copy of an event already
// on the stream (the same Nats-Msg-Id again) is harmless, since consumers
// deduplicate by ID: it is counted, not a violation.
//
// The check walks the stream and the store side by side, a page of each at a
// time: memory is bounded by a page and by the missing events it keeps to name
// and republish (EventsOutOptions.MaxGaps), not by the history.
//
// A repair republishes the missing events it kept, each under its own ID with
// the publisher's message and the header Ledger-Repair, after what the stream
// holds: so a republished event comes after later ones. The check takes such a
// message, met after the gap it fills, as filling it (any other message met
// after its place is out of order); a consumer that needs the order of "all"
// orders by Ledger-Position.

// HeaderRepair marks a message republished by a repair.
const HeaderRepair = "Ledger-Repair"

// Defaults of EventsOutOptions.
const (
	DefaultMaxGaps     = 10_000
	DefaultEventsPage  = 1000
	eventsFetchTimeout = 10 * time.Second
	fetchRetries       = 50 // fetches that found no responder, in a row
	fetchRetryPause    = 100 * time.Millisecond
)

// EventsOutOptions configure the events-out check (Options.EventsOut).
type EventsOutOptions struct {
	// JS reaches LEDGER_EVENTS.
	JS jetstream.JetStream
	// Repair republishes the missing events found (at most MaxGaps).
	Repair bool
	// MaxGaps bounds the missing events kept to name and republish (all are
	// counted; default DefaultMaxGaps). A repair of more takes several runs.
	MaxGaps int
	// Page is the messages fetched, and the events read, at a time (default
	// DefaultEventsPage).
	Page int
}

// EventsOutReport is what the events-out check found.
type EventsOutReport struct {
	Stream      string `json:"stream"`
	Replicas    int    `json:"replicas"`
	Messages    uint64 `json:"messages"`
	Checkpoint  string `json:"checkpoint"`
	Matched     int64  `json:"matched"`          // messages that are the next stored event
	Filled      int64  `json:"filled_by_repair"` // messages that republished a missing event
	Missing     int64  `json:"missing"`          // stored events up to the checkpoint not on the stream
	Pending     int64  `json:"pending"`          // stored after the checkpoint and not on the stream yet
	Unordered   int64  `json:"unordered"`        // messages after their place, not by a repair
	Unstored    int64  `json:"unstored"`         // messages of events the store does not hold
	Duplicates  int64  `json:"duplicates"`       // copies of events already on the stream (harmless)
	Unverified  int64  `json:"unverified"`       // behind their place, on a store that finds no event by ID
	Republished int    `json:"republished"`      // by this run's repair
	Withheld    int    `json:"withheld"`         // refused as duplicates by the stream's window
}

// ErrRepairNeedsLease refuses a repair while a publisher holds its lease: a
// message added while a publisher's round is in flight shifts the sequences
// its messages expect, and the round's later messages would be stored while
// its first is refused, out of place.
var ErrRepairNeedsLease = errors.New("audit: a publisher holds the lease: stop the publishers (projector run --publish=false) for the repair")

// ErrRepairCheckpointBehind refuses a repair while the stream holds events
// after the publisher's checkpoint (a round whose checkpoint failed): a
// repaired message last on the stream would send a publisher back to the
// checkpoint, publishing them again.
var ErrRepairCheckpointBehind = errors.New("audit: the publisher's checkpoint is behind LEDGER_EVENTS; run a publisher (it records the stream as it takes the lease), then repair")

// eventsOut is one run of the check.
type eventsOut struct {
	f          *Fold
	rep        *EventsOutReport
	cur        storeCursor
	checkpoint eventstore.Position
	lastPos    eventstore.Position // of the last message met in order
	gaps       map[uuid.UUID]eventstore.RecordedEvent
	order      []uuid.UUID // gaps kept, in the order of "all"
	maxGaps    int
	locator    eventstore.EventLocator // nil: unstored and unordered are not told apart
}

// EventsOut runs the events-out check (and the repair) alone, without the rest
// of the audit: the one home of the rule "every stored event up to the
// publisher's checkpoint is on LEDGER_EVENTS once, in order, and none the store
// does not hold", which the chaos checker's C9 and the publisher's tests call
// too. rm is the read-model database (the publisher's checkpoint).
func EventsOut(ctx context.Context, store Store, rm *pgxpool.Pool, o EventsOutOptions) (EventsOutResult, error) {
	f := NewFold()
	rep, err := checkEventsOut(ctx, store, rm, f, o)
	if err != nil {
		return EventsOutResult{}, err
	}
	return EventsOutResult{Report: rep, Violations: f.Violations}, nil
}

// EventsOutResult is what EventsOut found: its report and the violations (the
// first 1,000).
type EventsOutResult struct {
	Report     *EventsOutReport
	Violations []Violation
}

// checkEventsOut runs the check (and the repair) and records violations in f.
func checkEventsOut(ctx context.Context, store Store, rm *pgxpool.Pool, f *Fold, o EventsOutOptions) (*EventsOutReport, error) {
	if rm == nil {
		return nil, errors.New("audit: events out needs the read-model database (the publisher's checkpoint)")
	}
	if o.MaxGaps <= 0 {
		o.MaxGaps = DefaultMaxGaps
	}
	if o.Page <= 0 {
		o.Page = DefaultEventsPage
	}
	if o.Repair {
		release, err := takeLease(ctx, rm)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	// The checkpoint, then the stream, then the store's head: every event the
	// checkpoint counts is on the stream by then, and every message's event is
	// at or before the head.
	cp, err := projections.Checkpoints.Published(ctx, rm)
	if err != nil {
		return nil, err
	}
	rep := &EventsOutReport{Stream: projections.EventsStream, Checkpoint: cp.String()}
	lastSeq, err := streamInfo(ctx, o.JS, rep)
	if err != nil {
		return nil, err
	}
	head, err := store.Head(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: head: %w", err)
	}
	x := &eventsOut{f: f, rep: rep, checkpoint: cp, gaps: map[uuid.UUID]eventstore.RecordedEvent{}, maxGaps: o.MaxGaps,
		cur: storeCursor{store: store, head: head, from: eventstore.Start, size: o.Page}}
	x.locator, _ = store.(eventstore.EventLocator)
	if err := x.walk(ctx, o.JS, lastSeq, o.Page); err != nil {
		return nil, err
	}
	if err := x.finish(ctx); err != nil {
		return nil, err
	}
	if o.Repair && len(x.gaps) > 0 {
		return rep, x.repair(ctx, o.JS)
	}
	return rep, nil
}

// takeLease takes the publisher's lease for a repair, on a session of its own
// that release ends.
func takeLease(ctx context.Context, pool *pgxpool.Pool) (release func(), err error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: lease: %w", err)
	}
	release = func() {
		_ = c.Conn().Close(context.WithoutCancel(ctx)) // ending the session gives the lease up
		c.Release()
	}
	got, err := projections.Checkpoints.TryLease(ctx, c)
	if err == nil && !got {
		err = ErrRepairNeedsLease
	}
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// streamInfo reads LEDGER_EVENTS' replicas and size, and returns its last
// sequence (0 when it does not exist).
func streamInfo(ctx context.Context, js jetstream.JetStream, rep *EventsOutReport) (uint64, error) {
	s, err := js.Stream(ctx, projections.EventsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("audit: %s: %w", projections.EventsStream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("audit: %s info: %w", projections.EventsStream, err)
	}
	rep.Replicas, rep.Messages = info.Config.Replicas, info.State.Msgs
	if info.State.Msgs == 0 {
		return 0, nil
	}
	return info.State.LastSeq, nil
}

// walk reads the stream in order, a page at a time, up to lastSeq.
func (x *eventsOut) walk(ctx context.Context, js jetstream.JetStream, lastSeq uint64, page int) error {
	if lastSeq == 0 {
		return nil
	}
	cons, err := js.OrderedConsumer(ctx, projections.EventsStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fmt.Errorf("audit: read %s: %w", projections.EventsStream, err)
	}
	for retries := 0; ; {
		batch, err := cons.Fetch(page, jetstream.FetchMaxWait(eventsFetchTimeout))
		if retryable(err) && retries < fetchRetries {
			retries++
			time.Sleep(fetchRetryPause)
			continue
		}
		if err != nil {
			return fmt.Errorf("audit: read %s: %w", projections.EventsStream, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			meta, err := msg.Metadata()
			if err != nil {
				return fmt.Errorf("audit: read %s: %w", projections.EventsStream, err)
			}
			if err := x.message(ctx, meta.Sequence.Stream, msg); err != nil {
				return err
			}
			if meta.Sequence.Stream >= lastSeq {
				return nil
			}
		}
		if err := batch.Error(); retryable(err) && retries < fetchRetries {
			retries++
			time.Sleep(fetchRetryPause)
			continue
		} else if err != nil {
			return fmt.Errorf("audit: read %s: %w", projections.EventsStream, err)
		}
		if n == 0 {
			return fmt.Errorf("audit: read %s: no message within %s before sequence %d", projections.EventsStream, eventsFetchTimeout, lastSeq)
		}
	}
}

// retryable is a fetch that found no consumer to answer it: on a cluster, the
// ordered consumer is (re)made on the stream's leader a moment after.
func retryable(err error) bool {
	return errors.Is(err, nats.ErrNoResponders)
}

// message checks one message against the store's next event.
func (x *eventsOut) message(ctx context.Context, seq uint64, msg jetstream.Msg) error {
	var em projections.EventMessage
	if err := json.Unmarshal(msg.Data(), &em); err != nil {
		x.violate("bad_message", eventstore.RecordedEvent{}, "message %d is not an event: %v", seq, err)
		return nil
	}
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != em.ID.String() {
		x.violate("msg_id_mismatch", eventstore.RecordedEvent{Stream: em.Stream, Revision: em.Revision, ID: em.ID},
			"message %d carries event %s under Nats-Msg-Id %q", seq, em.ID, id)
	}
	if e, ok := x.gaps[em.ID]; ok {
		delete(x.gaps, em.ID)
		x.rep.Missing--
		if msg.Headers().Get(HeaderRepair) != "" {
			x.rep.Filled++
		} else {
			x.rep.Unordered++
			x.violate("unordered", e, "message %d comes after events stored after it: out of the order of \"all\"", seq)
		}
		return nil
	}
	pos, err := eventstore.ParsePosition(em.Position)
	if err != nil {
		x.violate("bad_message", eventstore.RecordedEvent{}, "message %d: position %q: %v", seq, em.Position, err)
		return nil
	}
	for {
		e, err := x.cur.peek(ctx)
		if err != nil {
			return err
		}
		switch {
		case e == nil || e.Position.Compare(pos) > 0:
			return x.outOfPlace(ctx, seq, em)
		case e.ID == em.ID:
			if e.Stream != em.Stream || e.Revision != em.Revision {
				x.violate("message_mismatch", *e, "message %d says %s@%d", seq, em.Stream, em.Revision)
			}
			x.cur.next()
			x.rep.Matched++
			x.lastPos = pos
			return nil
		default: // stored before the message and not on the stream before it
			x.gap(*e)
			x.cur.next()
		}
	}
}

// outOfPlace takes a message that is not the store's next event: a copy of
// one already on the stream (harmless), or one the store does not hold.
func (x *eventsOut) outOfPlace(ctx context.Context, seq uint64, em projections.EventMessage) error {
	if x.locator == nil {
		x.rep.Unverified++
		return nil
	}
	found, err := x.locator.EventsExist(ctx, []uuid.UUID{em.ID})
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if found[em.ID] {
		x.rep.Duplicates++
		return nil
	}
	x.rep.Unstored++
	x.violate("unstored", eventstore.RecordedEvent{Stream: em.Stream, Revision: em.Revision, ID: em.ID},
		"message %d (position %s) is an event the store does not hold", seq, em.Position)
	return nil
}

// gap records a stored event missing from the stream, keeping it (up to
// maxGaps) to be filled by a later message or republished.
func (x *eventsOut) gap(e eventstore.RecordedEvent) {
	x.rep.Missing++
	if len(x.gaps) < x.maxGaps {
		// Its own copy of the bytes: a read's events share blocks of them
		// (eventstore/postgres), and a kept one would keep its whole block.
		e.Data, e.Metadata = bytes.Clone(e.Data), bytes.Clone(e.Metadata)
		x.gaps[e.ID] = e
		x.order = append(x.order, e.ID)
	}
}

// finish takes the store's events after the last message: missing up to the
// checkpoint, pending after it; and names the missing events no message filled.
func (x *eventsOut) finish(ctx context.Context) error {
	for {
		e, err := x.cur.peek(ctx)
		if err != nil {
			return err
		}
		if e == nil {
			break
		}
		if e.Position.Compare(x.checkpoint) <= 0 {
			x.gap(*e)
		} else {
			x.rep.Pending++
		}
		x.cur.next()
	}
	for _, id := range x.order {
		if e, ok := x.gaps[id]; ok {
			x.violate("missing", e, "event at position %s is not on %s", e.Position, projections.EventsStream)
		}
	}
	if n := x.rep.Missing - int64(len(x.gaps)); n > 0 {
		x.violate("missing", eventstore.RecordedEvent{}, "%d more events are not on %s (%d kept: --max-gaps)", n, projections.EventsStream, x.maxGaps)
	}
	return nil
}

func (x *eventsOut) violate(kind string, re eventstore.RecordedEvent, format string, args ...any) {
	v := Violation{Invariant: InvEventsOut, Kind: kind, Stream: re.Stream, Revision: int64(re.Revision), Message: fmt.Sprintf(format, args...)}
	if re.ID != uuid.Nil {
		v.EventID = re.ID.String()
	}
	x.f.violate(v)
}

// repair republishes the missing events kept, in the order of "all".
func (x *eventsOut) repair(ctx context.Context, js jetstream.JetStream) error {
	if x.lastPos.Compare(x.checkpoint) > 0 {
		return ErrRepairCheckpointBehind
	}
	for _, id := range x.order {
		e, ok := x.gaps[id]
		if !ok {
			continue
		}
		msg, err := projections.EventMsg(e)
		if err != nil {
			return err
		}
		msg.Header.Set(HeaderRepair, "true")
		ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(e.ID.String()))
		if err != nil {
			return fmt.Errorf("audit: republish %s@%d: %w", e.Stream, e.Revision, err)
		}
		if ack.Duplicate {
			x.rep.Withheld++ // the window remembers the ID: try again once it has passed
			continue
		}
		x.rep.Republished++
	}
	return nil
}

// storeCursor reads "all" up to head a page at a time.
type storeCursor struct {
	store Store
	head  eventstore.Position
	from  eventstore.Position
	size  int
	page  []eventstore.RecordedEvent
	i     int
	done  bool
}

// peek is the next event, nil after the head.
func (c *storeCursor) peek(ctx context.Context) (*eventstore.RecordedEvent, error) {
	if c.i < len(c.page) {
		return &c.page[c.i], nil
	}
	if c.done || c.from.Compare(c.head) >= 0 {
		return nil, nil
	}
	recs, err := c.store.ReadAll(ctx, c.from, c.size)
	if err != nil {
		return nil, fmt.Errorf("audit: read all after %s: %w", c.from, err)
	}
	c.done = len(recs) < c.size
	for i, re := range recs {
		if re.Position.Compare(c.head) > 0 {
			recs, c.done = recs[:i], true
			break
		}
	}
	c.page, c.i = recs, 0
	if len(recs) == 0 {
		return nil, nil
	}
	c.from = recs[len(recs)-1].Position
	return &c.page[0], nil
}

func (c *storeCursor) next() { c.i++ }

// write prints the check for people.
func (r *EventsOutReport) write(w io.Writer) {
	fmt.Fprintf(w, "Events out (invariant 8: %s holds every stored event up to the publisher's checkpoint, in order):\n", r.Stream)
	fmt.Fprintf(w, "  %d messages at %d replicas, checkpoint %s: %d in order, %d filled by a repair, %d copies; %d missing, %d out of order, %d not stored; %d pending\n",
		r.Messages, r.Replicas, r.Checkpoint, r.Matched, r.Filled, r.Duplicates, r.Missing, r.Unordered, r.Unstored, r.Pending)
	if r.Unverified > 0 {
		fmt.Fprintf(w, "  %d messages behind their place not verified: the store finds no event by ID (a copy, or an event it does not hold)\n", r.Unverified)
	}
	if r.Republished+r.Withheld > 0 {
		fmt.Fprintf(w, "  repair: %d republished under their IDs, %d withheld by the stream's duplicate window (run again after it)\n", r.Republished, r.Withheld)
	}
}
