package ledger

import (
	"context"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Lookup returns the original reply of a decided client key, from the event
// store: nil when the key was never decided (or only refused without record).
func (s *Service) Lookup(ctx context.Context, key string) (*Reply, error) {
	r, err := s.lookup(ctx, key)
	if err == nil && r != nil {
		err = s.answered(ctx)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// replyOf is r, found, unless err.
func replyOf(r Reply, err error) (*Reply, error) {
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// lookup is Lookup's answer, nil when not found, before it is made durable.
func (s *Service) lookup(ctx context.Context, key string) (*Reply, error) {
	c, err := s.readClaim(ctx, key)
	if err != nil || c == nil {
		return nil, err
	}
	switch {
	case c.Command == string(domain.CmdBatch): // an atomic batch's key (atomicbatch.go)
		d, err := s.readBatchDecided(ctx, key)
		if err != nil {
			return nil, err
		}
		return replyOf(s.batchReply(ctx, d, false))
	case strings.HasPrefix(c.Stream, domain.AccountStreamPrefix):
		return s.lookupAccountKey(ctx, key, c)
	case strings.HasPrefix(c.Stream, domain.TransferStreamPrefix):
		return s.lookupTransfer(ctx, key, c)
	case domain.IsTransactionStream(c.Stream):
		o, err := s.claimedTransaction(ctx, key, c.Stream)
		if err != nil || o == nil {
			return nil, err // claimed, but its decision is not written
		}
		return replyOf(o.reply(false))
	}
	return nil, nil
}

// claimedTransaction is the outcome of the transaction key decided, from
// stream, the one its claim names; nil when it is not written. A refund of a
// transaction whose instance lost the claimed slot to another key is decided
// in a later slot (domain.NextRefundSlot): followed past each slot another
// key decided.
func (s *Service) claimedTransaction(ctx context.Context, key, stream string) (*txOutcome, error) {
	for {
		o, err := s.readTransaction(ctx, stream)
		if err != nil || o == nil || domain.ClientKey(o.ev.Metadata) == key {
			return o, err
		}
		next, ok := domain.NextRefundSlot(stream)
		if !ok {
			return nil, nil // another key's transaction
		}
		stream = next
	}
}

// lookupAccountKey answers a key claimed (c) for an account stream: its
// record, unless its decision is not written yet or it is a capture into an
// account still running.
func (s *Service) lookupAccountKey(ctx context.Context, key string, c *domain.KeyClaimed) (*Reply, error) {
	var r *Reply
	err := s.whenSettled(ctx, c.Stream, func() error {
		acc, err := s.loadAccount(ctx, c.Stream, strings.TrimPrefix(c.Stream, domain.AccountStreamPrefix), true)
		if err != nil {
			return err
		}
		rec, err := s.keyRecord(ctx, c.Stream, acc, key)
		if rec != nil { // else claimed, but its decision is not written yet
			rr := recordReply(rec, false)
			r = &rr
		}
		return err
	})
	if err == nil && r != nil && c.Command == string(domain.CmdCaptureHold) {
		if running, err := s.mover.captureInFlight(ctx, key, c); err != nil || running {
			return nil, err
		}
	}
	return r, err
}

// LookupTransaction returns a transaction as its stream records it, from the
// event store: nil when no transaction has the ID.
func (s *Service) LookupTransaction(ctx context.Context, id string) (*reply.TransactionDetail, error) {
	o, err := s.readTransaction(ctx, domain.TransactionStream(id))
	if err != nil || o == nil {
		return nil, err
	}
	d, err := reply.TransactionDetailOf(domain.ClientKey(o.ev.Metadata), o.payload, o.ev.Position)
	if err != nil {
		return nil, err
	}
	return &d, nil
}
