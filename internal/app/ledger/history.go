package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// Long histories (ARCHITECTURE: hot accounts and long histories). An account's
// history costs no memory: its aggregate keeps the state, its active holds, its
// most recently closed holds (Options.RecentHolds) and the refunded sums of its
// most recently refunded originals (Options.RecentRefunds; an older hold or
// original is found by its events' subject on a store that reads them,
// eventstore.SubjectReader: recallForgotten) and the records of its most
// recent keys (Options.RecentKeys); the record of an
// older key is rebuilt from the key's own events, found by their derived IDs, on
// a store that locates events (eventstore.EventLocator). A cold load reads the
// account's latest snapshot and the events after it (eventstore.SnapshotStore),
// and a snapshot is taken every Options.SnapshotEvery events.
//
// A store that locates no events and appends to one stream at a time (KurrentDB
// through the v4 client) finds a forgotten key through its claim instead
// (keys.go, byClaim): every decision on an account is written there after its key's
// claim, a saga step's too, and a command on an aggregate that
// forgot keys has its key looked up before it is decided, since that store
// would not refuse a second event with the same ID. It takes no snapshots.

// readTimeout bounds one read the ledger makes on behalf of several commands.
const readTimeout = 30 * time.Second

// newAccount is an empty aggregate bounded as this service bounds them.
func (s *Service) newAccount(id string) *domain.Account {
	return s.bound(domain.NewAccount(id))
}

// bound sets an aggregate's limits as this service bounds them.
func (s *Service) bound(acc *domain.Account) *domain.Account {
	acc.KeyLimit, acc.PinUnclaimedSteps, acc.HoldLimit, acc.RefundLimit = s.keyLimit, s.keys.stepsClaim(), s.holdLimit, s.refundLimit
	return acc
}

// snapshotIfDue takes a snapshot of acc (the caller holds the stream's lock,
// and nothing is in flight on it) when SnapshotEvery events have passed since
// the last one and acc is the store's state (domain.Account.Durable, the rule
// residents are made by too: never a decision the store has not confirmed).
// It is encoded here and written in the background; when the writes fall
// behind, it is skipped (the next one is due as many events later).
func (s *Service) snapshotIfDue(stream string, acc *domain.Account) {
	if s.opts.SnapshotEvery <= 0 || acc.Revision-acc.SnapshotRevision < int64(s.opts.SnapshotEvery) || !acc.Durable() {
		return
	}
	if acc.Pinned() > 0 {
		// A snapshot holds no keys, and a pinned key (a saga step written
		// before steps claimed their keys) could not be found once forgotten:
		// such an account is folded from its start, as before.
		return
	}
	acc.SnapshotRevision = acc.Revision
	data, err := domain.EncodeSnapshot(stream, acc)
	if err != nil {
		s.log.Warn("account snapshot not taken", "stream", stream, "err", err)
		return
	}
	select {
	case s.snapSlots <- struct{}{}:
	default:
		return
	}
	snap := eventstore.Snapshot{Stream: stream, Revision: uint64(acc.Revision), Data: data}
	s.snapWG.Add(1)
	go func() {
		defer func() { <-s.snapSlots; s.snapWG.Done() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.snaps.WriteSnapshot(ctx, snap); err != nil {
			s.log.Warn("account snapshot not written", "stream", stream, "revision", snap.Revision, "err", err)
			return
		}
		s.metrics.snapshotsTaken.Inc()
	}()
}

// keyRecord is the record of key in an account's aggregate, rebuilt from the
// store when the aggregate has forgotten it (and then remembered again); nil
// when the key was never decided on the stream. The caller holds the lock.
func (s *Service) keyRecord(ctx context.Context, stream string, acc *domain.Account, key string) (*domain.KeyRecord, error) {
	return s.keyRecordFrom(ctx, stream, acc, key, nil)
}

// keyRecordFrom is keyRecord given the key's first event when it was read
// already (decidedBefore; nil: read it here).
func (s *Service) keyRecordFrom(ctx context.Context, stream string, acc *domain.Account, key string, first *eventstore.RecordedEvent) (*domain.KeyRecord, error) {
	if rec := acc.Keys[key]; rec != nil || !s.keys.asks(acc) {
		return rec, nil
	}
	if first == nil {
		e, err := s.keys.firstEventOf(ctx, stream, key)
		if errors.Is(err, eventstore.ErrEventNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		first = &e
	}
	m, err := domain.DecodeMetadata(first.Metadata)
	if err != nil {
		return nil, err
	}
	if first.Stream != stream || m.Key != key || m.Index != 0 || m.Count < 1 {
		return nil, fmt.Errorf("ledger: event %s of key %q is %s@%d, event %d of key %q", first.ID, key, first.Stream, first.Revision, m.Index, m.Key)
	}
	evs := []eventstore.RecordedEvent{*first}
	if m.Count > 1 {
		rest, err := s.store.ReadStream(ctx, stream, first.Revision+1, eventstore.Forwards, m.Count-1)
		if err != nil {
			return nil, err
		}
		evs = append(evs, rest...)
	}
	stored := make([]domain.StoredEvent, len(evs))
	for i, re := range evs {
		if stored[i], err = toStored(re); err != nil {
			return nil, err
		}
	}
	s.metrics.keysRecalled.Inc()
	rec, err := acc.RecallKey(stored)
	if errors.Is(err, domain.ErrNoAfterState) {
		return s.recallByFold(ctx, stream, acc, key, stored[len(stored)-1].Revision)
	}
	return rec, err
}

// recallForgotten puts back into an account's aggregate what a command reads
// of it that the aggregate may have forgotten: the record of a refund's
// original (keyRecord), what was refunded of it (recallRefunded), the hold it
// names (recallHold). domain.ErrRecallUnsettled asks to decide again once
// the stream has settled. The caller holds the stream's lock.
func (s *Service) recallForgotten(ctx context.Context, stream string, acc *domain.Account, cmd domain.Command) error {
	if cmd.Type == domain.CmdRefund {
		orig, err := s.keyRecord(ctx, stream, acc, cmd.OriginalKey)
		if err != nil {
			return err
		}
		if orig != nil { // else original_not_found
			if err := s.recallRefunded(ctx, stream, acc, cmd.OriginalKey); err != nil {
				return err
			}
		}
	}
	return s.recallHold(ctx, stream, acc, cmd.HoldID)
}

// recallHold puts back into an aggregate that forgot closed holds the hold a
// command names, when it is not there: its events, found by their subject in
// one read, say what became of it (domain.RecallHold). Nothing to do for a
// command that names no hold, an aggregate that forgot none, or a store that
// reads no subjects (its aggregates keep every hold). A hold is forgotten only
// once its closure is durable (Account.ForgetDurable), so the store shows
// what became of it; ErrHoldInFlight, should it show the hold active while the
// aggregate closed it, and ErrRecallUnsettled, should it show an event the
// aggregate has not folded (another instance's), ask to decide again once the
// stream has settled, on the store's head. The caller holds the stream's lock.
func (s *Service) recallHold(ctx context.Context, stream string, acc *domain.Account, holdID string) error {
	if holdID == "" || !acc.ForgotHolds() || acc.Holds[holdID] != nil {
		return nil
	}
	evs, err := s.readSubject(ctx, stream, domain.HoldSubject(holdID))
	if err != nil {
		return err
	}
	if err := acc.RecallHold(evs); err != nil {
		return err
	}
	if acc.Holds[holdID] != nil {
		s.metrics.holdsRecalled.Inc()
	}
	return nil
}

// recallRefunded puts back into an aggregate that forgot refunded originals
// what was refunded of the original a refund names, when it is not there: the
// sum of its refunds, found by their subject in one read
// (domain.RecallRefunded; 0 for an original never refunded). Nothing to do
// for an aggregate that forgot none, or a store that reads no subjects (its
// aggregates keep every original). An original is forgotten only once its
// last refund is durable, and one not kept is refunded only after this
// recall, so the store holds every refund of it the aggregate folded;
// ErrRecallUnsettled, should it hold one the aggregate has not folded
// (another instance's), asks to decide again on the store's head. The caller
// holds the stream's lock.
func (s *Service) recallRefunded(ctx context.Context, stream string, acc *domain.Account, originalKey string) error {
	if _, kept := acc.Refunded.Lookup(originalKey); kept || !acc.ForgotRefunds() {
		return nil
	}
	evs, err := s.readSubject(ctx, stream, domain.RefundSubject(originalKey))
	if err != nil {
		return err
	}
	if err := acc.RecallRefunded(originalKey, evs); err != nil {
		return err
	}
	if len(evs) > 0 {
		s.metrics.refundsRecalled.Inc()
	}
	return nil
}

// readSubject is a stream's events of one subject, in revision order: one
// indexed read (eventstore.SubjectReader).
func (s *Service) readSubject(ctx context.Context, stream, subject string) ([]domain.StoredEvent, error) {
	evs, err := s.subjects.ReadStreamSubject(ctx, stream, subject, 0)
	if err != nil {
		return nil, err
	}
	stored := make([]domain.StoredEvent, len(evs))
	for i, re := range evs {
		if stored[i], err = toStored(re); err != nil {
			return nil, err
		}
	}
	return stored, nil
}

// errFolded stops a fold at the revision it was asked to reach.
var errFolded = errors.New("ledger: folded far enough")

// recallByFold rebuilds a key's record whose events do not state the account
// they leave (written before events did) by folding the stream up to its last
// event, with an aggregate that remembers one key: slow, but in constant memory.
func (s *Service) recallByFold(ctx context.Context, stream string, acc *domain.Account, key string, last uint64) (*domain.KeyRecord, error) {
	tmp := domain.NewAccount(acc.ID)
	tmp.KeyLimit = 1
	err := catchUp(ctx, s.store, stream, -1, func(ev domain.StoredEvent) error {
		if err := domain.EvolveAccount(tmp, ev); err != nil {
			return err
		}
		if ev.Revision == last {
			return errFolded
		}
		return nil
	})
	if !errors.Is(err, errFolded) {
		return nil, fmt.Errorf("ledger: %s: folding up to revision %d for key %q: %v", stream, last, key, err)
	}
	rec := tmp.Keys[key]
	if rec == nil {
		return nil, fmt.Errorf("ledger: %s: key %q has no record at revision %d", stream, key, last)
	}
	acc.Remember(rec)
	return acc.Keys[key], nil
}

// snapshots is what the service asks of a store's snapshots
// (eventstore.SnapshotStore).
type snapshots interface {
	ReadSnapshot(ctx context.Context, stream string) (eventstore.Snapshot, error)
	WriteSnapshot(ctx context.Context, s eventstore.Snapshot) error
}

// noSnapshots is the snapshots of a store that keeps none: none is found, and
// none is taken (New sets SnapshotEvery negative).
type noSnapshots struct{}

func (noSnapshots) ReadSnapshot(context.Context, string) (eventstore.Snapshot, error) {
	return eventstore.Snapshot{}, eventstore.ErrSnapshotNotFound
}

func (noSnapshots) WriteSnapshot(context.Context, eventstore.Snapshot) error {
	return errNoCapability
}

// noSubjects is the subject reader of a store that reads no subjects. Its
// aggregates forget no hold and no refunded original (New leaves their limits
// 0), so recallHold and recallRefunded never read one: a read is a bug.
type noSubjects struct{}

func (noSubjects) ReadStreamSubject(context.Context, string, string, int) ([]eventstore.RecordedEvent, error) {
	return nil, errNoCapability
}

// errNoCapability is a read or write asked of a capability the store lacks,
// through the no-op implementation New chose for it: the service asks none (a
// bug).
var errNoCapability = errors.New("ledger: asked the store for a capability it lacks")
