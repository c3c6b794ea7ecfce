package seed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/ledger"
)

// recorder is the store a seeding ledger.Service decides on: a memory store
// that holds one chunk of the history, and what was decided before it only as
// each account stream's last revision. Flush loads the chunk's appends into
// the real store (Loader: COPY) in the order they were taken, with the
// snapshots the service took, and starts the next chunk empty: its memory
// grows with the accounts, not with the events.
//
// It offers what the PostgreSQL store offers the service (several streams in
// one append, events found by ID and by subject, snapshots, repeats
// reported), so the service decides and writes as it would there. Within a
// chunk every stream is at its true revisions and positions; a stream of an
// earlier chunk is known only by its head, so a read or an append that
// reaches back into an earlier chunk fails (ErrLoaded): the seeder keeps
// every account cached and ends a chunk only between units, so that none
// does. A key, a hold or an original refunded is looked up by ID or subject
// in this chunk alone: the seeder's keys and hold IDs are new and each unit's
// commands share a chunk, and the store's unique event IDs refuse the load of
// a repeat.
type recorder struct {
	mu  sync.Mutex
	mem *memory.Store // this chunk's events, at revisions shifted by base
	// base is each account stream's last revision loaded before this chunk.
	base map[string]int64
	// loaded is the events of the chunks cut before this one: positions
	// continue it.
	loaded uint64
	parts  []eventstore.StreamAppend // this chunk's appends, at true revisions
	events int                       // in parts
	snaps  []eventstore.Snapshot     // taken since the last cut
	// snapsTaken is the snapshots the service has written to it in all.
	snapsTaken int64
}

var (
	_ ledger.Store                                 = (*recorder)(nil)
	_ eventstore.MultiAppender                     = (*recorder)(nil)
	_ eventstore.EventLocator                      = (*recorder)(nil)
	_ eventstore.SubjectReader                     = (*recorder)(nil)
	_ eventstore.SnapshotStore                     = (*recorder)(nil)
	_ interface{ ReportsIdempotentAppends() bool } = (*recorder)(nil)
)

// ErrLoaded is a read or an append of a recorder that reaches into the
// events it has loaded already (see recorder).
var ErrLoaded = errors.New("seed: the recorder has loaded these events already")

func newRecorder() *recorder {
	return &recorder{mem: memory.New(), base: map[string]int64{}}
}

func (r *recorder) close() { r.mem.Close() }

// shift is what a stream's true revisions are ahead of the chunk's (the
// caller holds mu).
func (r *recorder) shift(stream string) int64 {
	if b, ok := r.base[stream]; ok {
		return b + 1
	}
	return 0
}

// chunkEvents is the events taken since the last cut.
func (r *recorder) chunkEvents() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.events
}

// taken is the events taken so far, cut or not.
func (r *recorder) taken() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(r.loaded) + int64(r.events)
}

func (r *recorder) ReportsIdempotentAppends() bool { return true }

func (r *recorder) Append(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.AppendResult, error) {
	return eventstore.AppendOne(ctx, r, eventstore.StreamAppend{Stream: stream, Expected: expected, Events: events})
}

// AppendMulti appends parts to the chunk, their expected revisions shifted,
// and keeps those it wrote for the load.
func (r *recorder) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	local := make([]eventstore.StreamAppend, len(parts))
	for i, p := range parts {
		var err error
		if local[i], err = r.toChunk(p); err != nil {
			return nil, err
		}
	}
	res, err := r.mem.AppendMulti(ctx, local)
	if err != nil {
		if wrong, ok := errors.AsType[*eventstore.WrongExpectedRevisionError](err); ok {
			for _, p := range parts {
				if p.Stream == wrong.Stream {
					return nil, &eventstore.WrongExpectedRevisionError{Stream: p.Stream, Expected: p.Expected, Actual: wrong.Actual + r.shift(p.Stream)}
				}
			}
		}
		return nil, err
	}
	for i, p := range parts {
		if len(p.Events) == 0 {
			continue // an assertion: nothing written
		}
		res[i] = r.fromChunkResult(p.Stream, res[i])
		if !res[i].Idempotent {
			r.parts = append(r.parts, eventstore.StreamAppend{Stream: p.Stream, Expected: eventstore.ExactOrNoStream(int64(res[i].FirstRevision) - 1), Events: p.Events})
			r.events += len(p.Events)
		}
	}
	return res, nil
}

// toChunk is p at the chunk's revisions; an expected revision before the
// chunk is ErrLoaded.
func (r *recorder) toChunk(p eventstore.StreamAppend) (eventstore.StreamAppend, error) {
	shift := r.shift(p.Stream)
	if shift == 0 {
		return p, nil
	}
	last, ok := p.Expected.LastBefore()
	if !ok || last+1 < shift {
		return p, fmt.Errorf("%w: an append to %s expecting %s (%d loaded)", ErrLoaded, p.Stream, p.Expected, shift)
	}
	p.Expected = eventstore.ExactOrNoStream(last - shift)
	return p, nil
}

func (r *recorder) fromChunkResult(stream string, res eventstore.AppendResult) eventstore.AppendResult {
	shift := uint64(r.shift(stream))
	res.FirstRevision += shift
	res.LastRevision += shift
	res.Position = r.position(res.Position)
	return res
}

// fromChunk is e at its true revision and position.
func (r *recorder) fromChunk(e eventstore.RecordedEvent) eventstore.RecordedEvent {
	e.Revision += uint64(r.shift(e.Stream))
	e.Position = r.position(e.Position)
	return e
}

func (r *recorder) position(p eventstore.Position) eventstore.Position {
	return eventstore.Position{Commit: p.Commit + r.loaded, Prepare: p.Prepare + r.loaded}
}

func (r *recorder) fromChunkAll(evs []eventstore.RecordedEvent) []eventstore.RecordedEvent {
	for i := range evs {
		evs[i] = r.fromChunk(evs[i])
	}
	return evs
}

// ReadStream reads the chunk's events of stream; a read that needs loaded
// ones is ErrLoaded.
func (r *recorder) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	shift := uint64(r.shift(stream))
	if shift == 0 {
		evs, err := r.mem.ReadStream(ctx, stream, from, dir, max)
		return r.fromChunkAll(evs), err
	}
	loaded := fmt.Errorf("%w: a read of %s from %d %v (%d loaded)", ErrLoaded, stream, from, dir, shift)
	local := from
	if from != eventstore.EndOfStream {
		if from < shift {
			return nil, loaded
		}
		local = from - shift
	}
	evs, err := r.mem.ReadStream(ctx, stream, local, dir, max)
	switch {
	case errors.Is(err, eventstore.ErrStreamNotFound) && dir == eventstore.Forwards:
		return nil, nil // after its head
	case err != nil && !errors.Is(err, eventstore.ErrStreamNotFound):
		return nil, err
	case dir == eventstore.Backwards && (max <= 0 || len(evs) < max):
		return nil, loaded
	}
	return r.fromChunkAll(evs), nil
}

func (r *recorder) ReadEventByID(ctx context.Context, id uuid.UUID) (eventstore.RecordedEvent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.mem.ReadEventByID(ctx, id)
	return r.fromChunk(e), err
}

func (r *recorder) EventsExist(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mem.EventsExist(ctx, ids)
}

func (r *recorder) ReadEventsByID(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]eventstore.RecordedEvent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	found, err := r.mem.ReadEventsByID(ctx, ids)
	for id, e := range found {
		found[id] = r.fromChunk(e)
	}
	return found, err
}

func (r *recorder) ReadStreamSubject(ctx context.Context, stream, subject string, max int) ([]eventstore.RecordedEvent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs, err := r.mem.ReadStreamSubject(ctx, stream, subject, max)
	return r.fromChunkAll(evs), err
}

// WriteSnapshot keeps s for the next cut.
func (r *recorder) WriteSnapshot(_ context.Context, s eventstore.Snapshot) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snaps = append(r.snaps, s)
	r.snapsTaken++
	return nil
}

// snapshotsTaken is the snapshots the service has written to the recorder.
func (r *recorder) snapshotsTaken() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snapsTaken
}

// ReadSnapshot: a stream with loaded events is ErrLoaded (its snapshot may
// be loaded); another has none the service would need (it holds the chunk's
// events).
func (r *recorder) ReadSnapshot(_ context.Context, stream string) (eventstore.Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shift(stream) > 0 {
		return eventstore.Snapshot{}, fmt.Errorf("%w: the snapshot of %s", ErrLoaded, stream)
	}
	return eventstore.Snapshot{}, fmt.Errorf("%w: %q", eventstore.ErrSnapshotNotFound, stream)
}

func (r *recorder) ReadSnapshots(context.Context, string, int) ([]eventstore.Snapshot, error) {
	return nil, fmt.Errorf("%w: snapshots are listed from the store loaded", ErrLoaded)
}

// chunk is what a recorder took between two cuts: its appends in the order
// they were taken, and the snapshots the service took meanwhile.
type chunk struct {
	parts  []eventstore.StreamAppend
	snaps  []eventstore.Snapshot
	events int
}

// cut ends the chunk and starts the next one empty, the account streams'
// heads kept. No append may be in flight.
func (r *recorder) cut() chunk {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := chunk{parts: r.parts, snaps: r.snaps, events: r.events}
	for _, p := range c.parts {
		if strings.HasPrefix(p.Stream, domain.AccountStreamPrefix) {
			last, _ := p.Expected.LastBefore()
			r.base[p.Stream] = last + int64(len(p.Events))
		}
	}
	r.loaded += uint64(r.events)
	r.parts, r.snaps, r.events = nil, nil, 0
	r.mem.Close()
	r.mem = memory.New()
	return c
}

// load writes the chunk's appends into dst in their order (one Load), then
// its snapshots (each at a revision loaded by now).
func (c chunk) load(ctx context.Context, dst Loader) error {
	if len(c.parts) > 0 {
		if err := dst.Load(ctx, c.parts); err != nil {
			return err
		}
	}
	for _, s := range c.snaps {
		if err := dst.WriteSnapshot(ctx, s); err != nil {
			return err
		}
	}
	return nil
}
