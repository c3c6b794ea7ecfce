package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// The atomic mover (mover.go), for a store that appends to several streams in
// one write. A transaction (PROTOCOL.md v1.1 §2.1, domain/transaction.go) is
// one decision over every account it touches, appended as one atomic write of
// the key's claim, the transaction stream's event and every account's legs,
// each stream with its expected revision; a transfer and each refund of it a
// saga decided at once (openSaga); a capture into an account the capture and
// the credit in one append. The write's own stream's lock is taken first (a
// transaction's, a transfer's), and whether it was decided already read under
// it alone; then the accounts' locks, in sorted order (withAccountLocks;
// nothing locks an account and then such a stream, so no cycle). One account
// is pipelined (loadAccounts: the hot one, decided on its pending state, its
// lock given up while the write commits, as for a command of its own); every
// other one is decided on durable state, its appends in flight waited for
// first and its lock held until the write resolves.

// atomicMover moves money over several accounts in one append.
type atomicMover struct{ s *Service }

// transaction decides a post_transaction command in one append.
func (m atomicMover) transaction(ctx context.Context, cmd domain.Command) (Reply, error) {
	s, req := m.s, cmd.Canonical()
	txStream := domain.TransactionStream(cmd.TransactionID)
	return s.underLocks(ctx, []string{txStream}, func(at *attempt) (r Reply, retry bool, err error) {
		if r, done, err := s.decidedTransaction(ctx, txStream, cmd, req, at.n); err != nil || done {
			return r, false, err
		}
		err = s.withAccountLocks(ctx, domain.TransactionAccounts(cmd.Postings), func(l *heldLocks) (err error) {
			r, retry, err = s.tryTransaction(ctx, l, at.n, cmd, req, txStream)
			return err
		})
		return r, retry, err
	})
}

// withAccountLocks runs f under the locks of the accounts ids, taken in sorted
// order (heldLocks), and releases them. The caller holds the lock of the
// write's own stream (a transaction's, a transfer's), taken first: the
// accounts' locks are held only while the write is decided and appended, not
// while the stream is read.
func (s *Service) withAccountLocks(ctx context.Context, ids []string, f func(l *heldLocks) error) error {
	streams := make([]string, len(ids))
	for i, id := range ids {
		streams[i] = domain.AccountStream(id)
	}
	slices.Sort(streams)
	l := &heldLocks{s: s, streams: streams}
	if err := l.lock(ctx); err != nil {
		return err
	}
	defer l.unlock()
	return f(l)
}

// tryTransaction is attempt n (0 first) at a transaction tx (a
// post_transaction, or a refund shaped as one) whose client request is req,
// under the locks l of its accounts: it decides on their states (loadAccounts:
// one pipelined, the others durable; on the store's head after the first
// attempt) and appends. retry is set when another instance wrote one of the
// streams (decide again).
func (s *Service) tryTransaction(ctx context.Context, l *heldLocks, n int, tx domain.Command, req domain.Canonical, txStream string) (r Reply, retry bool, err error) {
	// The first attempt decides on the cache; a refusal without record, or a
	// write that found other events, on the store's head.
	accs, hot, err := s.loadAccounts(ctx, l, tx.IdempotencyKey, domain.TransactionAccounts(tx.Postings), n > 0)
	if err != nil {
		return Reply{}, false, err
	}
	d := domain.DecideTransaction(accs, tx)
	if d.Invalid != nil {
		return reply.Invalid(tx.IdempotencyKey, d.Invalid), false, nil
	}
	if d.Rejection != nil && !d.Rejection.Recorded {
		if n == 0 {
			return Reply{}, true, nil
		}
		return reply.TransactionNotRecorded(tx.IdempotencyKey, tx.TransactionID, d.Rejection, d.Posting), false, nil
	}
	r, err = s.appendTransaction(ctx, l, tx, req, txStream, accs, hot, d)
	if refused, answered, retry, err := refusedAppend(tx.IdempotencyKey, err); answered || retry || err != nil {
		return refused, retry, err
	}
	return r, false, nil
}

// refundTransaction refunds a posted transaction in one append
// (Service.refundTransaction).
func (m atomicMover) refundTransaction(ctx context.Context, cmd domain.Command, req domain.Canonical, origStream string, posted *domain.TransactionPosted) (Reply, error) {
	s := m.s
	return s.underLocks(ctx, []string{origStream}, func(at *attempt) (r Reply, retry bool, err error) {
		slot, refunded, r, done, err := refundSlot(ctx, s.readTransaction, posted.TransactionID, cmd, req)
		if err != nil || done {
			return r, false, err
		}
		tx, rej := domain.RefundOfTransaction(posted, cmd, refunded)
		if rej != nil {
			return reply.NotRecorded(cmd.IdempotencyKey, rej), false, nil
		}
		tx.TransactionID = domain.RefundTransactionID(posted.TransactionID, slot)
		err = s.withAccountLocks(ctx, domain.TransactionAccounts(tx.Postings), func(l *heldLocks) (err error) {
			r, retry, err = s.tryTransaction(ctx, l, at.n, tx, req, domain.TransactionStream(tx.TransactionID))
			return err
		})
		return r, retry, err
	})
}

// appendTransaction writes a decided transaction: the key's claim, the
// transaction stream's event and, when posted, every account's legs, in one
// append (pipelined on hot, when not nil); then folds the legs into the cached
// aggregates.
func (s *Service) appendTransaction(ctx context.Context, l *heldLocks, cmd domain.Command, req domain.Canonical, txStream string, accs map[string]*domain.Account, hot *hotLeg, d domain.TransactionDecision) (Reply, error) {
	claim, err := s.claimPart(cmd, req, txStream, 0)
	if err != nil {
		return Reply{}, err
	}
	txData, txMetas, err := s.encodeEvents(cmd, req, cmd.IdempotencyKey, txStream, 0, "", []domain.NewEvent{d.Event})
	if err != nil {
		return Reply{}, err
	}
	parts := []eventstore.StreamAppend{claim, {Stream: txStream, Expected: eventstore.NoStream, Events: txData}}
	var legs []*accountStep
	for _, id := range domain.TransactionAccounts(cmd.Postings) {
		if len(d.Legs[id]) == 0 {
			continue
		}
		leg := &accountStep{acc: accs[id], cmd: domain.TransactionLegCommand(cmd, id), events: d.Legs[id]}
		part, err := s.encodeStep(leg)
		if err != nil {
			return Reply{}, err
		}
		parts = append(parts, part)
		legs = append(legs, leg)
	}
	if len(legs) == 0 {
		// A refusal writes no account, yet it was decided on what they held:
		// the append asserts every account's revision, so that one decided on
		// a cache another instance has moved past, or on a view torn by
		// another transaction, is decided again rather than recorded forever.
		for _, id := range domain.TransactionAccounts(cmd.Postings) {
			parts = append(parts, eventstore.StreamAppend{Stream: domain.AccountStream(id), Expected: eventstore.ExactOrNoStream(accs[id].Revision)})
		}
	}
	res, err := s.appendSteps(ctx, l, cmd.IdempotencyKey, parts, 2, legs, hot)
	if err != nil {
		return Reply{}, s.claimError(ctx, claim.Stream, req, err)
	}
	if anyIdempotent(res) {
		return Reply{}, fmt.Errorf("%w: transaction %s was written meanwhile", eventstore.ErrWrongExpectedRevision, cmd.TransactionID)
	}
	w := writtenFrom(txStream, res[1], txData, txMetas, []domain.NewEvent{d.Event})
	payload := domain.TransactionPayload(d.Event.Data)
	return transactionReply(&w.events[0], payload, false)
}

// captureTo decides a capture_hold with `to` (v1.1): the capture on the
// held account and the credit of what it captures to `to`, in one append with
// the key's claim, or a refusal of both recorded on the held account. The reply
// is the held account's, as for any capture; the credit is in `to`'s stream
// under StepKey(key, StepCaptureTo). A store that cannot append to several
// streams at once runs it as a capture saga (capturesaga.go).
func (m atomicMover) captureTo(ctx context.Context, cmd domain.Command) (Reply, error) {
	s := m.s
	held, to := domain.AccountStream(cmd.AccountID), domain.AccountStream(cmd.To)
	streams := []string{held, to}
	slices.Sort(streams)
	req := cmd.Canonical()
	return s.underLocks(ctx, streams, func(at *attempt) (Reply, bool, error) {
		accs, hot, err := s.loadAccounts(ctx, at.locks, cmd.IdempotencyKey, []string{cmd.AccountID, cmd.To}, at.n > 0)
		if err != nil {
			return Reply{}, false, err
		}
		a, b := accs[cmd.AccountID], accs[cmd.To]
		switch err := s.recallHold(ctx, held, a, cmd.HoldID); {
		case errors.Is(err, domain.ErrRecallUnsettled): // once the held account's appends settle, on the store's head
			return Reply{}, true, s.settleBeforeDecidingAgain(ctx, at.locks, held)
		case err != nil:
			return Reply{}, false, err
		}
		if ans, err := s.answerKnownKey(ctx, &accountWrite{cmd: cmd, req: req, stream: held, acc: a}, true); err != nil || ans.known() {
			return ans.reply(), false, err
		}
		capture, credit := domain.DecideCaptureTo(a, b, cmd)
		switch {
		case capture.Invalid != nil:
			return reply.Invalid(cmd.IdempotencyKey, capture.Invalid), false, nil
		case len(capture.Events) == 0:
			if at.n == 0 {
				return Reply{}, true, nil // decided on the cache: once more on the store's head
			}
			return reply.NotRecorded(cmd.IdempotencyKey, capture.Rejection), false, nil
		}
		err = s.appendCaptureTo(ctx, at.locks, cmd, req, a, b, hot, capture.Events, credit.Events)
		if r, answered, retry, err := refusedAppend(cmd.IdempotencyKey, err); answered || retry || err != nil {
			return r, retry, err
		}
		return ownedRecordReply(copyRecord(a.Keys[cmd.IdempotencyKey]), false), false, nil
	})
}

// appendCaptureTo writes the claim, the held account's events and, when the
// capture applies, the credit to `to`, in one append (pipelined on hot, when
// not nil), and folds them.
func (s *Service) appendCaptureTo(ctx context.Context, l *heldLocks, cmd domain.Command, req domain.Canonical, a, b *domain.Account, hot *hotLeg, capture, credit []domain.NewEvent) error {
	held := domain.AccountStream(a.ID)
	claim, err := s.claimPart(cmd, req, held, uint64(a.Revision+1))
	if err != nil {
		return err
	}
	steps := []*accountStep{{acc: a, cmd: cmd, events: capture}}
	if len(credit) > 0 {
		steps = append(steps, &accountStep{acc: b, cmd: domain.CaptureCreditCommand(cmd), events: credit})
	}
	parts := []eventstore.StreamAppend{claim}
	for _, st := range steps {
		part, err := s.encodeStep(st)
		if err != nil {
			return err
		}
		parts = append(parts, part)
	}
	res, err := s.appendSteps(ctx, l, cmd.IdempotencyKey, parts, 1, steps, hot)
	switch {
	case err != nil:
		return s.claimError(ctx, claim.Stream, req, err)
	case anyIdempotent(res):
		return fmt.Errorf("%w: capture %s was written meanwhile", eventstore.ErrWrongExpectedRevision, cmd.IdempotencyKey)
	}
	return nil
}

// openSaga decides a saga of a transfer stream (a new transfer, or a
// refund of a completed one) on a store with atomic multi-stream appends
// (PROTOCOL.md v1.1 §2.1): the request opens it; both its accounts' steps (the
// saga's: a refund debits the transfer's destination and credits its source)
// are decided on their cached states (their store's heads when o.fresh; a
// pipelined account on its pending state) and written with the request, its claim
// and the saga's marker in one append, so that it is completed or rejected,
// never debited and credited back. It writes exactly the events the saga
// writes on its way to the same decision (a credit the account credited would
// refuse is recorded as the debit's refusal, with that account's code), so
// that every reader of transfer streams (replay, audit, read models, the
// transfer process) meets nothing new. The caller holds the transfer stream's
// lock; next is again when another instance wrote meanwhile (decide again).
func (m atomicMover) openSaga(ctx context.Context, cmd domain.Command, req domain.Canonical, o sagaOpening) (transferStep, error) {
	s, t := m.s, o.t
	rq, err := s.openSagaRequest(cmd, req, domain.TransferStream(t.ID), t, o.requested)
	if err != nil {
		return transferStep{}, err
	}
	rq.fresh = o.fresh
	var written bool
	var r Reply
	err = s.withAccountLocks(ctx, []string{rq.sg.Out, rq.sg.In}, func(l *heldLocks) (err error) {
		written, r, err = s.decideTransferAtomically(ctx, l, cmd, req, rq)
		return err
	})
	switch {
	case err != nil:
		return transferStep{}, err
	case !written && r.Status == "":
		return transferStep{next: again}, nil
	case !written:
		return transferStep{r: r}, nil
	}
	// The reply is the saga's, its steps' records those just written: read
	// again, they would wait for a hot account's appends to settle.
	r, err = s.sagaReply(ctx, t, cmd.IdempotencyKey, false, rq.records)
	return transferStep{r: r}, err
}

// sagaRequest is the request of a saga decided at once, encoded at the head
// of its transfer stream, and the saga it opens.
type sagaRequest struct {
	stream  string
	t       *domain.Transfer // the cached transfer it was decided on
	scratch *domain.Transfer // a copy of t with the request folded in
	sg      *domain.Saga     // the saga the request opens, in scratch
	events  []domain.NewEvent
	data    []eventstore.EventData
	metas   []domain.Metadata
	// records are the steps' key records once written, copied under the
	// accounts' locks: step key -> record.
	records map[string]*domain.KeyRecord
	fresh   bool // decide on the accounts' heads in the store (sagaOpening)
}

// openSagaRequest encodes the request events of cmd at the head of t and folds
// them into a copy of t: the saga as the request opens it.
func (s *Service) openSagaRequest(cmd domain.Command, req domain.Canonical, stream string, t *domain.Transfer, requested []domain.NewEvent) (*sagaRequest, error) {
	first := uint64(t.Revision + 1)
	data, metas, err := s.encodeEvents(cmd, req, cmd.IdempotencyKey, stream, first, t.LastChain, requested)
	if err != nil {
		return nil, err
	}
	rq := &sagaRequest{stream: stream, t: t, scratch: t.Clone(), events: requested, data: data, metas: metas}
	for _, ev := range writtenFrom(stream, eventstore.AppendResult{FirstRevision: first}, data, metas, requested).events {
		if err := domain.EvolveTransfer(rq.scratch, ev); err != nil {
			return nil, err
		}
	}
	sg, ok := rq.scratch.SagaOf(cmd.IdempotencyKey)
	if !ok {
		return nil, fmt.Errorf("ledger: %s: the request opened no saga", stream)
	}
	rq.sg = sg
	return rq, nil
}

// decideTransferAtomically is atomicMover.openSaga under the accounts' locks:
// wrote reports an append; otherwise r is the answer (a refusal not recorded,
// a conflict) or empty (decide again, on the store's heads). A decision on
// the cache is checked by the append (every account's revision); a missing
// account, which would answer without a record, is looked for in the store
// before it is answered.
func (s *Service) decideTransferAtomically(ctx context.Context, l *heldLocks, cmd domain.Command, req domain.Canonical, rq *sagaRequest) (wrote bool, r Reply, err error) {
	accs, hot, err := s.loadAccounts(ctx, l, cmd.IdempotencyKey, []string{rq.sg.Out, rq.sg.In}, rq.fresh)
	if err != nil {
		return false, Reply{}, err
	}
	for _, id := range []string{rq.sg.Out, rq.sg.In} {
		switch {
		case accs[id].Opened:
		case !rq.fresh:
			return false, Reply{}, nil // opened by another instance, maybe: decide again on the store's heads
		default:
			return false, reply.NotRecorded(cmd.IdempotencyKey, domain.MissingAccount(id)), nil
		}
	}
	d, err := domain.DecideTransferAtomically(rq.scratch, rq.sg, accs[rq.sg.Out], accs[rq.sg.In], cmd.At)
	if err != nil {
		return false, Reply{}, err
	}
	if d.Invalid != nil {
		return false, reply.Invalid(cmd.IdempotencyKey, d.Invalid), nil
	}
	return s.appendTransferAtomically(ctx, l, cmd, req, rq, accs, hot, d)
}

// accountStep is one account's part of an atomic write: its command, decided
// events and their encoding.
type accountStep struct {
	acc    *domain.Account
	cmd    domain.Command
	events []domain.NewEvent
	data   []eventstore.EventData
	metas  []domain.Metadata
}

// encodeStep encodes an account's step of an atomic write at the account's next
// revision, and returns its part, expecting the revision the step was decided on.
func (s *Service) encodeStep(st *accountStep) (eventstore.StreamAppend, error) {
	stream := domain.AccountStream(st.acc.ID)
	var err error
	st.data, st.metas, err = s.encodeEvents(st.cmd, st.cmd.Canonical(), st.cmd.IdempotencyKey, stream, uint64(st.acc.Revision+1), st.acc.LastChain, st.events)
	return eventstore.StreamAppend{Stream: stream, Expected: eventstore.ExactOrNoStream(st.acc.Revision), Events: st.data}, err
}

// appendSteps appends parts in one write whose account steps are
// parts[first:first+len(steps)], pipelined on hot when it is not nil (appendHot;
// key is the client's), and folds each step into its cached aggregate. A hot
// account without a step has its revision asserted, after the steps, so that
// the write follows the appends its decision was taken on.
func (s *Service) appendSteps(ctx context.Context, l *heldLocks, key string, parts []eventstore.StreamAppend, first int, steps []*accountStep, hot *hotLeg) ([]eventstore.AppendResult, error) {
	fold := func(res []eventstore.AppendResult) error {
		for i, st := range steps {
			stream := domain.AccountStream(st.acc.ID)
			if hot != nil && stream == hot.stream {
				continue // folded before the write
			}
			if err := s.applyWritten(ctx, stream, st.acc, writtenFrom(stream, res[first+i], st.data, st.metas, st.events)); err != nil {
				return err
			}
			s.tookCommand(stream, st.acc, st.acc.Revision) // drained: durable
		}
		return nil
	}
	if hot == nil {
		res, err := s.appendParts(ctx, parts)
		if err != nil || anyIdempotent(res) {
			return res, err
		}
		return res, fold(res)
	}
	hot.key = key
	for _, st := range steps {
		if stream := domain.AccountStream(st.acc.ID); stream == hot.stream {
			hot.w = writtenFrom(stream, eventstore.AppendResult{FirstRevision: uint64(st.acc.Revision + 1)}, st.data, st.metas, st.events)
		}
	}
	if partOf(parts, hot.stream) < 0 {
		at := first + len(steps)
		parts = slices.Insert(parts, at, eventstore.StreamAppend{Stream: hot.stream, Expected: eventstore.ExactOrNoStream(hot.acc.Revision)})
	}
	res, err := s.appendHot(ctx, l, parts, *hot, fold)
	if err != nil || anyIdempotent(res) {
		return res, err
	}
	if n := len(hot.w.events); n > 0 {
		s.tookCommand(hot.stream, hot.acc, int64(hot.w.events[n-1].Revision))
	}
	return res, nil
}

// loadAccounts loads the accounts of a decision over several (ids, their
// streams locked by l) of the client's key, on the store's head when refresh.
// First, as for a command of one account, it waits (the locks released) while
// the key's own append is in flight on one of them, or a stale pipeline
// drains: a resend is never decided, nor answered, on a pending state.
// On a store that group-commits, one of them is pipelined (hot; nil
// elsewhere): the one with appends in flight, else the one most callers hold
// or wait for. It is decided on its pending state, and its lock given up
// while the write commits, so a hot account takes the commands that follow as
// it takes any other's. Every other one is drained first (its appends in
// flight waited for, its lock held so that no new one starts) and decided on
// durable state: a write joins one pipeline chain at most.
func (s *Service) loadAccounts(ctx context.Context, l *heldLocks, key string, ids []string, refresh bool) (map[string]*domain.Account, *hotLeg, error) {
	for i := 0; i < len(ids); i++ {
		if wait := s.pipes.wait(domain.AccountStream(ids[i]), key); wait != nil {
			if err := l.waitFor(ctx, wait); err != nil {
				return nil, nil, err
			}
			i = -1 // the locks were released: look again
		}
	}
	hotStream := s.pickHot(ids)
	accs := make(map[string]*domain.Account, len(ids))
	var hot *hotLeg
	for _, id := range ids {
		stream := domain.AccountStream(id)
		if stream != hotStream || !s.pipes.flowing(stream) {
			if err := s.drain(ctx, stream); err != nil {
				return nil, nil, err
			}
		}
		acc, chain, err := s.loadPending(ctx, stream, id, refresh)
		if err != nil {
			return nil, nil, err
		}
		accs[id] = acc
		if stream == hotStream {
			hot = &hotLeg{stream: stream, acc: acc, chain: chain}
		}
	}
	return accs, hot, nil
}

// pickHot names the stream among ids' a write over several accounts is
// pipelined on: one with appends in flight, else the one the most callers hold
// or wait for; "" on a store that does not group-commit.
func (s *Service) pickHot(ids []string) string {
	if s.batch == nil {
		return ""
	}
	best, most := "", -1
	for _, id := range ids {
		stream := domain.AccountStream(id)
		n := s.locks.waiting(stream)
		if s.pipes.flowing(stream) {
			n += 1 << 30
		}
		if n > most {
			best, most = stream, n
		}
	}
	return best
}

// appendTransferAtomically writes a saga decided at once, in the order the
// saga writes it (request, steps, marker: readers of "all" rely on it), with
// the key's claim, in one append; then folds it into the cached aggregates.
func (s *Service) appendTransferAtomically(ctx context.Context, l *heldLocks, cmd domain.Command, req domain.Canonical, rq *sagaRequest, accs map[string]*domain.Account, hot *hotLeg, d domain.AtomicTransfer) (bool, Reply, error) {
	stream, t, first := rq.stream, rq.t, uint64(rq.t.Revision+1)
	markerCmd := domain.Command{Type: rq.sg.Command, IdempotencyKey: d.MarkerKey, At: cmd.At, EffectiveAt: cmd.EffectiveAt, Origin: rq.sg.Key}
	markerData, markerMetas, err := s.encodeEvents(markerCmd, req, d.MarkerKey, stream, first+uint64(len(rq.data)), rq.metas[len(rq.metas)-1].Chain, d.Marker)
	if err != nil {
		return false, Reply{}, err
	}
	claim, err := s.claimPart(cmd, req, stream, first)
	if err != nil {
		return false, Reply{}, err
	}
	steps := []*accountStep{{acc: accs[rq.sg.Out], cmd: d.DebitCmd, events: d.Debit.Events}}
	if len(d.Credit.Events) > 0 {
		steps = append(steps, &accountStep{acc: accs[rq.sg.In], cmd: d.CreditCmd, events: d.Credit.Events})
	}
	parts := []eventstore.StreamAppend{claim, {Stream: stream, Expected: eventstore.ExactOrNoStream(t.Revision), Events: rq.data}}
	for _, st := range steps {
		part, err := s.encodeStep(st)
		if err != nil {
			return false, Reply{}, err
		}
		parts = append(parts, part)
	}
	if len(steps) == 1 {
		// A refusal writes nothing to the credited account, yet the credit's
		// refusal (closed, overflow) was decided on it: its revision is asserted,
		// so that a decision on a stale cache is taken again, not recorded.
		parts = append(parts, eventstore.StreamAppend{Stream: domain.AccountStream(rq.sg.In), Expected: eventstore.ExactOrNoStream(accs[rq.sg.In].Revision)})
	}
	parts = append(parts, eventstore.StreamAppend{Stream: stream, Expected: eventstore.Exact(uint64(t.Revision + int64(len(rq.data)))), Events: markerData})
	res, err := s.appendSteps(ctx, l, cmd.IdempotencyKey, parts, 2, steps, hot)
	if err != nil {
		r, _, _, err := refusedAppend(cmd.IdempotencyKey, s.claimError(ctx, claim.Stream, req, err))
		return false, r, err // answered (a conflict), or to decide again
	}
	if anyIdempotent(res) {
		return false, Reply{}, nil
	}
	rq.records = map[string]*domain.KeyRecord{}
	for _, st := range steps {
		if rec := st.acc.Keys[st.cmd.IdempotencyKey]; rec != nil {
			rq.records[st.cmd.IdempotencyKey] = &copyRecord(rec).KeyRecord
		}
	}
	for _, w := range []written{
		writtenFrom(stream, res[1], rq.data, rq.metas, rq.events),
		writtenFrom(stream, res[len(res)-1], markerData, markerMetas, d.Marker),
	} {
		if err := s.applyTransferWritten(ctx, stream, t, w); err != nil {
			return false, Reply{}, err
		}
	}
	return true, Reply{}, nil
}

// captureInFlight: a capture decided in one append is never in flight.
func (atomicMover) captureInFlight(context.Context, string, *domain.KeyClaimed) (bool, error) {
	return false, nil
}
