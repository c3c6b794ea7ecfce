package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// The transfer process finishes what the inline handler could not: sagas left
// half-way by a crash (ARCHITECTURE decision 6), and holds whose expiry has come.
// It is fed by a subscription to "all" (transfer, transaction and account
// streams) and keeps a small view: the transfer streams with an undecided saga,
// the reservation sagas without an outcome, the capture sagas whose guard
// stands (or was refused), and the active holds with an expiry. Every action
// it takes is an idempotent, derived-key command (the sagas' steps and
// markers, StepKey(placing key, "expire")), so running it on several instances
// at once, or again after a crash, is harmless.
//
// Checkpoint. The view is a function of the prefix of "all" that was read, so it
// is checkpointed in the event store itself: a ProcessCheckpoint event holding the
// position and the view, appended to CheckpointStream with the expected revision
// of the previous checkpoint. On start the process reads the last checkpoint and
// subscribes from its position, instead of scanning "all" from the start (which is
// correct too, and what happens when there is no checkpoint yet). Keeping it in
// the event store needs no second database and works unchanged on KurrentDB; any
// instance's checkpoint is valid for every instance, so two processes that race
// just skip a write. The view only ever leaves out work that is done (a saga
// found decided, a hold found inactive), never work to do. A view too large for
// one event (MaxCheckpointBytes; millions of expiring holds) is not checkpointed:
// the previous checkpoint stays valid, only older.

// ProcessStore is what the transfer process needs of an event store.
type ProcessStore interface {
	Store
	eventstore.AllReader
	eventstore.Subscriber
}

// ProcessOptions configure a Process. Zero values take the defaults.
type ProcessOptions struct {
	// Grace is how long a transfer stream with an undecided saga may go without
	// an event before the process drives it (default 10s): the inline handler
	// normally decides well within it.
	Grace time.Duration
	// SweepInterval is how often Run looks for work (default 1s).
	SweepInterval time.Duration
	// CheckpointInterval is the least time between two checkpoints (default 30s).
	CheckpointInterval time.Duration
	// CheckpointStream holds the checkpoints (default "ledger-process-checkpoint").
	CheckpointStream string
	// MaxCheckpointBytes bounds a checkpoint's size (default 4 MiB).
	MaxCheckpointBytes int
	// ReadPage bounds one read of "all" while catching up (default 1024).
	ReadPage int
	// MaxResubscribeDelay caps the back-off between subscription attempts (default 5s).
	MaxResubscribeDelay time.Duration
}

// EvProcessCheckpoint is the type of a checkpoint event.
const EvProcessCheckpoint = "ProcessCheckpoint"

// Process is the transfer process and hold-expiry scheduler. Its methods may be
// called from several goroutines; they take turns.
type Process struct {
	svc   *Service
	store ProcessStore
	opts  ProcessOptions
	log   *slog.Logger

	mu      sync.Mutex
	loaded  bool
	view    processView
	retry   map[string]retryState // transfers whose last resume failed (not checkpointed)
	cpRev   int64                 // revision of the last checkpoint known (-1: none)
	cpChain string                // its chain hash
	cpPos   eventstore.Position
	cpAt    time.Time // wall time of the last checkpoint attempt (pacing only)
}

// processView is what the process knows of "all" up to Position.
type processView struct {
	Position  eventstore.Position         `json:"position"`
	Transfers map[string]*pendingTransfer `json:"transfers"` // by transfer id
	Holds     map[string]*expiringHold    `json:"holds"`     // by account id "/" hold id
	// Transactions are the reservation sagas still running (txsaga.go), by
	// transaction id, with when their stream last progressed.
	Transactions map[string]time.Time `json:"transactions,omitempty"`
	// Captures are the capture sagas (capturesaga.go) whose guard was placed
	// and not yet released, or refused, by client key, with when.
	Captures map[string]time.Time `json:"captures,omitempty"`
}

// pendingTransfer is a transfer stream with an undecided saga.
type pendingTransfer struct {
	Transfer bool            `json:"transfer,omitempty"` // the transfer's own saga
	Refunds  map[string]bool `json:"refunds,omitempty"`  // undecided refunds by key
	LastAt   time.Time       `json:"last_at"`            // when the stream last progressed
}

// expiringHold is an active hold with an expiry.
type expiringHold struct {
	Account   string    `json:"account"`
	Hold      string    `json:"hold"`
	Key       string    `json:"key"` // the key that placed it
	ExpiresAt time.Time `json:"expires_at"`
}

// retryState spaces out the resumes of a transfer that keeps failing (a saga
// that cannot go on needs an operator; it should not flood the log meanwhile).
type retryState struct {
	failures int
	next     time.Time
}

// maxRetryDelay caps the back-off between resumes of a failing transfer.
const maxRetryDelay = time.Minute

// SweepStats counts what one sweep did.
type SweepStats struct {
	Resumed int // transfer streams driven to a decision
	Expired int // holds found expired and released (or found done)
	Errors  int // actions that failed (retried on the next sweep)
	// Pending and Holds are what the view still holds afterwards.
	Pending int
	Holds   int
}

// NewProcess returns the transfer process of svc over store (the store svc uses).
func NewProcess(svc *Service, store ProcessStore, opts ProcessOptions) *Process {
	if opts.Grace <= 0 {
		opts.Grace = 10 * time.Second
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = time.Second
	}
	if opts.CheckpointInterval <= 0 {
		opts.CheckpointInterval = 30 * time.Second
	}
	if opts.CheckpointStream == "" {
		opts.CheckpointStream = "ledger-process-checkpoint"
	}
	if opts.MaxCheckpointBytes <= 0 {
		opts.MaxCheckpointBytes = 4 << 20
	}
	if opts.ReadPage <= 0 {
		opts.ReadPage = 1024
	}
	if opts.MaxResubscribeDelay <= 0 {
		opts.MaxResubscribeDelay = 5 * time.Second
	}
	return &Process{svc: svc, store: store, opts: opts, log: svc.log.With("component", "transfer-process"), cpRev: -1, view: newView(), retry: map[string]retryState{}}
}

func newView() processView {
	return processView{Transfers: map[string]*pendingTransfer{}, Holds: map[string]*expiringHold{}, Transactions: map[string]time.Time{}, Captures: map[string]time.Time{}}
}

var processPrefixes = []string{domain.TransferStreamPrefix, domain.AccountStreamPrefix, domain.TransactionStreamPrefix}

// Run subscribes to "all" from the last checkpoint and keeps the view, sweeping
// every SweepInterval and checkpointing every CheckpointInterval, until ctx ends
// (then it returns nil). A subscription that fails is re-opened from the last
// position seen, with a bounded back-off.
func (p *Process) Run(ctx context.Context) error {
	delay := 50 * time.Millisecond
	ticker := time.NewTicker(p.opts.SweepInterval)
	defer ticker.Stop()
	for ctx.Err() == nil {
		p.mu.Lock()
		err := p.loadLocked(ctx)
		from := p.view.Position
		p.mu.Unlock()
		var sub eventstore.Subscription
		if err == nil {
			sub, err = p.store.SubscribeAll(ctx, from, eventstore.SubscribeOptions{StreamPrefixes: processPrefixes})
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			p.log.Warn("subscription failed, retrying", "after", delay, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
			delay = min(2*delay, p.opts.MaxResubscribeDelay)
			continue
		}
		delay = 50 * time.Millisecond
		err = p.consume(ctx, sub, ticker.C)
		sub.Close()
		if err != nil && ctx.Err() == nil {
			p.log.Warn("subscription ended, re-subscribing", "err", err)
		}
	}
	return nil
}

// consume applies a subscription's events and sweeps on every tick.
func (p *Process) consume(ctx context.Context, sub eventstore.Subscription, tick <-chan time.Time) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-sub.Events():
			if !ok {
				if err := sub.Err(); err != nil {
					return err
				}
				return errors.New("subscription closed")
			}
			p.mu.Lock()
			p.apply(ev)
			p.mu.Unlock()
		case <-tick:
			p.mu.Lock()
			p.sweepLocked(ctx, p.svc.opts.Clock())
			if time.Since(p.cpAt) >= p.opts.CheckpointInterval { // pacing: wall time

				p.checkpointLocked(ctx)
			}
			p.mu.Unlock()
		}
	}
}

// Recover runs one pass by hand: it reads "all" up to the head visible now,
// drives every saga idle for the grace period and releases every expired hold,
// then checkpoints. Tests and `ledger` start-up use it; Run does the same
// continuously.
func (p *Process) Recover(ctx context.Context) (SweepStats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.loadLocked(ctx); err != nil {
		return SweepStats{}, err
	}
	if err := p.catchUpLocked(ctx); err != nil {
		return SweepStats{}, err
	}
	st := p.sweepLocked(ctx, p.svc.opts.Clock())
	p.checkpointLocked(ctx)
	return st, nil
}

// catchUpLocked reads "all" after the view's position up to the visible head.
func (p *Process) catchUpLocked(ctx context.Context) error {
	for {
		evs, err := p.store.ReadAll(ctx, p.view.Position, p.opts.ReadPage)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			p.apply(ev)
		}
		if len(evs) < p.opts.ReadPage {
			return nil
		}
	}
}

// apply folds one event of "all" into the view.
func (p *Process) apply(ev eventstore.RecordedEvent) {
	if ev.Position.Compare(p.view.Position) > 0 {
		p.view.Position = ev.Position
	}
	if domain.IsTransactionStream(ev.Stream) {
		p.applyTransaction(ev)
		return
	}
	transfer := strings.HasPrefix(ev.Stream, domain.TransferStreamPrefix)
	if !transfer && !strings.HasPrefix(ev.Stream, domain.AccountStreamPrefix) {
		return
	}
	if transfer {
		// Every event of a transfer's sagas moves one on (its time is when
		// the stream last progressed): the registry's, not a list here.
		if t, ok := domain.LookupEventType(ev.Type); !ok || t.Kind != domain.StreamTransfer {
			return
		}
	} else if ev.Type == domain.EvCommandRejected {
		p.applyRefusal(ev)
		return
	} else if ev.Type != domain.EvHoldPlaced && ev.Type != domain.EvHoldCaptured && ev.Type != domain.EvHoldReleased {
		return
	}
	payload, err := domain.DecodeEvent(ev.Type, ev.Data)
	if err != nil {
		p.log.Error("undecodable event skipped", "stream", ev.Stream, "revision", ev.Revision, "err", err)
		return
	}
	m, err := domain.DecodeMetadata(ev.Metadata)
	if err != nil {
		p.log.Error("undecodable metadata skipped", "stream", ev.Stream, "revision", ev.Revision, "err", err)
		return
	}
	if transfer {
		p.applyTransfer(strings.TrimPrefix(ev.Stream, domain.TransferStreamPrefix), payload, m)
		return
	}
	account := strings.TrimPrefix(ev.Stream, domain.AccountStreamPrefix)
	switch e := payload.(type) {
	case *domain.HoldPlaced:
		if key, ok := domain.CaptureGuardKey(e.HoldID); ok {
			p.view.Captures[key] = m.At
		}
		if e.ExpiresAt != nil {
			p.view.Holds[account+"/"+e.HoldID] = &expiringHold{Account: account, Hold: e.HoldID, Key: m.Key, ExpiresAt: *e.ExpiresAt}
		}
	case *domain.HoldCaptured:
		delete(p.view.Holds, account+"/"+e.HoldID)
	case *domain.HoldReleased:
		if key, ok := domain.CaptureGuardKey(e.HoldID); ok {
			delete(p.view.Captures, key)
		}
		delete(p.view.Holds, account+"/"+e.HoldID)
	}
}

// applyRefusal notes a capture saga whose guard was refused: its capture,
// refused for it, may not be written yet. The process's resume finds it
// decided (normally at once) and forgets it.
func (p *Process) applyRefusal(ev eventstore.RecordedEvent) {
	m, err := domain.DecodeMetadata(ev.Metadata)
	if err != nil {
		p.log.Error("undecodable metadata skipped", "stream", ev.Stream, "revision", ev.Revision, "err", err)
		return
	}
	if domain.CommandType(m.Command) == domain.CmdCaptureGuard && m.Origin != "" {
		p.view.Captures[m.Origin] = m.At
	}
}

// applyTransaction notes a reservation saga running (its request, or a marker)
// or decided (its outcome). A transaction decided in one append writes only
// its outcome.
func (p *Process) applyTransaction(ev eventstore.RecordedEvent) {
	id := strings.TrimPrefix(ev.Stream, domain.TransactionStreamPrefix)
	switch ev.Type {
	case domain.EvTransactionRequested, domain.EvTransactionReserved, domain.EvTransactionReservationRefused:
		m, err := domain.DecodeMetadata(ev.Metadata)
		if err != nil {
			p.log.Error("undecodable metadata skipped", "stream", ev.Stream, "revision", ev.Revision, "err", err)
			return
		}
		p.view.Transactions[id] = m.At
	default:
		delete(p.view.Transactions, id)
	}
}

func (p *Process) applyTransfer(id string, payload any, m domain.Metadata) {
	pt := p.view.Transfers[id]
	if pt == nil {
		pt = &pendingTransfer{}
		p.view.Transfers[id] = pt
	}
	pt.LastAt = m.At
	switch e := payload.(type) {
	case *domain.TransferRequested:
		pt.Transfer = true
	case *domain.TransferRejected, *domain.TransferCompleted, *domain.TransferFailed:
		pt.Transfer = false
	case *domain.TransferRefundRequested:
		if pt.Refunds == nil {
			pt.Refunds = map[string]bool{}
		}
		pt.Refunds[e.RefundKey] = true
	case *domain.RefundRejected:
		delete(pt.Refunds, e.RefundKey)
	case *domain.RefundCompleted:
		delete(pt.Refunds, e.RefundKey)
	case *domain.RefundFailed:
		delete(pt.Refunds, e.RefundKey)
	}
	if !pt.Transfer && len(pt.Refunds) == 0 {
		delete(p.view.Transfers, id)
	}
}

// sweepLocked drives the transfers idle for the grace period and expires the
// holds due at now, in a stable order.
func (p *Process) sweepLocked(ctx context.Context, now time.Time) SweepStats {
	var st SweepStats
	for _, id := range slices.Sorted(maps.Keys(p.view.Transfers)) {
		if ctx.Err() != nil {
			break
		}
		if now.Sub(p.view.Transfers[id].LastAt) < p.opts.Grace || now.Before(p.retry[id].next) {
			continue
		}
		if p.resume(&st, now, sagaID{id: id, retryKey: id, what: "transfer_id"}, func() (bool, error) {
			pending, err := p.svc.ResumeTransfer(ctx, id)
			return pending == 0, err
		}) {
			delete(p.view.Transfers, id)
		}
	}
	p.sweepSagas(ctx, &st, now, sagaKind{pending: p.view.Transactions, prefix: domain.TransactionStreamPrefix, what: "transaction_id", drive: p.svc.ResumeTransaction})
	p.sweepSagas(ctx, &st, now, sagaKind{pending: p.view.Captures, prefix: domain.CaptureGuardHoldID(""), what: "capture_key", drive: p.svc.ResumeCapture})
	for _, k := range slices.Sorted(maps.Keys(p.view.Holds)) {
		if ctx.Err() != nil {
			break
		}
		h := p.view.Holds[k]
		if now.Before(h.ExpiresAt) {
			continue
		}
		done, err := p.svc.ExpireHold(ctx, h.Account, h.Hold, h.Key, now)
		if err != nil {
			st.Errors++
			p.log.Warn("expiring a hold failed", "account_id", h.Account, "hold_id", h.Hold, "err", err)
			continue
		}
		if done {
			st.Expired++
			delete(p.view.Holds, k)
		}
	}
	st.Pending, st.Holds = len(p.view.Transfers)+len(p.view.Transactions)+len(p.view.Captures), len(p.view.Holds)
	return st
}

// sagaKind is a kind of saga the process drives besides the transfers':
// those pending in the view (by id, with when each last progressed), the
// prefix that makes an id a key of p.retry, what names an id in the log, and
// how one is driven to its end.
type sagaKind struct {
	pending map[string]time.Time
	prefix  string
	what    string
	drive   func(ctx context.Context, id string) (pending bool, err error)
}

// sagaID names one saga the process drives: its id, its key in p.retry, and
// what names the id in the log.
type sagaID struct{ id, retryKey, what string }

// sweepSagas drives the sagas of kind k idle for the grace period,
// forgetting those found done.
func (p *Process) sweepSagas(ctx context.Context, st *SweepStats, now time.Time, k sagaKind) {
	for _, id := range slices.Sorted(maps.Keys(k.pending)) {
		if ctx.Err() != nil {
			break
		}
		sid := sagaID{id: id, retryKey: k.prefix + id, what: k.what}
		if now.Sub(k.pending[id]) < p.opts.Grace || now.Before(p.retry[sid.retryKey].next) {
			continue
		}
		if p.resume(st, now, sid, func() (bool, error) {
			pending, err := k.drive(ctx, id)
			return !pending, err
		}) {
			delete(k.pending, id)
		}
	}
}

// resume drives one saga (sid) and reports whether it is decided; a failure is counted and retried later,
// with a growing delay.
func (p *Process) resume(st *SweepStats, now time.Time, sid sagaID, drive func() (decided bool, err error)) bool {
	decided, err := drive()
	if err != nil {
		st.Errors++
		r := p.retry[sid.retryKey]
		r.failures++
		r.next = now.Add(min(time.Second<<min(r.failures-1, 16), maxRetryDelay))
		p.retry[sid.retryKey] = r
		p.log.Warn("resuming a saga failed", sid.what, sid.id, "failures", r.failures, "err", err)
		return false
	}
	delete(p.retry, sid.retryKey)
	st.Resumed++
	return decided
}

// checkpointData is the payload of a checkpoint event.
type checkpointData struct {
	Version int         `json:"version"`
	View    processView `json:"view"`
}

// loadLocked restores the view from the last checkpoint, once.
func (p *Process) loadLocked(ctx context.Context) error {
	if p.loaded {
		return nil
	}
	evs, err := p.store.ReadStream(ctx, p.opts.CheckpointStream, eventstore.EndOfStream, eventstore.Backwards, 1)
	if errors.Is(err, eventstore.ErrStreamNotFound) || (err == nil && len(evs) == 0) {
		p.view, p.cpRev, p.loaded = newView(), -1, true
		return nil
	}
	if err != nil {
		return err
	}
	m, err := domain.DecodeMetadata(evs[0].Metadata)
	var cp checkpointData
	if err == nil {
		err = json.Unmarshal(evs[0].Data, &cp)
	}
	if err != nil || evs[0].Type != EvProcessCheckpoint || cp.Version != 1 {
		// Unreadable (another version, damage): rebuild the view from the start of
		// "all", which is always correct, and checkpoint after the last one.
		p.log.Warn("checkpoint unreadable, rebuilding the view from the start", "stream", evs[0].Stream, "revision", evs[0].Revision, "type", evs[0].Type, "err", err)
		p.view, p.cpRev, p.cpChain, p.cpPos, p.loaded = newView(), int64(evs[0].Revision), m.Chain, eventstore.Start, true
		return nil
	}
	if cp.View.Transfers == nil {
		cp.View.Transfers = map[string]*pendingTransfer{}
	}
	if cp.View.Holds == nil {
		cp.View.Holds = map[string]*expiringHold{}
	}
	if cp.View.Transactions == nil { // a checkpoint written before reservation sagas
		cp.View.Transactions = map[string]time.Time{}
	}
	if cp.View.Captures == nil { // a checkpoint written before capture sagas
		cp.View.Captures = map[string]time.Time{}
	}
	p.view, p.cpRev, p.cpChain, p.cpPos, p.loaded = cp.View, int64(evs[0].Revision), m.Chain, cp.View.Position, true
	return nil
}

// checkpointLocked writes the view when it has moved since the last checkpoint.
// Failing to write one is logged, not returned: the previous one stays valid.
func (p *Process) checkpointLocked(ctx context.Context) {
	if !p.loaded || p.view.Position.Compare(p.cpPos) <= 0 {
		return
	}
	now := p.svc.opts.Clock().UTC()
	data, err := json.Marshal(checkpointData{Version: 1, View: p.view})
	if err != nil {
		p.log.Error("encoding the checkpoint", "err", err)
		return
	}
	if len(data) > p.opts.MaxCheckpointBytes {
		p.log.Warn("view too large to checkpoint; the previous checkpoint stays", "bytes", len(data), "limit", p.opts.MaxCheckpointBytes)
		p.cpAt = time.Now()
		return
	}
	stream, rev := p.opts.CheckpointStream, uint64(p.cpRev+1)
	key := stream + ":" + strconv.FormatUint(rev, 10) // unique per checkpoint, as is its event ID
	id := domain.EventID(key, stream, 0)
	m := domain.Metadata{Key: key, Command: "process_checkpoint", Count: 1, At: now, Producer: p.svc.opts.Producer, Schema: 1}
	m.Chain = domain.ChainHash(p.cpChain, domain.StoredEvent{ID: id, Stream: stream, Revision: rev, Type: EvProcessCheckpoint, Data: data, Metadata: m})
	meta, err := json.Marshal(m)
	if err != nil {
		p.log.Error("encoding the checkpoint", "err", err)
		return
	}
	_, err = p.store.Append(ctx, stream, eventstore.ExactOrNoStream(p.cpRev), []eventstore.EventData{{ID: id, Type: EvProcessCheckpoint, Data: data, Metadata: meta}})
	p.cpAt = time.Now()
	if errors.Is(err, eventstore.ErrWrongExpectedRevision) {
		// Another instance checkpointed: learn its head and write next time.
		if evs, rerr := p.store.ReadStream(ctx, stream, eventstore.EndOfStream, eventstore.Backwards, 1); rerr == nil && len(evs) == 1 {
			if hm, merr := domain.DecodeMetadata(evs[0].Metadata); merr == nil {
				p.cpRev, p.cpChain = int64(evs[0].Revision), hm.Chain
			}
		}
		return
	}
	if err != nil {
		p.log.Warn("writing the checkpoint failed", "err", err)
		return
	}
	p.cpRev, p.cpChain, p.cpPos = int64(rev), m.Chain, p.view.Position
}

// ExpireHold releases a hold whose expiry has come, with the derived key
// StepKey(placingKey, "expire") and the time at (a controllable clock in tests).
// done reports that nothing is left to do: the hold is released now or was
// already captured, released or expired; false means it is not due at at.
func (s *Service) ExpireHold(ctx context.Context, accountID, holdID, placingKey string, at time.Time) (done bool, err error) {
	cmd := domain.Command{
		Type: domain.CmdExpireHold, IdempotencyKey: domain.StepKey(placingKey, domain.StepExpire),
		AccountID: accountID, HoldID: holdID, At: at.UTC(), Origin: placingKey,
	}
	stream := domain.AccountStream(accountID)
	ans, err := s.decideOnAccount(ctx, cmd, stream, accountID, false)
	rec, r := ans.rec, ans.r
	switch {
	case err != nil:
		return false, err
	case rec != nil:
		return true, nil
	case r.Code == domain.CodeIdempotencyKeyConflict || r.Status == domain.StatusInvalid:
		return false, fmt.Errorf("ledger: expiring hold %s on %s: %s: %s", holdID, accountID, r.Code, r.Message)
	}
	// Refused without a record: done unless the hold is still active.
	var settled bool
	err = s.whenSettled(ctx, stream, func() error {
		acc, err := s.loadAccount(ctx, stream, accountID, true)
		if err == nil {
			h := acc.Holds[holdID]
			settled = h == nil || h.Status != domain.HoldStatusActive
		}
		return err
	})
	return settled, err
}
