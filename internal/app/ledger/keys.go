package ledger

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// keyFinder is how the service finds a key an aggregate has forgotten (see
// history.go), chosen once in New from the store's capability (keyFinderFor):
//
//   - byEventID, a store that locates events by ID (eventstore.EventLocator:
//     PostgreSQL, memory): a key's first event is read by its derived ID, and
//     while resends of forgotten keys arrive on a stream, each command's key
//     is looked up first, in batches (keyLookups);
//   - byClaim, a store that does neither that nor append to several streams
//     at once (KurrentDB through the v4 client): a key's claim names the
//     stream and the revision its decision was written from, so every
//     decision on an account is written after its key's claim, a saga step's
//     too, and an aggregate that forgot keys looks a key up before deciding
//     (that store would not refuse a second event with the same ID);
//   - keepingAll, any other store: aggregates forget no keys.
type keyFinder interface {
	// forgets reports whether aggregates forget keys (Account.KeyLimit).
	forgets() bool
	// asks reports whether a key acc holds no record of is looked up in the store.
	asks(acc *domain.Account) bool
	// first reports whether it is looked up before the command is decided, not
	// only once the store has refused its append.
	first(acc *domain.Account) bool
	// firstEventOf is the first event key wrote to stream, or ErrEventNotFound.
	firstEventOf(ctx context.Context, stream, key string) (eventstore.RecordedEvent, error)
	// decidedBefore is the first event key wrote to stream, nil when the
	// store holds none, while resends of forgotten keys arrive on it; nil
	// otherwise, reading nothing. The event is read with the other
	// commands' (keyLookups), so that a resend's record is rebuilt from it
	// (keyRecordFrom) without another read under the stream's lock.
	decidedBefore(ctx context.Context, stream, key string) (*eventstore.RecordedEvent, error)
	// decidedBeforeAll is decidedBefore of many keys at once (a batch's), in
	// one request: answers[i].looked when qs[i]'s stream is in "old keys"
	// mode, and then answers[i].first as decidedBefore's.
	decidedBeforeAll(ctx context.Context, qs []keyAnswer) ([]keyAnswer, error)
	// mayExist reports whether the store may hold an event of id: false only
	// when it is known not to (one batched lookup); a finder that cannot tell
	// answers true.
	mayExist(ctx context.Context, id uuid.UUID) (bool, error)
	// stepsClaim reports whether a saga step claims its derived key, as a
	// client command does: that is how it is found once forgotten.
	stepsClaim() bool
	// noteOldKey records that a command on stream was a resend of a key its
	// aggregate had forgotten (found by the store's refusal of its append).
	noteOldKey(stream string)
	close()
}

// keyFinderFor is the key finder a store's capability calls for.
func keyFinderFor(s *Service, store Store) keyFinder {
	if l, ok := store.(eventstore.EventLocator); ok {
		return &byEventID{s: s, locator: l, lookups: newKeyLookups(l, s.metrics.lookupBatch)}
	}
	if _, multi := store.(eventstore.MultiAppender); !multi {
		return byClaim{s: s}
	}
	return keepingAll{}
}

// byEventID finds a key's first event by its derived ID (eventstore.EventLocator).
type byEventID struct {
	s       *Service
	locator eventstore.EventLocator
	lookups *keyLookups
	oldKeys sync.Map // streams where resends of forgotten keys arrive: string -> time.Time
}

func (*byEventID) forgets() bool              { return true }
func (*byEventID) asks(*domain.Account) bool  { return true }
func (*byEventID) first(*domain.Account) bool { return false }
func (*byEventID) stepsClaim() bool           { return false }
func (f *byEventID) close()                   { f.lookups.close() }
func (f *byEventID) mayExist(ctx context.Context, id uuid.UUID) (bool, error) {
	e, err := f.lookups.event(ctx, id)
	return e != nil, err
}

func (f *byEventID) firstEventOf(ctx context.Context, stream, key string) (eventstore.RecordedEvent, error) {
	return f.locator.ReadEventByID(ctx, domain.EventID(key, stream, 0))
}

// oldKeyWindow is how long a stream stays in "resends of old keys arrive" mode
// after one did: its commands' keys are looked up in the store before they are
// decided (decidedBefore).
const oldKeyWindow = 10 * time.Second

func (f *byEventID) noteOldKey(stream string) {
	f.oldKeys.Store(stream, time.Now())
}

// oldKeysOn reports whether resends of forgotten keys arrive on stream
// (noteOldKey, within oldKeyWindow).
func (f *byEventID) oldKeysOn(stream string) bool {
	seen, ok := f.oldKeys.Load(stream)
	if !ok {
		return false
	}
	if time.Since(seen.(time.Time)) > oldKeyWindow {
		f.oldKeys.CompareAndDelete(stream, seen)
		return false
	}
	return true
}

// decidedBefore: one indexed read, outside the stream's lock, shared with the
// concurrent commands' (keyLookups). An old key decided again is refused by
// the store anyway (its event IDs are taken), but only at its append: the
// commands decided on top of it in the meantime fail with it and are decided
// again, so in a burst of old resends (a client replaying yesterday's file)
// the lookup first is cheaper; outside one, new commands pay no read.
func (f *byEventID) decidedBefore(ctx context.Context, stream, key string) (*eventstore.RecordedEvent, error) {
	if !f.oldKeysOn(stream) {
		return nil, nil
	}
	return f.lookups.event(ctx, domain.EventID(key, stream, 0))
}

// keyAnswer is decidedBefore's answer for key on stream, taken ahead
// (decidedBeforeAll): looked when it was asked, first what it found.
type keyAnswer struct {
	stream, key string
	looked      bool
	first       *eventstore.RecordedEvent
}

// decidedBeforeAll: the keys of the streams in "old keys" mode in one
// ReadEventsByID (at most maxLookupBatch of them; the others are left for
// decidedBefore), not one round each: a hot batch's commands start one after
// another, each once the one before is decided, so each one's round was on
// the way of the next.
func (f *byEventID) decidedBeforeAll(ctx context.Context, qs []keyAnswer) ([]keyAnswer, error) {
	var ids []uuid.UUID
	var at []int
	for i, q := range qs {
		if len(ids) < maxLookupBatch && q.key != "" && f.oldKeysOn(q.stream) {
			ids, at = append(ids, domain.EventID(q.key, q.stream, 0)), append(at, i)
		}
	}
	if len(ids) == 0 {
		return qs, nil
	}
	found, err := f.locator.ReadEventsByID(ctx, ids)
	if err != nil {
		return qs, err
	}
	f.s.metrics.lookupBatch.Observe(float64(len(ids)))
	for j, i := range at {
		qs[i].looked = true
		if e, ok := found[ids[j]]; ok {
			qs[i].first = &e
		}
	}
	return qs, nil
}

// byClaim finds a key's first event through its claim (KeyClaimed); it
// looks nothing up in batches and notes no old keys (keepingAll's).
type byClaim struct {
	keepingAll
	s *Service
}

func (byClaim) forgets() bool                  { return true }
func (byClaim) asks(acc *domain.Account) bool  { return acc.Forgot() }
func (byClaim) first(acc *domain.Account) bool { return acc.Forgot() }
func (byClaim) stepsClaim() bool               { return true }

// firstEventOf: the claim names the stream and the revision the decision was
// to be written at: a lower bound, since a decision taken again after a
// concurrent write lands later. The stream is read forward from there, a page
// at a time, to the key's first event (a claim written before a crash, whose
// decision never was, reads to the head and finds none). A claim made before
// claims held a revision is read from the stream's start.
func (f byClaim) firstEventOf(ctx context.Context, stream, key string) (eventstore.RecordedEvent, error) {
	id := domain.EventID(key, stream, 0)
	c, err := f.s.readClaim(ctx, key)
	if err != nil {
		return eventstore.RecordedEvent{}, err
	}
	if c == nil || c.Stream != stream {
		return eventstore.RecordedEvent{}, eventstore.ErrEventNotFound
	}
	from := eventstore.Revision(0)
	if c.Revision != nil {
		from = *c.Revision
	}
	const page = 256
	for {
		evs, err := f.s.store.ReadStream(ctx, stream, from, eventstore.Forwards, page)
		if errors.Is(err, eventstore.ErrStreamNotFound) {
			return eventstore.RecordedEvent{}, eventstore.ErrEventNotFound
		}
		if err != nil {
			return eventstore.RecordedEvent{}, err
		}
		for _, re := range evs {
			if re.ID == id {
				return re, nil
			}
		}
		if len(evs) < page {
			return eventstore.RecordedEvent{}, eventstore.ErrEventNotFound
		}
		from += page
	}
}

// keepingAll: aggregates keep every key; nothing is looked up.
type keepingAll struct{}

func (keepingAll) forgets() bool                                     { return false }
func (keepingAll) asks(*domain.Account) bool                         { return false }
func (keepingAll) first(*domain.Account) bool                        { return false }
func (keepingAll) stepsClaim() bool                                  { return false }
func (keepingAll) close()                                            {}
func (keepingAll) noteOldKey(string)                                 {}
func (keepingAll) mayExist(context.Context, uuid.UUID) (bool, error) { return true, nil }
func (keepingAll) decidedBefore(context.Context, string, string) (*eventstore.RecordedEvent, error) {
	return nil, nil
}
func (keepingAll) decidedBeforeAll(_ context.Context, qs []keyAnswer) ([]keyAnswer, error) {
	return qs, nil
}
func (keepingAll) firstEventOf(context.Context, string, string) (eventstore.RecordedEvent, error) {
	return eventstore.RecordedEvent{}, eventstore.ErrEventNotFound
}
