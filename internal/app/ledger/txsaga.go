package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Reservation sagas (domain/txsaga.go): post_transaction, and the refund of a
// transaction, on a store that cannot append to several streams at once. The
// request is written to the transaction's stream with its key's claim; then
// every account is reserved, the outcome of the reservations recorded, and the
// legs posted or the reservations released, each step under a derived key;
// then the outcome. The handler runs the saga inline under the transaction
// stream's lock (never an account's: each step takes its own), and the
// transfer process finishes one left half-way by a crash (ResumeTransaction).

// handleTransactionSaga decides a post_transaction (or a refund shaped as one,
// tx, with the client's request req) on a store without multi-stream appends.
func (s *Service) handleTransactionSaga(ctx context.Context, tx domain.Command, req domain.Canonical) (Reply, error) {
	txStream := domain.TransactionStream(tx.TransactionID)
	return s.underLocks(ctx, []string{txStream}, func(*attempt) (Reply, bool, error) {
		ts, err := s.loadTransactionSaga(ctx, txStream, tx.TransactionID)
		if err != nil {
			return Reply{}, false, err
		}
		if ts.Revision >= 0 {
			if ts.Key != tx.IdempotencyKey {
				r, err := s.transactionExists(ctx, tx, req)
				return r, false, err
			}
			if j, err := domain.Judge(ts.DecidedFor(), req); err != nil || j.Verdict == domain.KeyConflict {
				return reply.Conflict(tx.IdempotencyKey, j.Fields), false, err
			}
			r, err := s.finishTransactionSaga(ctx, txStream, tx.TransactionID, true)
			return r, false, err
		}
		if o, err := s.missingAccount(ctx, tx); err != nil || o.answered {
			return o.r, false, err
		}
		requested := []domain.NewEvent{{Type: domain.EvTransactionRequested, Data: domain.TransactionRequested{
			TransactionID: tx.TransactionID, Postings: tx.Postings, Metadata: tx.Metadata,
		}}}
		res, err := s.appendDecision(ctx, decision{cmd: tx, req: req, events: requested}, streamHead{stream: txStream, last: -1})
		if o, err := refusedAppend(tx.IdempotencyKey, err); o.decided() || err != nil {
			return o.r, o.retry, err
		}
		if repeat, err := s.repeats.foundAt(ctx, txStream, res); err != nil || repeat {
			return Reply{}, err == nil, err // written before, not by this call: answered from the stream
		}
		if err := s.fail("transaction/requested"); err != nil {
			return Reply{}, false, err
		}
		r, err := s.finishTransactionSaga(ctx, txStream, tx.TransactionID, false)
		return r, false, err
	})
}

// missingAccount answers a transaction naming an account that does not exist:
// not recorded (PROTOCOL.md §3), at the first posting naming one; and one
// whose effective_at one of its accounts refuses: invalid. An account
// never disappears, so none can go missing once the request is written.
func (s *Service) missingAccount(ctx context.Context, tx domain.Command) (outcome, error) {
	for i, p := range tx.Postings {
		for _, id := range []string{p.From, p.To} {
			open, err := s.accountOpened(ctx, id)
			if err != nil {
				return outcome{}, err
			}
			if !open {
				rej := &domain.Rejection{Code: domain.CodeAccountNotFound, Message: fmt.Sprintf("posting %d: account %s does not exist", i, id)}
				return answer(reply.TransactionNotRecorded(tx.IdempotencyKey, tx.TransactionID, rej, i)), nil
			}
		}
	}
	if ierr, err := s.effectiveRefused(ctx, tx, domain.TransactionAccounts(tx.Postings)...); ierr != nil || err != nil {
		return answer(reply.Invalid(tx.IdempotencyKey, ierr)), err
	}
	return outcome{}, nil
}

// loadTransactionSaga folds a transaction stream (a few events: no cache).
func (s *Service) loadTransactionSaga(ctx context.Context, txStream, id string) (*domain.TransactionSaga, error) {
	ts := domain.NewTransactionSaga(id)
	evs, err := s.store.ReadStream(ctx, txStream, 0, eventstore.Forwards, 0)
	if errors.Is(err, eventstore.ErrStreamNotFound) {
		return ts, nil
	}
	if err != nil {
		return nil, err
	}
	for _, re := range evs {
		ev, err := toStored(re)
		if err != nil {
			return nil, err
		}
		if err := domain.EvolveTransactionSaga(ts, ev); err != nil {
			return nil, err
		}
	}
	return ts, nil
}

// finishTransactionSaga drives a saga to its outcome and answers it.
func (s *Service) finishTransactionSaga(ctx context.Context, txStream, id string, duplicate bool) (Reply, error) {
	ts, err := s.driveTransactionSaga(ctx, txStream, id)
	if err != nil {
		return Reply{}, err
	}
	payload, err := domain.DecodeEvent(ts.Outcome.Type, ts.Outcome.Data)
	if err != nil {
		return Reply{}, err
	}
	return transactionReply(ts.Outcome, payload, duplicate)
}

// ResumeTransaction drives a transaction's saga to its outcome, from whatever
// state its stream is in (the transfer process after a crash); pending is
// false once it has one.
func (s *Service) ResumeTransaction(ctx context.Context, id string) (pending bool, err error) {
	txStream := domain.TransactionStream(id)
	unlock, err := s.locks.lock(ctx, txStream)
	if err != nil {
		return true, err
	}
	defer unlock()
	ts, err := s.driveTransactionSaga(ctx, txStream, id)
	if err != nil {
		return true, err
	}
	return !ts.Decided(), nil
}

// driveTransactionSaga runs a saga's next steps until its outcome is written.
// The caller holds the transaction stream's lock; each step is idempotent, and
// each record in the stream is appended at the revision it was decided on, so
// another instance driving the same saga meets the same outcome.
func (s *Service) driveTransactionSaga(ctx context.Context, txStream, id string) (*domain.TransactionSaga, error) {
	for conflicts := 0; conflicts < s.opts.MaxAttempts; {
		ts, err := s.loadTransactionSaga(ctx, txStream, id)
		if err != nil {
			return nil, err
		}
		switch {
		case ts.Decided():
			return ts, nil
		case ts.Requested == nil:
			return nil, fmt.Errorf("ledger: %s: no request and no outcome", txStream)
		}
		rec, err := s.nextTransactionRecord(ctx, ts)
		if err != nil {
			return nil, err
		}
		err = s.appendTransactionRecord(ctx, txStream, ts, rec)
		if errors.Is(err, eventstore.ErrWrongExpectedRevision) {
			conflicts++ // another instance recorded it: read it
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := s.fail("transaction/" + rec.step); err != nil {
			return nil, err
		}
	}
	return nil, ErrTooManyConflicts
}

// txRecord is a record of a reservation saga in its transaction stream: its
// derived key, its step's name and its event.
type txRecord struct {
	key, step string
	ev        domain.NewEvent
}

// sagaRecord is the record of ts's step.
func sagaRecord(ts *domain.TransactionSaga, step string, ev domain.NewEvent) txRecord {
	return txRecord{key: domain.StepKey(ts.Key, step), step: step, ev: ev}
}

// nextTransactionRecord runs the account steps that come before the saga's
// next record, and returns that record: the reservations' outcome, or the
// outcome of the transaction after its legs or its releases.
func (s *Service) nextTransactionRecord(ctx context.Context, ts *domain.TransactionSaga) (txRecord, error) {
	switch {
	case !ts.Reserved && ts.Refused == nil:
		outcomes, err := s.reserveAll(ctx, ts)
		if err != nil {
			return txRecord{}, err
		}
		if refusal := ts.DecisiveRefusal(outcomes); refusal != nil {
			return sagaRecord(ts, domain.StepRefused, domain.NewEvent{Type: domain.EvTransactionReservationRefused, Data: *refusal}), nil
		}
		return sagaRecord(ts, domain.StepReserved, domain.NewEvent{Type: domain.EvTransactionReserved, Data: domain.TransactionReserved{TransactionID: ts.ID}}), nil
	case ts.Reserved:
		legs, views := map[string][]domain.EventRef{}, map[string]domain.AccountView{}
		for _, id := range ts.Accounts() {
			rec, err := s.runTransactionStep(ctx, ts, domain.StepLeg, id)
			if err != nil {
				return txRecord{}, err
			}
			legs[id], views[id] = rec.Events, rec.After()
		}
		return sagaRecord(ts, domain.StepPosted, ts.OutcomeEvent(legs, views)), nil
	default: // refused: release what was reserved (the reservations answer again, as duplicates)
		outcomes, err := s.reserveAll(ctx, ts)
		if err != nil {
			return txRecord{}, err
		}
		views := map[string]domain.AccountView{}
		for _, o := range outcomes {
			views[o.Account] = o.After
			if !o.Applied {
				continue
			}
			rec, err := s.runTransactionStep(ctx, ts, domain.StepRelease, o.Account)
			if err != nil {
				return txRecord{}, err
			}
			views[o.Account] = rec.After()
		}
		return sagaRecord(ts, domain.StepRejected, ts.OutcomeEvent(nil, views)), nil
	}
}

// reserveAll runs (or, once run, answers again) every account's reservation,
// in account order.
func (s *Service) reserveAll(ctx context.Context, ts *domain.TransactionSaga) ([]domain.ReservationOutcome, error) {
	var out []domain.ReservationOutcome
	for _, id := range ts.Accounts() {
		rec, err := s.runTransactionStep(ctx, ts, domain.StepReserve, id)
		if err != nil {
			return nil, err
		}
		o := domain.ReservationOutcome{Account: id, Applied: rec.Status == domain.StatusApplied, Code: rec.Code, Message: rec.Message, After: rec.After()}
		if !o.Applied { // which posting the refusal falls at depends on the overdraft limit, fixed when the account opened
			acc, err := s.loadAccount(ctx, domain.AccountStream(id), id, false)
			if err != nil {
				return nil, err
			}
			o.OverdraftLimit = acc.OverdraftLimit
		}
		out = append(out, o)
	}
	return out, nil
}

// runTransactionStep runs one account step of a saga and returns its record.
func (s *Service) runTransactionStep(ctx context.Context, ts *domain.TransactionSaga, step, account string) (*domain.KeyRecord, error) {
	return s.stepWithFailpoint(ctx, ts.StepCommand(step, account, s.opts.Clock().UTC()), "transaction/"+step+":"+account)
}

// appendTransactionRecord appends a record of the saga (a marker or its
// outcome) under its derived key, with the client's request and key as its
// origin, at the revision the saga was read at.
func (s *Service) appendTransactionRecord(ctx context.Context, txStream string, ts *domain.TransactionSaga, rec txRecord) error {
	req, err := domain.ParseRequest(ts.Request)
	if err != nil {
		return fmt.Errorf("ledger: %s: request of %q: %w", txStream, ts.Key, err)
	}
	cmd := domain.Command{Type: domain.CommandType(ts.Command), IdempotencyKey: rec.key, At: s.opts.Clock().UTC(), Origin: ts.Key}
	_, err = s.appendStep(ctx, decision{cmd: cmd, req: req.Canonical(), events: []domain.NewEvent{rec.ev}}, streamHead{stream: txStream, last: ts.Revision, chain: ts.LastChain})
	return err
}

// transaction decides a post_transaction as a reservation saga.
func (m sagaMover) transaction(ctx context.Context, cmd domain.Command) (Reply, error) {
	return m.s.handleTransactionSaga(ctx, cmd, cmd.Canonical())
}

// refundTransaction refunds a posted transaction (whose stream is
// origStream) as a reservation saga of its own in the original's next free
// refund slot, as refundTransaction does in one append: slots are taken in
// order (the original's lock in this process, the slot's "no stream" across
// instances), a slot still running is driven to its outcome first, and what
// the posted ones moved is what was refunded.
func (m sagaMover) refundTransaction(ctx context.Context, cmd domain.Command, req domain.Canonical, origStream string, posted *domain.TransactionPosted) (Reply, error) {
	s := m.s
	return s.underLocks(ctx, []string{origStream}, func(*attempt) (Reply, bool, error) {
		refunded := int64(0)
		for slot := 0; ; slot++ {
			id := domain.RefundTransactionID(posted.TransactionID, slot)
			ts, err := s.settledTransactionSaga(ctx, id)
			if err != nil {
				return Reply{}, false, err
			}
			if ts.Revision < 0 { // the next free slot
				tx, rej := domain.RefundOfTransaction(posted, cmd, refunded)
				if rej != nil {
					return reply.NotRecorded(cmd.IdempotencyKey, rej), false, nil
				}
				tx.TransactionID = id
				r, err := s.handleTransactionSaga(ctx, tx, req)
				if err == nil && r.Code == domain.CodeTransactionExists && r.Status != domain.StatusApplied {
					return Reply{}, true, nil // another instance took the slot: look again
				}
				return r, false, err
			}
			payload, err := domain.DecodeEvent(ts.Outcome.Type, ts.Outcome.Data)
			if err != nil {
				return Reply{}, false, err
			}
			if ts.Key == cmd.IdempotencyKey {
				if j, err := domain.Judge(ts.DecidedFor(), req); err != nil || j.Verdict == domain.KeyConflict {
					return reply.Conflict(cmd.IdempotencyKey, j.Fields), false, err
				}
				r, err := transactionReply(ts.Outcome, payload, true)
				return r, false, err
			}
			refunded += domain.SlotRefunded(payload)
		}
	})
}

// settledTransactionSaga reads a transaction's saga, driven to its outcome
// first when it is still running (under its stream's lock).
func (s *Service) settledTransactionSaga(ctx context.Context, id string) (*domain.TransactionSaga, error) {
	txStream := domain.TransactionStream(id)
	ts, err := s.loadTransactionSaga(ctx, txStream, id)
	if err != nil || ts.Revision < 0 || ts.Decided() {
		return ts, err
	}
	unlock, err := s.locks.lock(ctx, txStream)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return s.driveTransactionSaga(ctx, txStream, id)
}
