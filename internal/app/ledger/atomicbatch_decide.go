package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// An atomic batch decided under its locks (atomicbatch.go): its elements in
// order, each on the state the ones before it left, and its one append.

// batchOutcome is what a round of an atomic batch answers: r, a reply (a
// refusal recorded, a conflict of the batch's key); otherwise decided, an
// applied batch, whose elements' replies are read once its locks are released.
type batchOutcome struct {
	r       *Reply
	decided *domain.BatchDecided
	again   bool // another round, on the store's head
}

// batchDecision is one round of an atomic batch under its locks.
type batchDecision struct {
	s       *Service
	b       domain.Batch
	req     domain.Canonical
	prior   []*Reply
	origins []*refundOrigin // the originals of its refunds, by element (atomicbatch_refund.go)
	refresh bool            // decide on the store's head, not the caches

	accs map[string]*domain.Account // by account ID, as the elements decided so far leave them
	base map[string]int64           // each account's revision when loaded
	// transfers are copies of the transfers the batch reads, as its elements
	// leave them; baseTransfers their revisions when loaded.
	transfers     map[string]*domain.Transfer
	baseTransfers map[string]int64
	txs           map[string]written // the transaction streams the batch posts: their event
	seen          map[string]int     // an element's key -> the first element of that key
	folded        map[string]bool    // the account streams the elements were folded into
	// steps are the account steps written, by part: the key each folds.
	steps map[int]string
	// unclaimed are the key streams of the originals a refusal found missing.
	unclaimed []string
	parts     []eventstore.StreamAppend
	decided   domain.BatchDecided
}

// elementRefusal is the element that refuses a batch and its reply.
type elementRefusal struct {
	index int
	r     Reply
}

// errDecidedMeanwhile: an element's key, undecided when the round began
// (priorDecisions), was decided before the batch took its locks: the next
// round answers it as decided.
var errDecidedMeanwhile = errors.New("ledger: a command of the atomic batch was decided meanwhile")

// tryAtomicBatch is one round of an atomic batch: under the locks of its key,
// its transfer and transaction streams, then its accounts, it decides the
// elements and appends; out.again asks for another round, on the store's head.
func (s *Service) tryAtomicBatch(ctx context.Context, bd *batchDecision) (out batchOutcome, err error) {
	own, ids := batchStreams(bd.b.Commands, bd.origins)
	_, err = s.underLocks(ctx, append([]string{domain.KeyStream(bd.b.Key)}, own...), func(*attempt) (Reply, bool, error) {
		return Reply{}, false, s.withAccountLocks(ctx, ids, func(l *heldLocks) (err error) {
			out, err = bd.run(ctx, l, ids)
			return err
		})
	})
	return out, err
}

// batchStreams are the transfer and transaction streams an atomic batch's
// elements write (sorted), and the accounts they decide on; those of its
// refunds follow from their originals (origins).
func batchStreams(cmds []domain.BatchCommand, origins []*refundOrigin) (own, accounts []string) {
	own, accounts = refundStreams(origins)
	for _, c := range cmds {
		if c.Invalid != nil {
			continue
		}
		switch c.Type {
		case domain.CmdTransfer:
			own = append(own, domain.TransferStream(c.TransferID))
			accounts = append(accounts, c.From, c.To)
		case domain.CmdPostTransaction:
			own = append(own, domain.TransactionStream(c.TransactionID))
			accounts = append(accounts, domain.TransactionAccounts(c.Postings)...)
		case domain.CmdRefund:
		default:
			accounts = append(accounts, c.AccountID)
			if c.To != "" {
				accounts = append(accounts, c.To)
			}
		}
	}
	slices.Sort(own)
	slices.Sort(accounts)
	return slices.Compact(own), slices.Compact(accounts)
}

// run decides the batch on its accounts ids (their locks held by l) and
// appends it.
func (bd *batchDecision) run(ctx context.Context, l *heldLocks, ids []string) (batchOutcome, error) {
	settled := false
	defer func() {
		if !settled {
			bd.forget()
		}
	}()
	if err := bd.load(ctx, l, ids); err != nil {
		return batchOutcome{}, err
	}
	refused, err := bd.decideAll(ctx)
	if errors.Is(err, domain.ErrRecallUnsettled) || errors.Is(err, errDecidedMeanwhile) || errors.Is(err, errOriginInFlight) {
		return batchOutcome{again: true}, nil
	}
	if err != nil {
		return batchOutcome{}, err
	}
	parts, err := bd.record(refused)
	if err != nil {
		return batchOutcome{}, err
	}
	if err := bd.s.fail("batch/decided"); err != nil {
		return batchOutcome{}, err
	}
	res, err := bd.s.appends.parts(ctx, parts)
	if err != nil {
		o, err := refusedAppend(bd.b.Key, bd.s.claimError(ctx, parts[0].Stream, bd.req, err))
		if o.answered {
			return batchOutcome{r: &o.r}, nil
		}
		return batchOutcome{again: o.retry}, err
	}
	if res[0].Idempotent {
		// The batch's decision was there (another sender's): answered from
		// it. (The batch's decision and its elements' claims must be new,
		// so a store that honours MustBeNew refuses such an append instead.)
		return batchOutcome{again: true}, nil
	}
	if err := bd.s.fail("batch/appended"); err != nil { // applied or refused, decided
		return batchOutcome{}, err
	}
	if refused != nil {
		r := reply.AtomicRefused(bd.b.Key, bd.decided.Keys, refused.index, refused.r, false)
		return batchOutcome{r: &r}, nil
	}
	settled = true
	bd.settle(res)
	return batchOutcome{decided: &bd.decided}, nil
}

// load loads the batch's accounts (ids) under their locks, every one drained
// and decided on durable state: the batch is appended on its own, not
// pipelined behind other appends.
func (bd *batchDecision) load(ctx context.Context, l *heldLocks, ids []string) error {
	s := bd.s
	la := &lockedAccounts{l: l, key: bd.b.Key, refresh: bd.refresh}
	if err := s.loadAccounts(ctx, la, ids); err != nil {
		return err
	}
	accs, hot := la.accs, la.hot
	if hot != nil {
		if err := s.drain(ctx, hot.stream); err != nil {
			return err
		}
		p, err := s.loadPending(ctx, hot.stream, hot.acc.ID, bd.refresh)
		if err != nil {
			return err
		}
		accs[hot.acc.ID] = p.acc
	}
	bd.accs, bd.base = accs, make(map[string]int64, len(accs))
	for id, acc := range accs {
		bd.base[id] = acc.Revision
	}
	bd.transfers, bd.baseTransfers = map[string]*domain.Transfer{}, map[string]int64{}
	bd.txs, bd.seen, bd.folded, bd.steps = map[string]written{}, map[string]int{}, map[string]bool{}, map[int]string{}
	return nil
}

// settle keeps warm the cached aggregates the batch's elements were folded
// into once its append (res, by part) is durable, as the atomic path of a
// single command does (appendSteps): each step's key record takes the global
// position of its part, the one thing the fold could not know; and drops the
// transfers the batch read (it decided on copies of them).
func (bd *batchDecision) settle(res []eventstore.AppendResult) {
	for part, key := range bd.steps {
		acc := bd.accs[strings.TrimPrefix(bd.parts[part].Stream, domain.AccountStreamPrefix)]
		if rec := acc.Keys[key]; rec != nil {
			rec.Position = res[part+1].Position.String() // part 0 is the batch's decision
		}
	}
	for stream := range bd.folded {
		acc := bd.accs[strings.TrimPrefix(stream, domain.AccountStreamPrefix)]
		if cached, ok := bd.s.accounts.c.Peek(stream); ok && cached != acc {
			bd.s.accounts.c.Remove(stream) // not the state the batch folded into
		}
		bd.s.tookCommand(stream, acc, acc.Revision)
	}
	for stream := range bd.transfers {
		bd.s.transfers.Remove(stream)
	}
}

// forget drops from the caches what the batch folded its elements into (and
// the transfers it read) when it is not written: refused, or its append
// failed (the folds never happened).
func (bd *batchDecision) forget() {
	for stream := range bd.folded {
		bd.s.accounts.c.Remove(stream)
	}
	for stream := range bd.transfers {
		bd.s.transfers.Remove(stream)
	}
}

// decideAll decides the elements in order: nil when every one applies (or
// was applied before), else the first that refuses the batch.
func (bd *batchDecision) decideAll(ctx context.Context) (*elementRefusal, error) {
	for i, c := range bd.b.Commands {
		if c.Invalid != nil {
			return &elementRefusal{index: i, r: reply.Invalid(keyOf(c.Raw), c.Invalid)}, nil
		}
		if p := bd.prior[i]; p != nil {
			if p.Status != domain.StatusApplied {
				return &elementRefusal{index: i, r: *p}, nil
			}
			bd.decided.Duplicates = append(bd.decided.Duplicates, i)
			continue
		}
		key := c.IdempotencyKey
		if j, ok := bd.seen[key]; ok { // the key of an earlier element, which applied
			first := bd.b.Commands[j].Canonical()
			v, err := domain.Judge(&domain.Decided{Hash: first.Sum, Request: first.JSON}, c.Canonical())
			if err != nil || v.Verdict == domain.KeyConflict {
				return &elementRefusal{index: i, r: reply.Conflict(key, v.Fields)}, err
			}
			bd.decided.Duplicates = append(bd.decided.Duplicates, i)
			continue
		}
		bd.seen[key] = i
		r, err := bd.decide(ctx, i, c.Command)
		if err != nil || r != nil {
			return &elementRefusal{index: i, r: deref(r)}, err
		}
	}
	return nil, nil
}

// decide decides one element on the batch's states and adds its writes to
// the batch's: nil when it applies, else its refusal's reply.
func (bd *batchDecision) decide(ctx context.Context, i int, cmd domain.Command) (*Reply, error) {
	switch {
	case cmd.Type == domain.CmdTransfer:
		return bd.transfer(ctx, cmd)
	case cmd.Type == domain.CmdPostTransaction:
		return bd.transaction(ctx, cmd)
	case cmd.Type == domain.CmdRefund:
		return bd.refund(ctx, cmd, bd.origins[i])
	case cmd.Type == domain.CmdCaptureHold && cmd.To != "":
		return bd.captureTo(ctx, cmd)
	}
	return bd.onAccount(ctx, cmd, cmd.AccountID)
}

// onAccount decides a command of one account, id (decideOnAccount's decision).
func (bd *batchDecision) onAccount(ctx context.Context, cmd domain.Command, id string) (*Reply, error) {
	acc, stream := bd.accs[id], domain.AccountStream(id)
	if acc.Keys[cmd.IdempotencyKey] != nil {
		return nil, errDecidedMeanwhile
	}
	if err := bd.s.recallForgotten(ctx, stream, acc, cmd); err != nil {
		return nil, err
	}
	d := domain.DecideAccount(acc, cmd)
	if !d.Applied() || len(d.Events) == 0 {
		r := unwrittenReply(cmd, d)
		return &r, nil
	}
	if err := bd.claim(cmd, cmd.Canonical(), stream, uint64(acc.Revision+1)); err != nil {
		return nil, err
	}
	return nil, bd.step(cmd, acc, d.Events)
}

// captureTo decides a capture into an account (atomicMover.captureTo's
// decision): the capture and the credit.
func (bd *batchDecision) captureTo(ctx context.Context, cmd domain.Command) (*Reply, error) {
	a, b := bd.accs[cmd.AccountID], bd.accs[cmd.To]
	held := domain.AccountStream(a.ID)
	if a.Keys[cmd.IdempotencyKey] != nil {
		return nil, errDecidedMeanwhile
	}
	if err := bd.s.recallHold(ctx, held, a, cmd.HoldID); err != nil {
		return nil, err
	}
	capture, credit := domain.DecideCaptureTo(a, b, cmd)
	if !capture.Applied() || len(capture.Events) == 0 {
		r := unwrittenReply(cmd, capture)
		return &r, nil
	}
	if err := bd.claim(cmd, cmd.Canonical(), held, uint64(a.Revision+1)); err != nil {
		return nil, err
	}
	if err := bd.step(cmd, a, capture.Events); err != nil || len(credit.Events) == 0 {
		return nil, err
	}
	return nil, bd.step(domain.CaptureCreditCommand(cmd), b, credit.Events)
}

// transaction decides a post_transaction (the atomic mover's decision): the
// transaction stream's event and every account's legs.
func (bd *batchDecision) transaction(ctx context.Context, cmd domain.Command) (*Reply, error) {
	txStream := domain.TransactionStream(cmd.TransactionID)
	o, err := bd.readTransaction(ctx, txStream)
	switch {
	case err != nil:
		return nil, err
	case o != nil && domain.ClientKey(o.ev.Metadata) == cmd.IdempotencyKey:
		return nil, errDecidedMeanwhile // not the batch's: its keys are told apart by seen
	case o != nil:
		r, err := bd.s.transactionExists(ctx, cmd, cmd.Canonical())
		return &r, err
	}
	return bd.post(cmd, cmd.Canonical(), txStream)
}

// post decides a transaction tx (a post_transaction, or a refund shaped as
// one) whose client request is req, in txStream: its claim, the stream's
// event and every account's legs (appendTransaction's writes).
func (bd *batchDecision) post(tx domain.Command, req domain.Canonical, txStream string) (*Reply, error) {
	d := domain.DecideTransaction(bd.accs, tx)
	if d.Invalid != nil {
		r := reply.Invalid(tx.IdempotencyKey, d.Invalid)
		return &r, nil
	}
	if d.Rejection != nil {
		r := reply.TransactionNotRecorded(tx.IdempotencyKey, tx.TransactionID, d.Rejection, d.Posting)
		return &r, nil
	}
	if err := bd.claim(tx, req, txStream, 0); err != nil {
		return nil, err
	}
	e, err := bd.s.encodeEvents(decision{cmd: tx, req: req, events: []domain.NewEvent{d.Event}}, streamHead{stream: txStream, last: -1})
	if err != nil {
		return nil, err
	}
	bd.parts = append(bd.parts, e.part(eventstore.NoStream))
	bd.txs[txStream] = e.pending()
	for _, id := range domain.TransactionAccounts(tx.Postings) {
		if len(d.Legs[id]) > 0 {
			if err := bd.step(domain.TransactionLegCommand(tx, id), bd.accs[id], d.Legs[id]); err != nil {
				return nil, err
			}
		}
	}
	return nil, nil
}

// readTransaction is the outcome of a transaction stream as the batch leaves
// it: the one it posts, else the store's ("" names none: a refund's own slot,
// found only as it is decided).
func (bd *batchDecision) readTransaction(ctx context.Context, txStream string) (*txOutcome, error) {
	if w, ok := bd.txs[txStream]; ok {
		return &txOutcome{ev: w.events[0], payload: domain.TransactionPayload(w.payloads[0])}, nil
	}
	if txStream == "" {
		return nil, nil
	}
	return bd.s.readTransaction(ctx, txStream)
}

// transfer decides a transfer as atomicMover.openSaga does: its request, both
// accounts' steps and the saga's marker, in the order the saga writes them.
func (bd *batchDecision) transfer(ctx context.Context, cmd domain.Command) (*Reply, error) {
	s, req, stream := bd.s, cmd.Canonical(), domain.TransferStream(cmd.TransferID)
	t, err := bd.transferState(ctx, stream, cmd.TransferID)
	if err != nil {
		return nil, err
	}
	if _, ok := t.SagaOf(cmd.IdempotencyKey); ok {
		return nil, errDecidedMeanwhile
	}
	if t.Requested {
		r, err := s.transferExists(ctx, cmd, req, t)
		return &r, err
	}
	dt := domain.DecideTransfer(t, cmd)
	if len(dt.Events) == 0 || dt.Rejection != nil {
		r := reply.NotRecorded(cmd.IdempotencyKey, dt.Rejection)
		return &r, nil
	}
	return bd.atOnce(ctx, cmd, t, stream, dt.Events)
}

// atOnce decides a saga requested on t (a transfer, or a refund of one) by
// its request events as atomicMover.openSaga does: at once, on both accounts.
func (bd *batchDecision) atOnce(ctx context.Context, cmd domain.Command, t *domain.Transfer, stream string, requested []domain.NewEvent) (*Reply, error) {
	rq, err := bd.s.openSagaRequest(cmd, cmd.Canonical(), stream, t, requested)
	if err != nil {
		return nil, err
	}
	for _, id := range []string{rq.sg.Out, rq.sg.In} {
		if bd.accs[id] == nil {
			return nil, fmt.Errorf("ledger: atomic batch: account %q of %s is not locked", id, stream)
		}
		if !bd.accs[id].Opened {
			r := reply.NotRecorded(cmd.IdempotencyKey, domain.MissingAccount(id))
			return &r, nil
		}
	}
	at, err := domain.DecideTransferAtomically(rq.scratch, rq.sg, bd.accs[rq.sg.Out], bd.accs[rq.sg.In], cmd.At)
	if err != nil {
		return nil, err
	}
	if at.Invalid != nil {
		r := reply.Invalid(cmd.IdempotencyKey, at.Invalid)
		return &r, nil
	}
	if rej := at.Debit.Rejection; rej != nil {
		r := reply.NotRecorded(cmd.IdempotencyKey, rej)
		return &r, nil
	}
	return nil, bd.writeTransfer(cmd, rq, at)
}

// writeTransfer adds a transfer decided at once to the batch's writes
// (appendTransferAtomically's parts) and folds it into the batch's states.
func (bd *batchDecision) writeTransfer(cmd domain.Command, rq *sagaRequest, at domain.AtomicTransfer) error {
	stream, t := rq.stream, rq.t
	first := uint64(t.Revision + 1)
	if err := bd.claim(cmd, cmd.Canonical(), stream, first); err != nil {
		return err
	}
	bd.parts = append(bd.parts, rq.enc.part(eventstore.ExactOrNoStream(t.Revision)))
	if err := bd.step(at.DebitCmd, bd.accs[rq.sg.Out], at.Debit.Events); err != nil {
		return err
	}
	if len(at.Credit.Events) > 0 {
		if err := bd.step(at.CreditCmd, bd.accs[rq.sg.In], at.Credit.Events); err != nil {
			return err
		}
	}
	markerCmd := domain.Command{Type: rq.sg.Command, IdempotencyKey: at.MarkerKey, At: cmd.At, EffectiveAt: cmd.EffectiveAt, Origin: rq.sg.Key}
	marker, err := bd.s.encodeEvents(decision{cmd: markerCmd, req: cmd.Canonical(), events: at.Marker}, streamHead{stream: stream, last: int64(first) + int64(len(rq.enc.data)) - 1, chain: rq.enc.lastChain()})
	if err != nil {
		return err
	}
	bd.parts = append(bd.parts, marker.part(eventstore.Exact(marker.first-1)))
	for _, ev := range marker.pending().events {
		if err := domain.EvolveTransfer(rq.scratch, ev); err != nil {
			return err
		}
	}
	bd.transfers[stream] = rq.scratch
	return nil
}

// transferState is the transfer of stream as the batch's elements leave it: a
// copy of the cached one (on the store's head when the round refreshes).
func (bd *batchDecision) transferState(ctx context.Context, stream, id string) (*domain.Transfer, error) {
	if t, ok := bd.transfers[stream]; ok {
		return t, nil
	}
	t, err := bd.s.loadTransfer(ctx, stream, id, bd.refresh)
	if err != nil {
		return nil, err
	}
	bd.transfers[stream], bd.baseTransfers[stream] = t.Clone(), t.Revision
	return bd.transfers[stream], nil
}

// claim adds the claim of an element's key (cmd's, for its request req) for
// its decision in home, whose first event is written at revision first. It
// must be new (mustBeNew): an element decided before the batch is answered
// from its decision (priorDecisions, decideAll) and never claimed again, so a
// stored claim means the element was decided alone meanwhile, perhaps
// otherwise (a capture that one instance's clock finds expired); the batch
// is then decided again and answers it as a duplicate.
func (bd *batchDecision) claim(cmd domain.Command, req domain.Canonical, home string, first uint64) error {
	part, err := mustBeNew(bd.s.claimPart(cmd, req, home, first))
	bd.parts = append(bd.parts, part)
	return err
}

// step adds an account's events, decided on acc for cmd, to the batch's
// writes (expecting the revision they were decided on) and folds them into acc.
func (bd *batchDecision) step(cmd domain.Command, acc *domain.Account, events []domain.NewEvent) error {
	st := &accountStep{acc: acc, cmd: cmd, events: events}
	part, err := bd.s.encodeStep(st)
	if err != nil {
		return err
	}
	bd.steps[len(bd.parts)] = cmd.IdempotencyKey
	bd.parts = append(bd.parts, part)
	bd.folded[part.Stream] = true
	w := st.enc.pending()
	for i, ev := range w.events {
		if err := domain.EvolveAccountDecided(acc, ev, w.payloads[i]); err != nil {
			return err
		}
	}
	return nil
}

// record is the batch's append: its BatchDecided first, then, applied, every
// element's writes; refused, the revisions the refusal was decided on.
func (bd *batchDecision) record(refused *elementRefusal) ([]eventstore.StreamAppend, error) {
	b, d := bd.b, &bd.decided
	d.KeyClaimed = domain.KeyClaimed{Key: b.Key, Command: string(domain.CmdBatch), RequestHash: bd.req.Hash, Request: bd.req.JSON, Stream: domain.KeyStream(b.Key), Revision: new(uint64)}
	d.Keys = batchKeys(b)
	writes := bd.parts
	d.Status, d.Code = domain.StatusApplied, domain.CodeOK
	if refused != nil {
		elem, err := json.Marshal(refused.r)
		if err != nil {
			return nil, err
		}
		d.Status, d.Code, d.Index, d.Reply, d.Duplicates = refused.r.Status, refused.r.Code, &refused.index, elem, nil
		writes = nil
		for id, rev := range bd.base {
			writes = append(writes, eventstore.StreamAppend{Stream: domain.AccountStream(id), Expected: eventstore.ExactOrNoStream(rev)})
		}
		for stream, rev := range bd.baseTransfers {
			writes = append(writes, eventstore.StreamAppend{Stream: stream, Expected: eventstore.ExactOrNoStream(rev)})
		}
		for _, stream := range bd.unclaimed {
			writes = append(writes, eventstore.StreamAppend{Stream: stream, Expected: eventstore.NoStream})
		}
	}
	data, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	m := domain.Metadata{Key: b.Key, Command: string(domain.CmdBatch), RequestHash: bd.req.Hash, At: b.Commands[0].At}
	claim, err := mustBeNew(bd.s.keyStreamPart(m, domain.EvBatchDecided, data))
	if err != nil {
		return nil, err
	}
	return append([]eventstore.StreamAppend{claim}, writes...), nil
}

// batchKeys are the keys of a batch's elements, in order (of an invalid one,
// its key if it has a valid one).
func batchKeys(b domain.Batch) []string {
	keys := make([]string, len(b.Commands))
	for i, c := range b.Commands {
		keys[i] = c.IdempotencyKey
		if c.Invalid != nil {
			keys[i] = keyOf(c.Raw)
		}
	}
	return keys
}
