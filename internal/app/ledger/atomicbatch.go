package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Atomic batches (PROTOCOL.md v1.2 §2.2, ARCHITECTURE decision 13), on a store
// that appends to several streams in one write (atomicMover.batch): all of the
// batch or none of it, one decision over every stream its commands touch and
// one append.
//
// Each round: the batch's key is read first (decided: answered from its
// BatchDecided, duplicate; bound to another request: a conflict); then each
// element's key (priorDecisions: a key an earlier command decided answers
// that decision, applied counting as applied, anything else refusing the
// batch). Then, under the locks of the batch's key, of its transfer and
// transaction streams (sorted) and of its accounts (sorted, after them: the
// order of every write over several streams, atomic.go), every account is
// drained and loaded and the elements are decided in order, each on the state
// the ones before it left, as the atomic mover decides them alone: an account
// command as decideOnAccount, a capture into an account as captureTo, a
// transaction as the transaction, a transfer as openSaga (the same events, the
// saga decided at once). Applied, one append writes the batch's BatchDecided,
// every element's claim and events, each stream expected at the revision it
// was decided on. Refused at element i (rejected, or invalid: by itself, or
// on the state the elements before it leave, such as an effective_at before
// its account's opening), the append writes the BatchDecided alone (the
// refusing element's reply in it) and asserts the revisions the refusal was
// decided on, so that a refusal decided on a stale cache is decided again
// rather than recorded forever. A racing writer (another
// instance, a command of one of the elements' keys) makes the append fail:
// the round is taken again on the store's head, at most MaxAttempts rounds.
//
// A refund is decided as alone, in its original's home, which each round
// resolves before it takes the locks (atomicbatch_refund.go).
//
// The elements are folded into the cached aggregates while they are decided.
// Applied, the batch leaves them warm: each step's key record takes its
// part's global position once the append is durable (batchDecision.settle),
// as a single command's atomic write does. Refused, or not written, every
// aggregate it folded into is dropped (batchDecision.forget): the next
// command reads the store.

// atomicBatch decides an atomic batch in one append.
func (m atomicMover) atomicBatch(ctx context.Context, b domain.Batch) (Reply, error) {
	return m.s.decideAtomicBatch(ctx, b)
}

// decideAtomicBatch decides an atomic batch (b.Atomic, b.Key set).
func (s *Service) decideAtomicBatch(ctx context.Context, b domain.Batch) (Reply, error) {
	at := s.opts.Clock().UTC()
	for i := range b.Commands {
		if b.Commands[i].At.IsZero() {
			b.Commands[i].At = at
		}
	}
	req := b.Canonical()
	for round := 0; round < s.opts.MaxAttempts; round++ {
		if o, err := s.decidedBatch(ctx, b, req); err != nil || o.answered {
			return o.r, err
		}
		bd := &batchDecision{s: s, b: b, req: req, refresh: round > 0}
		var err error
		if bd.prior, err = s.priorDecisions(ctx, b.Commands); err != nil {
			return Reply{}, err
		}
		if bd.origins, err = s.refundOrigins(ctx, b.Commands); err != nil {
			return Reply{}, err
		}
		d, err := s.tryAtomicBatch(ctx, bd)
		switch {
		case err != nil:
			return Reply{}, err
		case d.again:
			continue
		case d.r != nil:
			return *d.r, nil
		}
		return s.batchReply(ctx, d.decided, false)
	}
	return Reply{}, ErrTooManyConflicts
}

// decidedBatch answers a batch key already decided: the batch's reply
// (duplicate), or a conflict when the key is bound to another request (another
// batch, the same commands under other keys included: domain.JudgeBatch, or a
// command of its own); no answer for a key never decided.
func (s *Service) decidedBatch(ctx context.Context, b domain.Batch, req domain.Canonical) (outcome, error) {
	key := b.Key
	v, err := s.judgeClaim(ctx, key, req)
	if err != nil || v.c == nil || v.conflict.answered {
		return v.conflict, err
	}
	d, err := s.readBatchDecided(ctx, key)
	if err != nil {
		return outcome{}, err
	}
	if j := domain.JudgeBatch(d, b); j.Verdict == domain.KeyConflict {
		return answer(reply.Conflict(key, j.Fields)), nil
	}
	r, err := s.batchReply(ctx, d, true)
	if err != nil {
		return outcome{}, err
	}
	return answer(r), nil
}

// readBatchDecided reads an atomic batch's decision from its key stream.
func (s *Service) readBatchDecided(ctx context.Context, key string) (*domain.BatchDecided, error) {
	evs, err := s.store.ReadStream(ctx, domain.KeyStream(key), 0, eventstore.Forwards, 1)
	if err != nil {
		return nil, err
	}
	var d domain.BatchDecided
	if len(evs) == 0 || evs[0].Type != domain.EvBatchDecided || json.Unmarshal(evs[0].Data, &d) != nil {
		return nil, fmt.Errorf("ledger: key stream of %q holds no batch decision", key)
	}
	return &d, nil
}

// batchReply is the reply of a decided atomic batch, from its BatchDecided
// (reply.BatchDecided): refused, as recorded; applied, each element's reply as
// its key answers it (Lookup), duplicate when it was decided before the batch
// or when the whole batch is answered again.
func (s *Service) batchReply(ctx context.Context, d *domain.BatchDecided, duplicate bool) (Reply, error) {
	r, err := reply.BatchDecided(d)
	if err != nil {
		return Reply{}, err
	}
	return reply.FillBatch(r, duplicate, func(key string) (*Reply, error) { return s.lookup(ctx, key) })
}

// priorDecisions answers each element whose key was decided before the batch
// (nil for one never decided): its original reply marked duplicate, or the
// conflict of its key. Read outside the batch's locks (a lookup takes an
// account's); a key decided after it is read is caught by the append, which
// writes its claim expecting none.
func (s *Service) priorDecisions(ctx context.Context, cmds []domain.BatchCommand) ([]*Reply, error) {
	prior := make([]*Reply, len(cmds))
	for i, c := range cmds {
		if c.Invalid != nil {
			continue
		}
		v, err := s.judgeClaim(ctx, c.IdempotencyKey, c.Canonical())
		switch {
		case err != nil:
			return nil, err
		case v.c == nil:
			continue
		case v.conflict.answered:
			prior[i] = &v.conflict.r
			continue
		}
		r, err := s.lookup(ctx, c.IdempotencyKey)
		if err != nil {
			return nil, err
		}
		if r == nil {
			return nil, fmt.Errorf("ledger: key %q is claimed but its decision is not found", c.IdempotencyKey)
		}
		r.Duplicate = true
		prior[i] = r
	}
	return prior, nil
}
