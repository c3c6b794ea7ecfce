package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
)

// ErrDuplicateEventID is returned when an append would store an event ID that is
// already stored outside the idempotency rules (in another stream, at another
// revision, or twice in one append): event IDs are unique, as in the PostgreSQL
// store. The error is an *eventstore.DuplicateEventIDError.
var ErrDuplicateEventID = eventstore.ErrDuplicateEventID

// ErrClosed is returned by every operation after Close.
var ErrClosed = errors.New("eventstore/memory: store closed")

var (
	_ eventstore.Store         = (*Store)(nil)
	_ eventstore.MultiAppender = (*Store)(nil)
	_ eventstore.EventLocator  = (*Store)(nil)
	_ eventstore.SnapshotStore = (*Store)(nil)
)

// Store is an in-memory event store, safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	all     []eventstore.RecordedEvent // all[i] is at Position{i+1, i+1}
	streams map[string][]int           // indexes into all, by revision
	ids     map[uuid.UUID]int          // index into all
	// subjects indexes into all the events written with a subject, by stream
	// and subject (eventstore.SubjectReader).
	subjects map[string][]int
	held     map[string]bool // streams locked by an AppendHeld
	snaps    map[string]eventstore.Snapshot
	changed  chan struct{} // closed (and replaced) on every change
	done     chan struct{} // closed by Close
	closed   bool
	subs     sync.WaitGroup
}

// New returns an empty store.
func New() *Store {
	return &Store{
		streams:  map[string][]int{},
		ids:      map[uuid.UUID]int{},
		subjects: map[string][]int{},
		held:     map[string]bool{},
		snaps:    map[string]eventstore.Snapshot{},
		changed:  make(chan struct{}),
		done:     make(chan struct{}),
	}
}

// Close ends the subscriptions and waits for them.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.broadcastLocked()
	s.mu.Unlock()
	s.subs.Wait()
	return nil
}

func (s *Store) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func position(i int) eventstore.Position {
	return eventstore.Position{Commit: uint64(i + 1), Prepare: uint64(i + 1)}
}

func wrongRevision(p eventstore.StreamAppend, actual int64) error {
	return &eventstore.WrongExpectedRevisionError{Stream: p.Stream, Expected: p.Expected, Actual: actual}
}

// ---- append ----

// Append implements eventstore.Appender.
func (s *Store) Append(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.AppendResult, error) {
	return eventstore.AppendOne(ctx, s, eventstore.StreamAppend{Stream: stream, Expected: expected, Events: events})
}

// AppendMulti implements eventstore.MultiAppender: all parts or none.
func (s *Store) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	if err := validate(parts); err != nil {
		return nil, err
	}
	if err := s.lockFree(ctx, parts); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	plans, err := s.decideLocked(parts)
	if err != nil {
		return nil, err
	}
	return s.applyLocked(plans), nil
}

// AppendHeld decides an append and keeps it pending, its stream locked (appends
// to it wait), until commit or rollback: the test capability of a transaction
// held open across a later commit. The events get their position at commit.
func (s *Store) AppendHeld(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.HeldAppend, error) {
	parts := []eventstore.StreamAppend{{Stream: stream, Expected: expected, Events: events}}
	if err := validate(parts); err != nil {
		return eventstore.HeldAppend{}, err
	}
	if err := s.lockFree(ctx, parts); err != nil {
		return eventstore.HeldAppend{}, err
	}
	plans, err := s.decideLocked(parts)
	if err == nil {
		s.held[stream] = true
	}
	s.mu.Unlock()
	if err != nil {
		return eventstore.HeldAppend{}, err
	}
	ended := false
	end := func(apply bool) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if ended {
			return errors.New("eventstore/memory: held append already ended")
		}
		ended = true
		delete(s.held, stream)
		defer s.broadcastLocked()
		if !apply {
			return nil
		}
		if s.closed {
			return ErrClosed
		}
		// The stream was locked, but its IDs may have been taken elsewhere meanwhile.
		if err := s.checkIDsLocked(plans); err != nil {
			return err
		}
		s.applyLocked(plans)
		return nil
	}
	return eventstore.HeldAppend{Commit: func() error { return end(true) }, Rollback: func() error { return end(false) }}, nil
}

func validate(parts []eventstore.StreamAppend) error {
	if len(parts) == 0 {
		return errors.New("eventstore/memory: append of no streams")
	}
	for _, p := range parts {
		if p.Stream == "" {
			return errors.New("eventstore/memory: append to an empty stream name")
		}
		if _, exact := p.Expected.LastBefore(); len(p.Events) == 0 && !exact {
			return fmt.Errorf("eventstore/memory: append of no events to %q without an exact expected revision to assert", p.Stream)
		}
	}
	return nil
}

// lockFree locks s.mu once none of the parts' streams is held, or fails with
// ctx's error. On success the caller holds s.mu.
func (s *Store) lockFree(ctx context.Context, parts []eventstore.StreamAppend) error {
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			return ErrClosed
		}
		if err := ctx.Err(); err != nil {
			s.mu.Unlock()
			return fmt.Errorf("eventstore/memory: append: %w", err)
		}
		free := true
		for _, p := range parts {
			free = free && !s.held[p.Stream]
		}
		if free {
			return nil
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-changed:
		}
		s.mu.Lock()
	}
}

type plan struct {
	part   eventstore.StreamAppend
	head   int64
	write  bool
	result eventstore.AppendResult
}

// matchAtLocked reports whether events sit at revisions first.. of stream
// (eventstore.SameEvent).
func (s *Store) matchAtLocked(stream string, first int64, events []eventstore.EventData) (eventstore.AppendResult, bool) {
	idx := s.streams[stream]
	n := int64(len(events))
	if first < 0 || first+n > int64(len(idx)) {
		return eventstore.AppendResult{}, false
	}
	for i, e := range events {
		if st := s.all[idx[first+int64(i)]]; !eventstore.SameEvent(e, st.ID, st.Type) {
			return eventstore.AppendResult{}, false
		}
	}
	return eventstore.AppendResult{
		FirstRevision: uint64(first),
		LastRevision:  uint64(first + n - 1),
		Position:      position(idx[first+n-1]),
		Idempotent:    true,
	}, true
}

// decideLocked applies KurrentDB's IndexWriter rules (see eventstore.Appender).
func (s *Store) decideLocked(parts []eventstore.StreamAppend) ([]plan, error) {
	plans := make([]plan, len(parts))
	ahead := map[string]int64{}  // events that earlier parts of this append write to a stream
	matched := map[string]bool{} // streams with a part already stored
	for i, p := range parts {
		head := int64(len(s.streams[p.Stream])) - 1 + ahead[p.Stream]
		pl := plan{part: p, head: head}
		n := int64(len(p.Events))
		if n == 0 { // an assertion of the stream's revision: nothing to write
			if last, _ := p.Expected.LastBefore(); last != head {
				return nil, wrongRevision(p, head)
			}
			plans[i] = pl
			continue
		}
		if last, ok := p.Expected.LastBefore(); ok {
			switch {
			case last == head:
				pl.write = true
			case last > head, last+n > head:
				return nil, wrongRevision(p, head)
			default:
				res, ok := s.matchAtLocked(p.Stream, last+1, p.Events)
				if !ok {
					return nil, wrongRevision(p, head)
				}
				pl.result = res
			}
		} else {
			if p.Expected.IsStreamExists() && head < 0 {
				return nil, wrongRevision(p, head)
			}
			j, found := s.ids[p.Events[0].ID]
			if found && s.all[j].Stream == p.Stream {
				res, ok := s.matchAtLocked(p.Stream, int64(s.all[j].Revision), p.Events)
				if !ok {
					return nil, wrongRevision(p, head)
				}
				pl.result = res
			} else {
				pl.write = true
			}
		}
		switch {
		case !pl.write && p.MustBeNew, pl.write && matched[p.Stream]:
			return nil, wrongRevision(p, head)
		case pl.write:
			ahead[p.Stream] += n
		default:
			matched[p.Stream] = true
		}
		plans[i] = pl
	}
	if err := s.checkIDsLocked(plans); err != nil {
		return nil, err
	}
	return plans, nil
}

func (s *Store) checkIDsLocked(plans []plan) error {
	seen := map[uuid.UUID]bool{}
	for _, pl := range plans {
		if !pl.write {
			continue
		}
		for _, e := range pl.part.Events {
			if _, dup := s.ids[e.ID]; dup || seen[e.ID] {
				return &eventstore.DuplicateEventIDError{ID: e.ID, Stream: pl.part.Stream}
			}
			seen[e.ID] = true
		}
	}
	return nil
}

func (s *Store) applyLocked(plans []plan) []eventstore.AppendResult {
	now := time.Now().UTC()
	res := make([]eventstore.AppendResult, len(plans))
	wrote := false
	for i, pl := range plans {
		if !pl.write {
			res[i] = pl.result
			continue
		}
		for j, e := range pl.part.Events {
			idx := len(s.all)
			s.all = append(s.all, eventstore.RecordedEvent{
				ID:       e.ID,
				Stream:   pl.part.Stream,
				Revision: uint64(pl.head + 1 + int64(j)),
				Position: position(idx),
				Type:     e.Type,
				Data:     slices.Clone(nonNil(e.Data)),
				Metadata: slices.Clone(nonNil(e.Metadata)),
				Created:  now,
			})
			s.streams[pl.part.Stream] = append(s.streams[pl.part.Stream], idx)
			s.ids[e.ID] = idx
			if e.Subject != "" {
				k := subjectKey(pl.part.Stream, e.Subject)
				s.subjects[k] = append(s.subjects[k], idx)
			}
		}
		last := len(s.all) - 1
		res[i] = eventstore.AppendResult{
			FirstRevision: uint64(pl.head + 1),
			LastRevision:  s.all[last].Revision,
			Position:      position(last),
		}
		wrote = true
	}
	if wrote {
		s.broadcastLocked()
	}
	return res
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func clone(e eventstore.RecordedEvent) eventstore.RecordedEvent {
	e.Data = slices.Clone(e.Data)
	e.Metadata = slices.Clone(e.Metadata)
	return e
}

// ---- reads ----

// ReadStream implements eventstore.StreamReader.
func (s *Store) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("eventstore/memory: read stream: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	idx := s.streams[stream]
	if len(idx) == 0 {
		return nil, fmt.Errorf("%w: %q", eventstore.ErrStreamNotFound, stream)
	}
	var out []eventstore.RecordedEvent
	add := func(i int) bool {
		out = append(out, clone(s.all[idx[i]]))
		return max <= 0 || len(out) < max
	}
	if dir == eventstore.Backwards {
		start := len(idx) - 1
		if from < uint64(len(idx)) {
			start = int(from)
		}
		for i := start; i >= 0 && add(i); i-- {
		}
	} else {
		for i := from; i < uint64(len(idx)) && add(int(i)); i++ {
		}
	}
	return out, nil
}

// ReadCold implements eventstore.ColdReader.
func (s *Store) ReadCold(ctx context.Context, streams []string, max int) ([]eventstore.ColdStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("eventstore/memory: read cold: %w", err)
	}
	if max < 1 {
		return nil, fmt.Errorf("eventstore/memory: read cold: max %d is below 1", max)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	out := make([]eventstore.ColdStream, len(streams))
	for i, stream := range streams {
		from := uint64(0)
		if snap, ok := s.snaps[stream]; ok {
			snap.Data = slices.Clone(snap.Data)
			out[i].Snapshot, from = &snap, snap.Revision
		}
		idx := s.streams[stream]
		for r := from; r < uint64(len(idx)) && len(out[i].Events) < max; r++ {
			out[i].Events = append(out[i].Events, clone(s.all[idx[r]]))
		}
	}
	return out, nil
}

// ListStreams implements eventstore.StreamLister (names in byte order).
func (s *Store) ListStreams(ctx context.Context, prefix, after string, max int) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("eventstore/memory: list streams: %w", err)
	}
	if max < 1 {
		return nil, fmt.Errorf("eventstore/memory: list streams: max %d is below 1", max)
	}
	s.mu.Lock()
	var out []string
	for name := range s.streams {
		if strings.HasPrefix(name, prefix) && name > after {
			out = append(out, name)
		}
	}
	s.mu.Unlock()
	slices.Sort(out)
	return out[:min(len(out), max)], nil
}

// ReadAll implements eventstore.AllReader: up to max (max <= 0: all) events after `after`.
func (s *Store) ReadAll(ctx context.Context, after eventstore.Position, max int) ([]eventstore.RecordedEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("eventstore/memory: read all: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	return s.readAllLocked(after, max), nil
}

func (s *Store) readAllLocked(after eventstore.Position, max int) []eventstore.RecordedEvent {
	i := sort.Search(len(s.all), func(i int) bool { return s.all[i].Position.Compare(after) > 0 })
	end := len(s.all)
	if max > 0 && i+max < end {
		end = i + max
	}
	out := make([]eventstore.RecordedEvent, 0, end-i)
	for ; i < end; i++ {
		out = append(out, clone(s.all[i]))
	}
	return out
}

// Head implements eventstore.Store.
func (s *Store) Head(ctx context.Context) (eventstore.Position, error) {
	if err := ctx.Err(); err != nil {
		return eventstore.Position{}, fmt.Errorf("eventstore/memory: head: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return eventstore.Position{}, ErrClosed
	}
	if len(s.all) == 0 {
		return eventstore.Start, nil
	}
	return position(len(s.all) - 1), nil
}

// ---- subscriptions ----

const (
	subscribeBatch = 256
	defaultBuffer  = 512
)

type subscription struct {
	events chan eventstore.RecordedEvent
	cancel context.CancelFunc
	done   chan struct{}
}

func (sub *subscription) Events() <-chan eventstore.RecordedEvent { return sub.events }

// Err is always nil: an in-memory subscription cannot fail.
func (sub *subscription) Err() error { return nil }

func (sub *subscription) Close() error {
	sub.cancel()
	<-sub.done
	return nil
}

// SubscribeAll implements eventstore.Subscriber.
func (s *Store) SubscribeAll(ctx context.Context, after eventstore.Position, opts eventstore.SubscribeOptions) (eventstore.Subscription, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("eventstore/memory: subscribe: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.subs.Add(1)
	s.mu.Unlock()
	size := opts.BufferSize
	if size <= 0 {
		size = defaultBuffer
	}
	prefixes := slices.Clone(opts.StreamPrefixes)
	ctx, cancel := context.WithCancel(ctx)
	sub := &subscription{events: make(chan eventstore.RecordedEvent, size), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer s.subs.Done()
		defer close(sub.done)
		defer close(sub.events)
		defer cancel()
		pos := after
		for {
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				return
			}
			batch := s.readAllLocked(pos, subscribeBatch)
			changed := s.changed
			s.mu.Unlock()
			for _, e := range batch {
				pos = e.Position
				if !matches(e.Stream, prefixes) {
					continue
				}
				select {
				case sub.events <- e:
				case <-ctx.Done():
					return
				case <-s.done:
					return
				}
			}
			if len(batch) == subscribeBatch {
				continue
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			case <-s.done:
				return
			}
		}
	}()
	return sub, nil
}

func matches(stream string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(stream, p) {
			return true
		}
	}
	return false
}

// ReportsIdempotentAppends tells the conformance suite that AppendResult.Idempotent
// is reported by this store.
func (s *Store) ReportsIdempotentAppends() bool { return true }

// ReadEventByID implements eventstore.EventLocator.
func (s *Store) ReadEventByID(ctx context.Context, id uuid.UUID) (eventstore.RecordedEvent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return eventstore.RecordedEvent{}, ErrClosed
	}
	i, ok := s.ids[id]
	if !ok {
		return eventstore.RecordedEvent{}, fmt.Errorf("%w: %s", eventstore.ErrEventNotFound, id)
	}
	return clone(s.all[i]), nil
}

// subjectKey indexes subjects: stream names and subjects hold no NUL.
func subjectKey(stream, subject string) string { return stream + "\x00" + subject }

// ReadStreamSubject implements eventstore.SubjectReader.
func (s *Store) ReadStreamSubject(ctx context.Context, stream, subject string, max int) ([]eventstore.RecordedEvent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	idx := s.subjects[subjectKey(stream, subject)]
	if max > 0 && len(idx) > max {
		idx = idx[:max]
	}
	out := make([]eventstore.RecordedEvent, len(idx))
	for i, j := range idx {
		out[i] = clone(s.all[j])
	}
	return out, nil
}

// EventsExist implements eventstore.EventLocator.
func (s *Store) EventsExist(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	out := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		if _, ok := s.ids[id]; ok {
			out[id] = true
		}
	}
	return out, nil
}

// ReadEventsByID implements eventstore.EventLocator.
func (s *Store) ReadEventsByID(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]eventstore.RecordedEvent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	out := make(map[uuid.UUID]eventstore.RecordedEvent, len(ids))
	for _, id := range ids {
		if i, ok := s.ids[id]; ok {
			out[id] = clone(s.all[i])
		}
	}
	return out, nil
}

// WriteSnapshot implements eventstore.SnapshotStore.
func (s *Store) WriteSnapshot(ctx context.Context, snap eventstore.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if old, ok := s.snaps[snap.Stream]; ok && old.Revision > snap.Revision {
		return nil
	}
	snap.Data, snap.Taken = slices.Clone(snap.Data), time.Now().UTC()
	s.snaps[snap.Stream] = snap
	return nil
}

// ReadSnapshot implements eventstore.SnapshotStore.
func (s *Store) ReadSnapshot(ctx context.Context, stream string) (eventstore.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap, ok := s.snaps[stream]
	if !ok {
		return eventstore.Snapshot{}, fmt.Errorf("%w: %q", eventstore.ErrSnapshotNotFound, stream)
	}
	snap.Data = slices.Clone(snap.Data)
	return snap, nil
}

// ReadSnapshots implements eventstore.SnapshotStore.
func (s *Store) ReadSnapshots(ctx context.Context, after string, max int) ([]eventstore.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []eventstore.Snapshot
	for _, snap := range s.snaps {
		if snap.Stream > after {
			snap.Data = slices.Clone(snap.Data)
			out = append(out, snap)
		}
	}
	slices.SortFunc(out, func(a, b eventstore.Snapshot) int { return strings.Compare(a.Stream, b.Stream) })
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out, nil
}

// CorruptSnapshot replaces a stream's snapshot with any bytes filed at any
// revision, as a broken disk or a hand would (tests of the readers' checks).
func (s *Store) CorruptSnapshot(stream string, revision eventstore.Revision, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snaps[stream] = eventstore.Snapshot{Stream: stream, Revision: revision, Data: slices.Clone(data), Taken: time.Now().UTC()}
}
