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
	return s.underLocks(ctx, []string{txStream}, func(at *attempt) (Reply, bool, error) {
		if o, err := s.decidedTransaction(ctx, txStream, cmd, req, at.n); err != nil || o.answered {
			return o.r, false, err
		}
		o, err := s.transactionUnderLocks(ctx, newMultiWrite(cmd, req, at.n > 0), txStream)
		return o.r, o.retry, err
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

// tryTransaction is an attempt at w's transaction (w.cmd: a
// post_transaction, or a refund shaped as one; w.req the client's request)
// under the locks of its accounts: it decides on their states (loadAccounts:
// one pipelined, the others durable; on the store's head after the first
// attempt) and appends; retry when another instance wrote one of the
// streams (decide again).
func (s *Service) tryTransaction(ctx context.Context, w *multiWrite, txStream string) (outcome, error) {
	tx := w.cmd
	// The first attempt decides on the cache; a refusal without record, or a
	// write that found other events, on the store's head.
	if err := s.loadAccounts(ctx, &w.lockedAccounts, domain.TransactionAccounts(tx.Postings)); err != nil {
		return outcome{}, err
	}
	d := domain.DecideTransaction(w.accs, tx)
	if d.Invalid != nil {
		return answer(reply.Invalid(tx.IdempotencyKey, d.Invalid)), nil
	}
	if d.Rejection != nil && !d.Rejection.Recorded {
		if !w.refresh {
			return outcome{retry: true}, nil
		}
		return answer(reply.TransactionNotRecorded(tx.IdempotencyKey, tx.TransactionID, d.Rejection, d.Posting)), nil
	}
	r, err := s.appendTransaction(ctx, w, txStream, d)
	if o, err := refusedAppend(tx.IdempotencyKey, err); o.decided() || err != nil {
		return o, err
	}
	return answer(r), nil
}

// transactionUnderLocks is tryTransaction under the locks of the accounts
// of w's transaction, taken for it (withAccountLocks).
func (s *Service) transactionUnderLocks(ctx context.Context, w *multiWrite, txStream string) (o outcome, err error) {
	err = s.withAccountLocks(ctx, domain.TransactionAccounts(w.cmd.Postings), func(l *heldLocks) (err error) {
		w.l = l
		o, err = s.tryTransaction(ctx, w, txStream)
		return err
	})
	return o, err
}

// refundTransaction refunds a posted transaction in one append
// (Service.refundTransaction).
func (m atomicMover) refundTransaction(ctx context.Context, cmd domain.Command, req domain.Canonical, origStream string, posted *domain.TransactionPosted) (Reply, error) {
	s := m.s
	return s.underLocks(ctx, []string{origStream}, func(at *attempt) (Reply, bool, error) {
		slot, err := refundSlot(ctx, s.readTransaction, posted.TransactionID, cmd, req)
		if err != nil {
			return Reply{}, false, err
		}
		if slot.answer != nil {
			return *slot.answer, false, nil
		}
		tx, rej := domain.RefundOfTransaction(posted, cmd, slot.refunded)
		if rej != nil {
			return reply.NotRecorded(cmd.IdempotencyKey, rej), false, nil
		}
		tx.TransactionID = domain.RefundTransactionID(posted.TransactionID, slot.slot)
		o, err := s.transactionUnderLocks(ctx, newMultiWrite(tx, req, at.n > 0), domain.TransactionStream(tx.TransactionID))
		return o.r, o.retry, err
	})
}

// appendTransaction writes a decided transaction: the key's claim, the
// transaction stream's event and, when posted, every account's legs, in one
// append (pipelined on hot, when not nil); then folds the legs into the cached
// aggregates.
func (s *Service) appendTransaction(ctx context.Context, w *multiWrite, txStream string, d domain.TransactionDecision) (Reply, error) {
	cmd := w.cmd
	claim, err := mustBeNew(s.claimPart(cmd, w.req, txStream, 0))
	if err != nil {
		return Reply{}, err
	}
	txe, err := s.encodeEvents(decision{cmd: cmd, req: w.req, events: []domain.NewEvent{d.Event}}, streamHead{stream: txStream, last: -1})
	if err != nil {
		return Reply{}, err
	}
	p := atomicParts{parts: []eventstore.StreamAppend{claim, txe.part(eventstore.NoStream)}, first: 2}
	for _, id := range domain.TransactionAccounts(cmd.Postings) {
		if len(d.Legs[id]) == 0 {
			continue
		}
		if err := s.addStep(&p, &accountStep{acc: w.accs[id], cmd: domain.TransactionLegCommand(cmd, id), events: d.Legs[id]}); err != nil {
			return Reply{}, err
		}
	}
	if len(p.steps) == 0 {
		// A refusal writes no account, yet it was decided on what they held:
		// the append asserts every account's revision, so that one decided on
		// a cache another instance has moved past, or on a view torn by
		// another transaction, is decided again rather than recorded forever.
		for _, id := range domain.TransactionAccounts(cmd.Postings) {
			p.parts = append(p.parts, eventstore.StreamAppend{Stream: domain.AccountStream(id), Expected: eventstore.ExactOrNoStream(w.accs[id].Revision)})
		}
	}
	res, err := s.appendSteps(ctx, &w.lockedAccounts, p)
	if err != nil {
		return Reply{}, s.claimError(ctx, claim.Stream, w.req, err)
	}
	if anyIdempotent(res) {
		return Reply{}, fmt.Errorf("%w: transaction %s was written meanwhile", eventstore.ErrWrongExpectedRevision, cmd.TransactionID)
	}
	tw := txe.written(res[1])
	return transactionReply(&tw.events[0], domain.TransactionPayload(d.Event.Data), false)
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
		w := newMultiWrite(cmd, req, at.n > 0)
		w.l = at.locks
		if err := s.loadAccounts(ctx, &w.lockedAccounts, []string{cmd.AccountID, cmd.To}); err != nil {
			return Reply{}, false, err
		}
		a, b := w.accs[cmd.AccountID], w.accs[cmd.To]
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
		rec, err := s.appendCaptureTo(ctx, w, capture.Events, credit.Events)
		if o, err := refusedAppend(cmd.IdempotencyKey, err); o.decided() || err != nil {
			return o.r, o.retry, err
		}
		if rec == nil {
			return Reply{}, false, fmt.Errorf("ledger: %s: key %q not found after its own append", held, cmd.IdempotencyKey)
		}
		return ownedRecordReply(rec, false), false, nil
	})
}

// appendCaptureTo writes the claim, the held account's events and, when the
// capture applies, the credit to `to`, in one append (pipelined on hot, when
// not nil), and folds them: the record of the key on the held account, as
// folded. w's accounts are the held one's and `to`'s.
func (s *Service) appendCaptureTo(ctx context.Context, w *multiWrite, capture, credit []domain.NewEvent) (*ownedRecord, error) {
	cmd := w.cmd
	a := w.accs[cmd.AccountID]
	claim, err := mustBeNew(s.claimPart(cmd, w.req, domain.AccountStream(a.ID), uint64(a.Revision+1)))
	if err != nil {
		return nil, err
	}
	p := atomicParts{parts: []eventstore.StreamAppend{claim}, first: 1}
	steps := []*accountStep{{acc: a, cmd: cmd, events: capture}}
	if len(credit) > 0 {
		steps = append(steps, &accountStep{acc: w.accs[cmd.To], cmd: domain.CaptureCreditCommand(cmd), events: credit})
	}
	for _, st := range steps {
		if err := s.addStep(&p, st); err != nil {
			return nil, err
		}
	}
	res, err := s.appendSteps(ctx, &w.lockedAccounts, p)
	switch {
	case err != nil:
		return nil, s.claimError(ctx, claim.Stream, w.req, err)
	case anyIdempotent(res):
		return nil, fmt.Errorf("%w: capture %s was written meanwhile", eventstore.ErrWrongExpectedRevision, cmd.IdempotencyKey)
	}
	return steps[0].rec, nil
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
	w := newMultiWrite(cmd, req, o.fresh)
	var decided outcome
	err = s.withAccountLocks(ctx, []string{rq.sg.Out, rq.sg.In}, func(l *heldLocks) (err error) {
		w.l = l
		decided, err = s.decideTransferAtomically(ctx, w, rq)
		return err
	})
	switch {
	case err != nil:
		return transferStep{}, err
	case decided.retry:
		return transferStep{next: again}, nil
	case decided.answered:
		return transferStep{r: decided.r}, nil
	}
	// The reply is the saga's, its steps' records those just written: read
	// again, they would wait for a hot account's appends to settle.
	r, err := s.sagaReply(ctx, t, cmd.IdempotencyKey, false, rq.records)
	return transferStep{r: r}, err
}

// sagaRequest is the request of a saga decided at once, encoded at the head
// of its transfer stream, and the saga it opens.
type sagaRequest struct {
	stream  string
	t       *domain.Transfer // the cached transfer it was decided on
	scratch *domain.Transfer // a copy of t with the request folded in
	sg      *domain.Saga     // the saga the request opens, in scratch
	enc     encoded          // the request's events, at the head of t
	// records are the steps' key records once written, copied under the
	// accounts' locks: step key -> record.
	records map[string]*domain.KeyRecord
}

// openSagaRequest encodes the request events of cmd at the head of t and folds
// them into a copy of t: the saga as the request opens it.
func (s *Service) openSagaRequest(cmd domain.Command, req domain.Canonical, stream string, t *domain.Transfer, requested []domain.NewEvent) (*sagaRequest, error) {
	e, err := s.encodeEvents(decision{cmd: cmd, req: req, events: requested}, streamHead{stream: stream, last: t.Revision, chain: t.LastChain})
	if err != nil {
		return nil, err
	}
	rq := &sagaRequest{stream: stream, t: t, scratch: t.Clone(), enc: e}
	for _, ev := range e.pending().events {
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

// decideTransferAtomically is atomicMover.openSaga under the accounts' locks
// (w's, on the store's heads when w.refresh): the answer (a refusal not
// recorded, a conflict), or to decide again; neither when the saga was
// written (rq.records). A decision on
// the cache is checked by the append (every account's revision); a missing
// account, which would answer without a record, is looked for in the store
// before it is answered.
func (s *Service) decideTransferAtomically(ctx context.Context, w *multiWrite, rq *sagaRequest) (outcome, error) {
	key := w.cmd.IdempotencyKey
	if err := s.loadAccounts(ctx, &w.lockedAccounts, []string{rq.sg.Out, rq.sg.In}); err != nil {
		return outcome{}, err
	}
	for _, id := range []string{rq.sg.Out, rq.sg.In} {
		switch {
		case w.accs[id].Opened:
		case !w.refresh:
			return outcome{retry: true}, nil // opened by another instance, maybe: decide again on the store's heads
		default:
			return answer(reply.NotRecorded(key, domain.MissingAccount(id))), nil
		}
	}
	d, err := domain.DecideTransferAtomically(rq.scratch, rq.sg, w.accs[rq.sg.Out], w.accs[rq.sg.In], w.cmd.At)
	if err != nil {
		return outcome{}, err
	}
	if d.Invalid != nil {
		return answer(reply.Invalid(key, d.Invalid)), nil
	}
	return s.appendTransferAtomically(ctx, w, rq, d)
}

// accountStep is one account's part of an atomic write: its command, decided
// events and their encoding; once written (appendSteps), the record of its
// command's key as the write folded it.
type accountStep struct {
	acc    *domain.Account
	cmd    domain.Command
	events []domain.NewEvent
	enc    encoded
	rec    *ownedRecord
}

// encodeStep encodes an account's step of an atomic write at the account's next
// revision, and returns its part, expecting the revision the step was decided on.
func (s *Service) encodeStep(st *accountStep) (eventstore.StreamAppend, error) {
	var err error
	st.enc, err = s.encodeEvents(decision{cmd: st.cmd, req: st.cmd.Canonical(), events: st.events}, streamHead{stream: domain.AccountStream(st.acc.ID), last: st.acc.Revision, chain: st.acc.LastChain})
	return st.enc.part(eventstore.ExactOrNoStream(st.acc.Revision)), err
}

// appendSteps appends p in one write, pipelined on w's hot account when it
// has one (appendHot; w.key is the client's), and folds each step into its
// cached aggregate, keeping the record of its key as folded (accountStep.rec):
// the one home of a step's answer after its own append. Every lock is given up
// once the write commits (finishHot), so an aggregate read after may have
// forgotten the key (Account.KeyLimit) to the commands that folded meanwhile
// (TestCaptureToOnTwoHotAccountsWithFewKeys). A hot account without a step has
// its revision asserted, after the steps, so that the write follows the
// appends its decision was taken on.
func (s *Service) appendSteps(ctx context.Context, w *lockedAccounts, p atomicParts) ([]eventstore.AppendResult, error) {
	hot, parts := w.hot, p.parts
	fold := func(res []eventstore.AppendResult) error {
		for i, st := range p.steps {
			stream := domain.AccountStream(st.acc.ID)
			if hot != nil && stream == hot.stream {
				continue // folded before the write
			}
			if err := s.applyWritten(ctx, stream, st.acc, st.enc.written(res[p.first+i])); err != nil {
				return err
			}
			if rec := st.acc.Keys[st.cmd.IdempotencyKey]; rec != nil {
				st.rec = copyRecord(rec) // its lock still held
			}
			s.tookCommand(stream, st.acc, st.acc.Revision) // drained: durable
		}
		return nil
	}
	if hot == nil {
		res, err := s.appends.parts(ctx, parts)
		if err != nil || anyIdempotent(res) {
			return res, err
		}
		return res, fold(res)
	}
	hot.key = w.key
	var hotStep *accountStep
	for _, st := range p.steps {
		if stream := domain.AccountStream(st.acc.ID); stream == hot.stream {
			hot.w, hotStep = st.enc.pending(), st
		}
	}
	if partOf(parts, hot.stream) < 0 {
		at := p.first + len(p.steps)
		parts = slices.Insert(parts, at, eventstore.StreamAppend{Stream: hot.stream, Expected: eventstore.ExactOrNoStream(hot.acc.Revision)})
	}
	res, rec, err := s.appendHot(ctx, w.l, parts, *hot, fold)
	if err != nil || anyIdempotent(res) {
		return res, err
	}
	if hotStep != nil && rec != nil {
		hotStep.rec = copyRecord(rec) // as its write folded it, forgotten or not since
	}
	if n := len(hot.w.events); n > 0 {
		s.tookCommand(hot.stream, hot.acc, int64(hot.w.events[n-1].Revision))
	}
	return res, nil
}

// atomicParts is an atomic write's parts, the account steps among them at
// parts[first:first+len(steps)].
type atomicParts struct {
	parts []eventstore.StreamAppend
	first int
	steps []*accountStep
}

// addStep encodes st and adds it to p, after p's steps.
func (s *Service) addStep(p *atomicParts, st *accountStep) error {
	part, err := s.encodeStep(st)
	if err != nil {
		return err
	}
	p.parts = append(p.parts, part)
	p.steps = append(p.steps, st)
	return nil
}

// loadAccounts loads into w the accounts of a decision over several (ids,
// their streams locked by w.l) of the client's key, on the store's head when
// w.refresh.
// First, as for a command of one account, it waits (the locks released) for
// whatever each of them asks a decision to wait for (pipes.before): the key's
// own append in flight (a resend is never decided, nor answered, on a pending
// state), a stale pipeline draining, a reader settling the stream, or the key
// limit's bound on the appends in flight.
// On a store that group-commits, one of them is pipelined (hot; nil
// elsewhere): the one with appends in flight, else the one most callers hold
// or wait for. It is decided on its pending state, and its lock given up
// while the write commits, so a hot account takes the commands that follow as
// it takes any other's. Every other one is drained first (its appends in
// flight waited for, its lock held so that no new one starts) and decided on
// durable state: a write joins one pipeline chain at most. A command of a
// batch loaded on durable state while an earlier one of its batch is to be
// decided again returns earlierRefusedWait (Service.refusedBefore).
func (s *Service) loadAccounts(ctx context.Context, w *lockedAccounts, ids []string) error {
	for i := 0; i < len(ids); i++ {
		if wait := s.pipes.before(domain.AccountStream(ids[i]), w.key, s.keyLimit); wait != nil {
			if err := w.l.waitFor(ctx, wait); err != nil {
				return err
			}
			i = -1 // the locks were released: look again
		}
	}
	hotStream := s.appends.hot(ids)
	w.accs, w.hot = make(map[string]*domain.Account, len(ids)), nil
	for _, id := range ids {
		stream := domain.AccountStream(id)
		if stream != hotStream || !s.pipes.flowing(stream) {
			if err := s.drain(ctx, stream); err != nil {
				return err
			}
		}
		p, err := s.loadPending(ctx, stream, id, w.refresh)
		if err != nil {
			return err
		}
		if err := s.batchTurn(ctx); err != nil {
			return err
		}
		w.accs[id] = p.acc
		if stream == hotStream {
			w.hot = &hotLeg{stream: stream, acc: p.acc, chain: p.chain}
		}
	}
	return nil
}

// lockedAccounts is the accounts a write over several is decided on, under
// their locks (l), as loadAccounts loads them for the client's key: on the
// store's heads when refresh, one of them pipelined (hot) where the store
// group-commits.
type lockedAccounts struct {
	l       *heldLocks
	key     string
	refresh bool
	accs    map[string]*domain.Account
	hot     *hotLeg
}

// multiWrite is one attempt at a command over several accounts decided in
// one append: the command (the client's, or what its refund is shaped as),
// the client's request, and its accounts.
type multiWrite struct {
	lockedAccounts
	cmd domain.Command
	req domain.Canonical
}

// newMultiWrite is an attempt at cmd, on the store's heads when refresh; its
// locks are set once taken.
func newMultiWrite(cmd domain.Command, req domain.Canonical, refresh bool) *multiWrite {
	return &multiWrite{lockedAccounts: lockedAccounts{key: cmd.IdempotencyKey, refresh: refresh}, cmd: cmd, req: req}
}

// pickHot names the stream among ids' a write over several accounts is
// pipelined on: one with appends in flight, else the one the most callers hold
// or wait for (groupAppends.hot; a store that does not group-commit
// pipelines nothing).
func (s *Service) pickHot(ids []string) string {
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
func (s *Service) appendTransferAtomically(ctx context.Context, w *multiWrite, rq *sagaRequest, d domain.AtomicTransfer) (outcome, error) {
	cmd, stream, t := w.cmd, rq.stream, rq.t
	markerCmd := domain.Command{Type: rq.sg.Command, IdempotencyKey: d.MarkerKey, At: cmd.At, EffectiveAt: cmd.EffectiveAt, Origin: rq.sg.Key}
	marker, err := s.encodeEvents(decision{cmd: markerCmd, req: w.req, events: d.Marker}, streamHead{stream: stream, last: t.Revision + int64(len(rq.enc.data)), chain: rq.enc.lastChain()})
	if err != nil {
		return outcome{}, err
	}
	claim, err := mustBeNew(s.claimPart(cmd, w.req, stream, rq.enc.first))
	if err != nil {
		return outcome{}, err
	}
	p := atomicParts{parts: []eventstore.StreamAppend{claim, rq.enc.part(eventstore.ExactOrNoStream(t.Revision))}, first: 2}
	if err := s.addTransferSteps(&p, w, rq, d); err != nil {
		return outcome{}, err
	}
	p.parts = append(p.parts, marker.part(eventstore.Exact(uint64(t.Revision+int64(len(rq.enc.data))))))
	res, err := s.appendSteps(ctx, &w.lockedAccounts, p)
	if err != nil {
		o, err := refusedAppend(cmd.IdempotencyKey, s.claimError(ctx, claim.Stream, w.req, err))
		return o, err // answered (a conflict), or to decide again
	}
	if anyIdempotent(res) {
		return outcome{retry: true}, nil
	}
	rq.records = map[string]*domain.KeyRecord{}
	for _, st := range p.steps {
		if st.rec != nil {
			rq.records[st.cmd.IdempotencyKey] = &st.rec.KeyRecord
		}
	}
	for _, tw := range []written{rq.enc.written(res[1]), marker.written(res[len(res)-1])} {
		if err := s.applyTransferWritten(ctx, stream, t, tw); err != nil {
			return outcome{}, err
		}
	}
	return outcome{}, nil
}

// addTransferSteps adds to p the debit and, when it applies, the credit of
// a saga decided at once (d), or, when the credit is refused, the credited
// account's revision asserted.
func (s *Service) addTransferSteps(p *atomicParts, w *multiWrite, rq *sagaRequest, d domain.AtomicTransfer) error {
	if err := s.addStep(p, &accountStep{acc: w.accs[rq.sg.Out], cmd: d.DebitCmd, events: d.Debit.Events}); err != nil {
		return err
	}
	if len(d.Credit.Events) > 0 {
		return s.addStep(p, &accountStep{acc: w.accs[rq.sg.In], cmd: d.CreditCmd, events: d.Credit.Events})
	}
	// A refusal writes nothing to the credited account, yet the credit's
	// refusal (closed, overflow) was decided on it: its revision is asserted,
	// so that a decision on a stale cache is taken again, not recorded.
	p.parts = append(p.parts, eventstore.StreamAppend{Stream: domain.AccountStream(rq.sg.In), Expected: eventstore.ExactOrNoStream(w.accs[rq.sg.In].Revision)})
	return nil
}

// captureInFlight: a capture decided in one append is never in flight.
func (atomicMover) captureInFlight(context.Context, string, *domain.KeyClaimed) (bool, error) {
	return false, nil
}
