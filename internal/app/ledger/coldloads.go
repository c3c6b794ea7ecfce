package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// Cold loads (issue 27). An account whose aggregate is not in the cache is
// loaded from the store on its next command, under its stream's lock: its
// latest snapshot and the events after it. Over a million accounts each
// touched now and then, most commands find their account cold, and one load
// per command (two or three statements each) is what bounds the rate, so a
// store that reads many streams' starts at once (eventstore.ColdReader:
// PostgreSQL, memory) gets the cold loads of concurrent commands in one
// request per round (rounds), as group commit gathers their appends; another
// store (KurrentDB) is read stream by stream. Which one is a capability of the
// store, chosen once in New (coldLoaderFor).
type coldLoader interface {
	// load returns the aggregate of stream (account id) caught up to the
	// store's head: from its snapshot when it has one that matches the
	// stream, otherwise folded from its start.
	load(ctx context.Context, stream, id string) (*domain.Account, error)
	close()
}

// coldLoaderFor is the cold loader the store's capability calls for.
func coldLoaderFor(s *Service, store Store) coldLoader {
	if cr, ok := store.(eventstore.ColdReader); ok {
		return newGroupedCold(s, cr)
	}
	return streamByStream{s}
}

// streamByStream loads each aggregate with its own reads.
type streamByStream struct{ s *Service }

func (streamByStream) close() {}

func (c streamByStream) load(ctx context.Context, stream, id string) (*domain.Account, error) {
	s := c.s
	acc, err := s.coldAccount(ctx, stream, id)
	if err != nil {
		return nil, err
	}
	return s.foldRest(ctx, stream, id, acc)
}

// foldRest catches acc up with the events of stream after its revision; when
// they do not fold on the snapshot it started from, the stream is folded from
// its start (snapshotDoesNotFold).
func (s *Service) foldRest(ctx context.Context, stream, id string, acc *domain.Account) (*domain.Account, error) {
	err := catchUp(ctx, s.store, stream, acc.Revision, foldInto(acc))
	if err != nil && acc.SnapshotRevision >= 0 && ctx.Err() == nil {
		return s.snapshotDoesNotFold(ctx, stream, id, acc, err)
	}
	return acc, err
}

// snapshotDoesNotFold answers a load whose events after the snapshot did not
// fold on it (each states the account it leaves): the snapshot is not of
// this stream's history, and the stream is folded from its start.
func (s *Service) snapshotDoesNotFold(ctx context.Context, stream, id string, acc *domain.Account, err error) (*domain.Account, error) {
	s.metrics.snapshotsIgnored.Inc()
	s.log.Warn("account snapshot ignored: the events after it do not fold on it", "stream", stream, "revision", acc.SnapshotRevision, "err", err)
	acc = s.newAccount(id)
	return acc, catchUp(ctx, s.store, stream, acc.Revision, foldInto(acc))
}

// Grouped cold loads: at most maxColdBatch streams a request, coldRounds
// requests at once, coldPage events of each stream (a longer tail is read
// on by catchUp, a page at a time).
const (
	maxColdBatch = 256
	coldRounds   = 4
	coldPage     = 256
)

// groupedCold reads the cold aggregates of concurrent commands in one
// request per round (eventstore.ColdReader).
type groupedCold struct {
	s      *Service
	rounds *rounds[string, eventstore.ColdStream]
}

func newGroupedCold(s *Service, cr eventstore.ColdReader) *groupedCold {
	return &groupedCold{s: s, rounds: newRounds(maxColdBatch, coldRounds, s.metrics.coldBatch, func(ctx context.Context, streams []string) ([]eventstore.ColdStream, error) {
		return cr.ReadCold(ctx, streams, coldPage)
	})}
}

func (c *groupedCold) close() { c.rounds.close() }

func (c *groupedCold) load(ctx context.Context, stream, id string) (*domain.Account, error) {
	read, err := c.rounds.do(ctx, stream)
	if err != nil {
		return nil, err
	}
	return c.s.fromCold(ctx, stream, id, read)
}

// fromCold is the aggregate of stream (account id) from what a ColdReader
// read of it, caught up to the store's head.
func (s *Service) fromCold(ctx context.Context, stream, id string, read eventstore.ColdStream) (*domain.Account, error) {
	var err error
	acc, evs := s.newAccount(id), read.Events
	if read.Snapshot != nil {
		var first *eventstore.RecordedEvent
		if len(evs) > 0 {
			first = &evs[0]
		}
		if acc, err = s.snapshotAccount(stream, *read.Snapshot, first); err != nil {
			s.ignoreSnapshot(stream, read.Snapshot.Revision, err)
			acc = s.newAccount(id)
			return acc, catchUp(ctx, s.store, stream, acc.Revision, foldInto(acc))
		}
		evs = evs[1:]
	}
	for _, re := range evs {
		ev, err := toStored(re)
		if err == nil {
			err = domain.EvolveAccount(acc, ev)
		}
		if err != nil {
			if acc.SnapshotRevision >= 0 {
				return s.snapshotDoesNotFold(ctx, stream, id, acc, err)
			}
			return nil, err
		}
	}
	if len(read.Events) < coldPage {
		return acc, nil
	}
	return s.foldRest(ctx, stream, id, acc)
}

// snapshotAccount is the aggregate of a snapshot checked against its
// stream's event at its revision (first, nil when the stream has none
// there): that event must carry the snapshot's chain hash, which chains every
// earlier event of the stream, and agree with its state (the amounts it
// states, the hold it touches: domain.SnapshotAgreesWithHead). On a store that reads no subjects, a snapshot
// saying it forgot closed holds or refunded originals is forged (New keeps
// them all there): loaded, every hold and original it lacks would be
// recalled from a store that cannot, and the commands naming them fail.
func (s *Service) snapshotAccount(stream string, snap eventstore.Snapshot, first *eventstore.RecordedEvent) (*domain.Account, error) {
	acc, err := domain.DecodeSnapshot(stream, snap.Data)
	if err != nil {
		return nil, err
	}
	if uint64(acc.Revision) != snap.Revision {
		return nil, fmt.Errorf("ledger: snapshot of %s is filed at revision %d but holds %d", stream, snap.Revision, acc.Revision)
	}
	if _, none := s.subjects.(noSubjects); none && (acc.ForgotHolds() || acc.ForgotRefunds()) {
		return nil, fmt.Errorf("ledger: snapshot of %s at revision %d says it forgot closed holds or refunded originals, which no aggregate on a store that reads no subjects does: it could recall none", stream, snap.Revision)
	}
	if first == nil || first.Revision != snap.Revision {
		return nil, fmt.Errorf("ledger: snapshot of %s at revision %d is beyond the stream", stream, snap.Revision)
	}
	m, err := domain.DecodeMetadata(first.Metadata)
	if err != nil {
		return nil, err
	}
	if m.Chain != acc.LastChain {
		return nil, fmt.Errorf("ledger: snapshot of %s at revision %d has chain %s, the stream %s", stream, snap.Revision, acc.LastChain, m.Chain)
	}
	if err := domain.SnapshotAgreesWithHead(acc, first.Type, first.Data); err != nil {
		return nil, fmt.Errorf("ledger: snapshot of %s at revision %d: %w", stream, snap.Revision, err)
	}
	s.bound(acc).SnapshotRevision = acc.Revision
	return acc, nil
}

// ignoreSnapshot counts and logs a snapshot that does not match its stream.
func (s *Service) ignoreSnapshot(stream string, revision uint64, err error) {
	s.metrics.snapshotsIgnored.Inc()
	s.log.Warn("account snapshot ignored: folding the stream from its start", "stream", stream, "revision", revision, "err", err)
}

// coldAccount is the aggregate a stream-by-stream cold load starts from: the
// stream's snapshot when it has one that matches the stream, otherwise an
// empty aggregate.
func (s *Service) coldAccount(ctx context.Context, stream, id string) (*domain.Account, error) {
	snap, err := s.snaps.ReadSnapshot(ctx, stream)
	if errors.Is(err, eventstore.ErrSnapshotNotFound) {
		return s.newAccount(id), nil
	}
	if err != nil {
		return nil, err
	}
	evs, err := s.store.ReadStream(ctx, stream, snap.Revision, eventstore.Forwards, 1)
	if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
		return nil, err
	}
	var first *eventstore.RecordedEvent
	if len(evs) > 0 {
		first = &evs[0]
	}
	acc, err := s.snapshotAccount(stream, snap, first)
	if err != nil {
		s.ignoreSnapshot(stream, snap.Revision, err)
		return s.newAccount(id), nil
	}
	return acc, nil
}
