package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Transfers and refunds of transfers are sagas (ARCHITECTURE decision 6, layout in
// domain/transfer.go), decided at once where the store appends to several streams
// in one write (atomicMover.openSaga). Elsewhere the handler writes the request to
// the transfer stream with the claim of its key, then runs the steps inline: each
// step is an account command with a key derived from the saga's, so running it
// again answers from the account's record; each outcome is recorded in the
// transfer stream by a marker appended at the exact revision it was decided on. A
// crash anywhere leaves a state from which driveSaga, run again by a retry of the
// client or by the transfer process (process.go), goes on to the same decision.
//
// Lock order: a transfer stream's lock is taken before an account stream's; a saga
// holds at most one account lock at a time, a decision at once both, sorted, so
// neither can deadlock with account commands or with itself.

// loadTransfer returns the cached transfer caught up to the store's head when
// refresh is set or it is not cached; otherwise the cached one as is.
func (s *Service) loadTransfer(ctx context.Context, stream, id string, refresh bool) (*domain.Transfer, error) {
	t, ok := s.transfers.Get(stream)
	if ok && !refresh {
		return t, nil
	}
	if !ok {
		t = domain.NewTransfer(id)
	}
	if err := catchUp(ctx, s.store, stream, t.Revision, func(ev domain.StoredEvent) error { return domain.EvolveTransfer(t, ev) }); err != nil {
		s.transfers.Remove(stream)
		return nil, err
	}
	s.transfers.Add(stream, t)
	return t, nil
}

// transferReads reads the transfer a command is decided on (toDecide), as the
// store allows: every one with loadTransfer (readEveryTransfer), or, on a
// store that reports an idempotent append, new ones unread (unreadNewTransfers).
type transferReads interface {
	toDecide(ctx context.Context, w transferWrite, refresh bool) (transferRead, error)
}

// transferReadsFor is the transferReads the store allows.
func transferReadsFor(s *Service, store Store) transferReads {
	if reportsRepeats(store) {
		return unreadNewTransfers{s}
	}
	return readEveryTransfer{s}
}

// readEveryTransfer decides each command on its transfer as loadTransfer
// gives it (from the store when refresh).
type readEveryTransfer struct{ s *Service }

func (r readEveryTransfer) toDecide(ctx context.Context, w transferWrite, refresh bool) (transferRead, error) {
	t, err := r.s.loadTransfer(ctx, domain.TransferStream(w.id), w.id, refresh)
	return transferRead{t: t}, err
}

// unreadNewTransfers is readEveryTransfer, except that a transfer command
// whose stream is not cached is decided on a new transfer, unread: the stream
// of a new transfer does not exist, and reading it cost a statement per
// transfer (BENCHMARKS.md, the history import). decideOnTransfer decides again
// on the store's head when an unread decision would answer without a write,
// or its append finds its events already there (a resend after a restart or
// an eviction); a stream that exists otherwise fails the append's expected
// revision.
type unreadNewTransfers struct{ s *Service }

func (u unreadNewTransfers) toDecide(ctx context.Context, w transferWrite, refresh bool) (transferRead, error) {
	stream := domain.TransferStream(w.id)
	if refresh || w.cmd.Type != domain.CmdTransfer || u.s.transfers.Contains(stream) {
		return readEveryTransfer(u).toDecide(ctx, w, refresh)
	}
	t := domain.NewTransfer(w.id)
	u.s.transfers.Add(stream, t)
	return transferRead{t: t, unread: true}, nil
}

// transferRead is the transfer a command is decided on, and whether it is a
// new one assumed without a read of its stream (unreadNewTransfers).
type transferRead struct {
	t      *domain.Transfer
	unread bool
}

// applyTransferWritten folds freshly written events into the cached transfer, or
// catches up when the cache was behind.
func (s *Service) applyTransferWritten(ctx context.Context, stream string, t *domain.Transfer, w written) error {
	if len(w.events) > 0 && int64(w.events[0].Revision) != t.Revision+1 {
		_, err := s.loadTransfer(ctx, stream, t.ID, true)
		return err
	}
	for _, ev := range w.events {
		if err := domain.EvolveTransfer(t, ev); err != nil {
			s.transfers.Remove(stream)
			return err
		}
	}
	return nil
}

// fail calls the test failpoint, if any, with the name of the step just done:
// "transfer/" or "refund/" followed by "requested" (the request is written),
// "debit", "credit", "compensate" (an account step) or "reject", "complete",
// "refuse", "fail" (a marker).
func (s *Service) fail(step string) error {
	if s.failpoint == nil {
		return nil
	}
	return s.failpoint(step)
}

// handleTransfer decides a transfer: on a store with atomic multi-stream appends,
// as one decision over both accounts written in one append (atomicMover.openSaga);
// elsewhere the request is written with the claim of its key, then the saga
// runs to its decision, and the reply reports it.
func (s *Service) handleTransfer(ctx context.Context, cmd domain.Command) (Reply, error) {
	stream := domain.TransferStream(cmd.TransferID)
	req := cmd.Canonical()
	return s.decideOnTransfer(ctx, transferWrite{cmd: cmd, id: cmd.TransferID, failpoint: "transfer/requested"}, func(t *domain.Transfer, fresh, wrote bool) (transferStep, error) {
		if t.Requested {
			if t.Key() != cmd.IdempotencyKey {
				r, err := s.transferExists(ctx, cmd, req, t)
				return transferStep{r: r}, err
			}
			if r, ok := sagaConflict(t.Saga, req); !ok {
				return transferStep{r: r}, nil
			}
			if !t.Saga.Stage.Decided() && !wrote && !fresh {
				return transferStep{next: again}, nil // another instance may have gone on: start from the store
			}
			r, err := s.finishSaga(ctx, stream, cmd.TransferID, cmd.IdempotencyKey, wrote)
			return transferStep{r: r}, err
		}
		d := domain.DecideTransfer(t, cmd)
		switch {
		case len(d.Events) == 0:
			return transferStep{r: reply.NotRecorded(cmd.IdempotencyKey, d.Rejection)}, nil
		case d.Rejection != nil: // refused with its request (a transfer to itself)
			return transferStep{events: d.Events, next: appendThem}, nil
		}
		return s.mover.openSaga(ctx, cmd, req, sagaOpening{t: t, requested: d.Events, fresh: fresh})
	})
}

// transferNext is what a decision on a transfer stream asks of decideOnTransfer.
type transferNext uint8

const (
	answered   transferNext = iota // the reply is the answer
	again                          // decide again on the store's head
	cached                         // decide again on the cached state
	appendThem                     // append the events, fold them, and decide again
)

// transferWrite is a client command whose home is the transfer stream of
// transfer id, for decideOnTransfer: whether its first attempt reads the
// transfer from the store (refresh), and the failpoint after its request is
// written.
type transferWrite struct {
	cmd       domain.Command
	id        string
	refresh   bool
	failpoint string
}

// decideOnTransfer is the load-decide-append loop of w's command (through
// underLocks): it loads the transfer (from the store when w.refresh, or when
// the last attempt asked to), asks decide, appends the events it returns
// with the key's claim at the transfer's revision, and answers a key
// conflict or retries a concurrent write. decide learns whether the state is
// fresh from the store and whether this call already wrote the command's
// request.
func (s *Service) decideOnTransfer(ctx context.Context, w transferWrite, decide func(t *domain.Transfer, fresh, wrote bool) (transferStep, error)) (Reply, error) {
	cmd, id, refresh, failpoint := w.cmd, w.id, w.refresh, w.failpoint
	stream, req := domain.TransferStream(id), cmd.Canonical()
	wrote := false
	return s.underLocks(ctx, []string{stream}, func(*attempt) (Reply, bool, error) {
		read, err := s.transferReads.toDecide(ctx, w, refresh)
		t, unread := read.t, read.unread
		if err != nil {
			return Reply{}, false, err
		}
		step, err := decide(t, refresh, wrote)
		refresh = step.next == again
		if err == nil && unread && step.next == answered && t.Revision < 0 {
			refresh = true // answered with nothing written: the stream may exist
			return Reply{}, true, nil
		}
		if err != nil || step.next == answered {
			return step.r, false, err
		}
		if step.next != appendThem {
			return Reply{}, true, nil
		}
		res, err := s.appendDecision(ctx, decision{cmd: cmd, req: req, events: step.events}, streamHead{stream: stream, last: t.Revision, chain: t.LastChain})
		if o, err := refusedAppend(cmd.IdempotencyKey, err); o.decided() || err != nil {
			refresh = o.retry
			return o.r, o.retry, err
		}
		if repeat, err := s.repeats.foundAt(ctx, stream, res); err != nil || repeat {
			refresh = true // written before, not by this call: decide on what is there
			return Reply{}, err == nil, err
		}
		if err := s.applyTransferWritten(ctx, stream, t, res); err != nil {
			return Reply{}, false, err
		}
		wrote = true
		return Reply{}, true, s.fail(failpoint)
	})
}

// finishSaga drives the saga of key to its decision and answers it (a duplicate
// unless this call wrote its request).
func (s *Service) finishSaga(ctx context.Context, stream, transferID, key string, wrote bool) (Reply, error) {
	t, err := s.driveSaga(ctx, stream, transferID, key)
	if err != nil {
		return Reply{}, err
	}
	return s.sagaReply(ctx, t, key, !wrote, nil)
}

// sagaConflict answers a known saga key sent with another request.
func sagaConflict(sg *domain.Saga, req domain.Canonical) (Reply, bool) {
	if j, _ := domain.Judge(sg.DecidedFor(), req); j.Verdict == domain.KeyConflict { // kept: no read, no error
		return reply.Conflict(sg.Key, j.Fields), false
	}
	return Reply{}, true
}

// transferExists answers a transfer whose id belongs to another key's transfer;
// a key already bound to another request is a conflict first.
func (s *Service) transferExists(ctx context.Context, cmd domain.Command, req domain.Canonical, t *domain.Transfer) (Reply, error) {
	if v, err := s.judgeClaim(ctx, cmd.IdempotencyKey, req); err != nil || v.conflict.answered {
		return v.conflict.r, err
	}
	d := domain.DecideTransfer(t, cmd)
	return reply.NotRecorded(cmd.IdempotencyKey, d.Rejection), nil
}

// errStepNotRecorded is a saga step refused without a record. It cannot happen for
// accounts that exist (checked before the request is written, and accounts are
// never removed); going on would risk a decision that a later run contradicts, so
// the saga stays pending instead.
var errStepNotRecorded = errors.New("ledger: saga step refused without a record")

// driveSaga runs the saga of key in a transfer stream to its decision, from
// whatever state the stream is in. The caller holds the stream's lock.
func (s *Service) driveSaga(ctx context.Context, stream, transferID, key string) (*domain.Transfer, error) {
	refresh := false
	for conflicts := 0; conflicts < s.opts.MaxAttempts; {
		t, err := s.loadTransfer(ctx, stream, transferID, refresh)
		if err != nil {
			return nil, err
		}
		refresh = false
		sg, ok := t.SagaOf(key)
		if !ok {
			return nil, fmt.Errorf("ledger: %s: no saga of key %q", stream, key)
		}
		if sg.Stage.Decided() {
			return t, nil
		}
		step, err := s.runStageSteps(ctx, sagaAt{stream: stream, t: t, sg: sg})
		if err != nil {
			return nil, err
		}
		recorded, err := s.recordMarker(ctx, sagaAt{stream: stream, t: t, sg: step.sg}, step)
		if err != nil {
			return nil, err
		}
		if !recorded {
			conflicts++
			refresh = true // another instance went on: continue from what it recorded
		}
	}
	return nil, ErrTooManyConflicts
}

// runStageSteps runs the account steps that the stage of an undecided saga calls
// for: a pending saga's debit, and its credit once the debit applied; a
// compensating saga's compensation. It returns the last step run (stageStep).
func (s *Service) runStageSteps(ctx context.Context, at sagaAt) (stageStep, error) {
	t, sg := at.t, at.sg
	switch sg.Stage {
	case domain.SagaPending:
		o, err := s.runStep(ctx, t, sg, domain.StepDebit)
		if err != nil || !o.Applied {
			return stageStep{name: domain.StepDebit, sg: sg, o: o}, err
		}
		if sg, err = sg.Moving(o); err != nil {
			return stageStep{}, err
		}
		o, err = s.runStep(ctx, t, sg, domain.StepCredit)
		return stageStep{name: domain.StepCredit, sg: sg, o: o}, err
	case domain.SagaCompensating:
		o, err := s.runStep(ctx, t, sg, domain.StepCompensate)
		return stageStep{name: domain.StepCompensate, sg: sg, o: o}, err
	}
	return stageStep{}, fmt.Errorf("ledger: %s: saga %q at stage %s", at.stream, sg.Key, sg.Stage)
}

// sagaAt is a saga (sg) of the transfer stream whose state is t.
type sagaAt struct {
	stream string
	t      *domain.Transfer
	sg     *domain.Saga
}

// stageStep is the last account step a saga's stage ran: its name, the saga
// as its marker is decided on (of the amount the debit moved, for one with
// up_to: the debit's record fixed it once, and a debit run again answers it)
// and the step's outcome.
type stageStep struct {
	name string
	sg   *domain.Saga
	o    domain.StepOutcome
}

// runStep runs one account step of a saga, calls the failpoint after it and
// returns the step's recorded outcome.
func (s *Service) runStep(ctx context.Context, t *domain.Transfer, sg *domain.Saga, step string) (domain.StepOutcome, error) {
	rec, err := s.accountStep(ctx, t.StepCommand(sg, step, s.opts.Clock().UTC()))
	if err != nil {
		return domain.StepOutcome{}, err
	}
	moved, _ := rec.Moved()
	return domain.StepOutcome{Applied: rec.Status == domain.StatusApplied, Code: rec.Code, Message: rec.Message, Moved: moved}, s.fail(sagaFailpoint(sg, step))
}

// recordMarker decides the marker that the outcome of a saga's last step
// (at.sg is step's saga) calls for, appends it (appendMarker) and calls the failpoint after it; false
// when another instance wrote to the stream first, so the marker is not recorded.
func (s *Service) recordMarker(ctx context.Context, at sagaAt, step stageStep) (bool, error) {
	m, err := domain.DecideSagaMarker(at.t, at.sg, step.name, step.o)
	if err != nil {
		return false, err
	}
	err = s.appendMarker(ctx, at, m)
	if errors.Is(err, eventstore.ErrWrongExpectedRevision) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, s.fail(sagaFailpoint(at.sg, strings.TrimPrefix(m.Key, at.sg.Key+":")))
}

// sagaFailpoint is the failpoint name of step (see fail) in saga sg.
func sagaFailpoint(sg *domain.Saga, step string) string {
	if sg.Refund {
		return "refund/" + step
	}
	return "transfer/" + step
}

// accountStep runs a saga's account step cmd (a derived key on cmd.AccountID),
// or answers it again once run, and returns its record. A step refused without
// a record is an error: the saga stays pending.
func (s *Service) accountStep(ctx context.Context, cmd domain.Command) (*domain.KeyRecord, error) {
	ans, err := s.decideOnAccount(ctx, cmd, domain.AccountStream(cmd.AccountID), cmd.AccountID, false)
	rec, r := ans.rec, ans.r
	if err != nil {
		return nil, err
	}
	if r != nil {
		return nil, fmt.Errorf("%w: %s %q on %s: %s: %s", errStepNotRecorded, cmd.Type, cmd.IdempotencyKey, cmd.AccountID, r.Code, r.Message)
	}
	rc := rec.KeyRecord
	return &rc, nil
}

// stepWithFailpoint is accountStep, then the test failpoint named step.
func (s *Service) stepWithFailpoint(ctx context.Context, cmd domain.Command, step string) (*domain.KeyRecord, error) {
	rec, err := s.accountStep(ctx, cmd)
	if err == nil {
		err = s.fail(step)
	}
	return rec, err
}

// appendMarker records a saga's progress in the transfer stream under the
// marker's derived key, at the revision the saga's state was read at.
func (s *Service) appendMarker(ctx context.Context, at sagaAt, m domain.SagaMarker) error {
	key, events := m.Key, m.Events
	if len(events) == 0 {
		return nil
	}
	stream, t, sg := at.stream, at.t, at.sg
	req, err := domain.ParseRequest(sg.Request)
	if err != nil {
		return fmt.Errorf("ledger: %s: request of %q: %w", stream, sg.Key, err)
	}
	cmd := domain.Command{Type: sg.Command, IdempotencyKey: key, At: s.opts.Clock().UTC(), Origin: sg.Key}
	w, err := s.appendStep(ctx, decision{cmd: cmd, req: req.Canonical(), events: events}, streamHead{stream: stream, last: t.Revision, chain: t.LastChain})
	if err != nil {
		return err
	}
	return s.applyTransferWritten(ctx, stream, t, w)
}

// stepRecord returns the record of a saga step in an account, or nil when the
// step never ran there. It writes nothing.
func (s *Service) stepRecord(ctx context.Context, accountID, key string) (*domain.KeyRecord, error) {
	stream := domain.AccountStream(accountID)
	var rec *domain.KeyRecord
	err := s.whenSettled(ctx, stream, func() error {
		for _, refresh := range []bool{false, true} {
			acc, err := s.loadAccount(ctx, stream, accountID, refresh)
			if err != nil {
				return err
			}
			r, err := s.keyRecord(ctx, stream, acc, key)
			if err != nil || r != nil {
				if r != nil {
					rec = &copyRecord(r).KeyRecord
				}
				return err
			}
		}
		return nil
	})
	return rec, err
}

// sagaReply is the reply of the decided saga of key (reply.FromSaga), its steps
// read from the accounts: from known (step key -> record) when the caller has
// them, as a saga decided at once does, else once the account has settled.
func (s *Service) sagaReply(ctx context.Context, t *domain.Transfer, key string, duplicate bool, known map[string]*domain.KeyRecord) (Reply, error) {
	sg, ok := t.SagaOf(key)
	if !ok || !sg.Stage.Decided() {
		return Reply{}, fmt.Errorf("ledger: transfer %s: saga %q is not decided", t.ID, key)
	}
	return reply.FromSaga(reply.SagaOf(t, sg), duplicate, func(account, stepKey string) (*reply.Step, error) {
		if rec, ok := known[stepKey]; ok {
			return reply.StepOf(rec), nil
		}
		rec, err := s.stepRecord(ctx, account, stepKey)
		return reply.StepOf(rec), err
	})
}

// refundTransfer refunds a transfer (orig is the claim of its key) in the
// transfer's stream: the refund is requested there with the claim of its own key,
// reserving its amount, and runs as a saga in the other direction; on a store
// with atomic multi-stream appends it is decided at once over both accounts
// and written in one append with its request (atomicMover.openSaga).
func (s *Service) refundTransfer(ctx context.Context, cmd domain.Command, orig *domain.KeyClaimed) (Reply, error) {
	stream := orig.Stream
	id := strings.TrimPrefix(stream, domain.TransferStreamPrefix)
	req := cmd.Canonical()
	// A refund starts from the store's head: the cache may miss this key's own
	// decision or the transfer's, made by another instance (one short read).
	return s.decideOnTransfer(ctx, transferWrite{cmd: cmd, id: id, refresh: true, failpoint: "refund/requested"}, func(t *domain.Transfer, fresh, wrote bool) (transferStep, error) {
		if sg, ok := t.SagaOf(cmd.IdempotencyKey); ok {
			if r, ok := sagaConflict(sg, req); !ok {
				return transferStep{r: r}, nil
			}
			r, err := s.finishSaga(ctx, stream, id, cmd.IdempotencyKey, wrote)
			return transferStep{r: r}, err
		}
		if t.Saga != nil && t.Saga.Key == cmd.OriginalKey && !t.Saga.Stage.Decided() {
			// A refund of a transfer in flight waits for its decision.
			_, err := s.driveSaga(ctx, stream, id, cmd.OriginalKey)
			return transferStep{next: cached}, err
		}
		d := domain.DecideTransferRefund(t, cmd)
		switch {
		case len(d.Events) == 0:
			return transferStep{r: reply.NotRecorded(cmd.IdempotencyKey, d.Rejection)}, nil
		case d.Rejection != nil: // refused with its request (over the limit)
			return transferStep{events: d.Events, next: appendThem}, nil
		}
		return s.mover.openSaga(ctx, cmd, req, sagaOpening{t: t, requested: d.Events, fresh: fresh}) // one decision, one append, as the transfer's
	})
}

// lookupTransfer answers query.command for a key whose home is a transfer stream:
// the transfer's own key or one of its refunds'. A saga still in flight is not
// decided yet: not found (the transfer process or a retry decides it).
func (s *Service) lookupTransfer(ctx context.Context, key string, c *domain.KeyClaimed) (*Reply, error) {
	stream := c.Stream
	unlock, err := s.locks.lock(ctx, stream)
	if err != nil {
		return nil, err
	}
	defer unlock()
	t, err := s.loadTransfer(ctx, stream, strings.TrimPrefix(stream, domain.TransferStreamPrefix), true)
	if err != nil {
		return nil, err
	}
	sg, ok := t.SagaOf(key)
	if !ok || !sg.Stage.Decided() {
		return nil, nil
	}
	return replyOf(s.sagaReply(ctx, t, key, false, nil))
}

// ResumeTransfer drives every saga of a transfer stream that was left undecided
// (by a crash, or a handler that gave up) to its decision. It returns how many
// sagas remain undecided (0 unless err is set).
func (s *Service) ResumeTransfer(ctx context.Context, transferID string) (pending int, err error) {
	stream := domain.TransferStream(transferID)
	unlock, err := s.locks.lock(ctx, stream)
	if err != nil {
		return 0, err
	}
	defer unlock()
	t, err := s.loadTransfer(ctx, stream, transferID, true)
	if err != nil {
		return 0, err
	}
	keys := t.Pending()
	for i, k := range keys {
		if t, err = s.driveSaga(ctx, stream, transferID, k); err != nil {
			return len(keys) - i, err
		}
	}
	return len(t.Pending()), nil
}
