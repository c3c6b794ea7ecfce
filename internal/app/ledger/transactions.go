package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Transactions (PROTOCOL.md v1.1 §2.1, domain/transaction.go): what they share
// whichever way money moves (mover.go): the answer of one already decided,
// its refunds' slots, its stream read back.

// refundTransaction refunds a posted transaction (orig is the claim of its
// key) as a transaction of its own: every posting reversed, last first, in
// full, or in part for a transaction of one posting; the refunds of one
// transaction never exceed it. Its stream is the original's next refund slot,
// domain.RefundTransactionID(original, n): slots are taken in order (the
// original's lock in this process, the slot's expected "no stream" across
// instances), and what earlier slots posted is what was refunded.
func (s *Service) refundTransaction(ctx context.Context, cmd domain.Command, orig *domain.KeyClaimed) (Reply, error) {
	o, err := s.readTransaction(ctx, orig.Stream)
	if err != nil {
		return Reply{}, err
	}
	posted, refused := postedOriginal(cmd, o)
	if refused != nil {
		return *refused, nil
	}
	return s.mover.refundTransaction(ctx, cmd, cmd.Canonical(), orig.Stream, posted)
}

// postedOriginal is the transaction a refund (cmd) reverses, read back from
// its stream (o; nil when the stream holds no outcome):
// a posted post_transaction, else the refund's not_refundable reply (a
// rejected transaction, or a refund: a refund is not refunded).
func postedOriginal(cmd domain.Command, o *txOutcome) (*domain.TransactionPosted, *Reply) {
	var posted *domain.TransactionPosted
	if o != nil {
		posted, _ = o.payload.(*domain.TransactionPosted)
	}
	if posted == nil || o.ev.Metadata.Command != string(domain.CmdPostTransaction) {
		r := reply.NotRecorded(cmd.IdempotencyKey, &domain.Rejection{Code: domain.CodeNotRefundable, Message: fmt.Sprintf("transaction of %q was not posted", cmd.OriginalKey)})
		return nil, &r
	}
	return posted, nil
}

// txReader reads a transaction stream's outcome as readTransaction does.
type txReader func(ctx context.Context, txStream string) (*txOutcome, error)

// refundAt is where a refund of a transaction goes: its first free refund
// slot and what the slots before it refunded; or, when a slot holds the
// refund's key, the answer to it.
type refundAt struct {
	slot     int
	refunded int64
	answer   *Reply
}

// refundSlot reads the refund slots of a transaction in order (with read)
// for the refund cmd whose request is req.
func refundSlot(ctx context.Context, read txReader, txID string, cmd domain.Command, req domain.Canonical) (refundAt, error) {
	var at refundAt
	for ; ; at.slot++ {
		o, err := read(ctx, domain.TransactionStream(domain.RefundTransactionID(txID, at.slot)))
		if err != nil || o == nil {
			return at, err
		}
		if domain.ClientKey(o.ev.Metadata) == cmd.IdempotencyKey {
			if j, err := domain.Judge(domain.DecidedFor(o.ev.Metadata), req); err != nil || j.Verdict == domain.KeyConflict {
				r := reply.Conflict(cmd.IdempotencyKey, j.Fields)
				return refundAt{answer: &r}, err
			}
			r, err := o.reply(true)
			return refundAt{answer: &r}, err
		}
		at.refunded += domain.SlotRefunded(o.payload)
	}
}

// decidedTransaction answers a transaction whose stream already holds its
// outcome: the original reply (duplicate), a conflict (the key with another
// request), or transaction_exists (the ID under another key); no answer when
// the transaction was never decided. On the first attempt, on a store
// that locates events, it asks first whether the key's outcome event exists
// (its ID is derived: one batched lookup shared by concurrent transactions,
// not a read each); the stream is read only when it does. A stream another
// key decided is then found by the append (its stream exists) and read on
// the next attempt.
func (s *Service) decidedTransaction(ctx context.Context, txStream string, cmd domain.Command, req domain.Canonical, attempt int) (outcome, error) {
	if attempt == 0 {
		if found, err := s.keys.mayExist(ctx, domain.EventID(cmd.IdempotencyKey, txStream, 0)); err != nil || !found {
			return outcome{}, err
		}
	}
	o, err := s.readTransaction(ctx, txStream)
	if err != nil || o == nil {
		return outcome{}, err
	}
	if domain.ClientKey(o.ev.Metadata) != cmd.IdempotencyKey {
		r, err := s.transactionExists(ctx, cmd, req)
		return answer(r), err
	}
	if j, err := domain.Judge(domain.DecidedFor(o.ev.Metadata), req); err != nil || j.Verdict == domain.KeyConflict {
		return answer(reply.Conflict(cmd.IdempotencyKey, j.Fields)), err
	}
	r, err := o.reply(true)
	if err != nil {
		return outcome{}, err
	}
	return answer(r), nil
}

// transactionExists answers a transaction whose ID another key took: a key
// bound to another request is a conflict first, else transaction_exists.
func (s *Service) transactionExists(ctx context.Context, cmd domain.Command, req domain.Canonical) (Reply, error) {
	if v, err := s.judgeClaim(ctx, cmd.IdempotencyKey, req); err != nil || v.conflict.answered {
		return v.conflict.r, err
	}
	return reply.NotRecorded(cmd.IdempotencyKey, &domain.Rejection{Code: domain.CodeTransactionExists,
		Message: fmt.Sprintf("transaction %s was posted under another key", cmd.TransactionID)}), nil
}

// readTransaction reads a transaction's outcome (TransactionPosted or
// TransactionRejected): its stream's last event; nil when the stream does not
// exist or holds a reservation saga still running.
func (s *Service) readTransaction(ctx context.Context, txStream string) (*txOutcome, error) {
	evs, err := s.store.ReadStream(ctx, txStream, eventstore.EndOfStream, eventstore.Backwards, 1)
	if errors.Is(err, eventstore.ErrStreamNotFound) || (err == nil && len(evs) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if t := evs[0].Type; t != domain.EvTransactionPosted && t != domain.EvTransactionRejected {
		return nil, nil
	}
	ev, err := toStored(evs[0])
	if err != nil {
		return nil, err
	}
	payload, err := domain.DecodeEvent(ev.Type, ev.Data)
	if err != nil {
		return nil, err
	}
	return &txOutcome{ev: ev, payload: payload}, nil
}

// txOutcome is a transaction's outcome event and its decoded payload.
type txOutcome struct {
	ev      domain.StoredEvent
	payload any
}

// reply is the outcome's reply (transactionReply).
func (o *txOutcome) reply(duplicate bool) (Reply, error) {
	return transactionReply(&o.ev, o.payload, duplicate)
}

// transactionReply is the reply of a transaction's outcome, under its client's
// key (a saga's outcome is recorded under a derived one).
func transactionReply(ev *domain.StoredEvent, payload any, duplicate bool) (Reply, error) {
	ref := domain.EventRef{ID: ev.ID, Stream: ev.Stream, Revision: ev.Revision, Type: ev.Type}
	return reply.Transaction(domain.ClientKey(ev.Metadata), ref, payload, ev.Position, duplicate)
}
