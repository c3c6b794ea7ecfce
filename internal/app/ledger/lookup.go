package ledger

import (
	"context"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Lookup returns the original reply of a decided client key, from the event store:
// found is false when the key was never decided (or only refused without record).
func (s *Service) Lookup(ctx context.Context, key string) (Reply, bool, error) {
	r, found, err := s.lookup(ctx, key)
	if err == nil && found {
		err = s.answered(ctx)
	}
	if err != nil {
		return Reply{}, false, err
	}
	return r, found, nil
}

func (s *Service) lookup(ctx context.Context, key string) (r Reply, found bool, err error) {
	c, err := s.readClaim(ctx, key)
	if err != nil || c == nil {
		return Reply{}, false, err
	}
	switch {
	case c.Command == string(domain.CmdBatch): // an atomic batch's key (atomicbatch.go)
		d, err := s.readBatchDecided(ctx, key)
		if err != nil {
			return Reply{}, false, err
		}
		r, err := s.batchReply(ctx, d, false)
		return r, err == nil, err
	case strings.HasPrefix(c.Stream, domain.AccountStreamPrefix):
		err := s.whenSettled(ctx, c.Stream, func() error {
			acc, err := s.loadAccount(ctx, c.Stream, strings.TrimPrefix(c.Stream, domain.AccountStreamPrefix), true)
			if err != nil {
				return err
			}
			rec, err := s.keyRecord(ctx, c.Stream, acc, key)
			if rec != nil { // else claimed, but its decision is not written yet
				r, found = recordReply(rec, false), true
			}
			return err
		})
		if err == nil && found && c.Command == string(domain.CmdCaptureHold) {
			if running, err := s.mover.captureInFlight(ctx, key, c); err != nil || running {
				return Reply{}, false, err
			}
		}
		return r, found, err
	case strings.HasPrefix(c.Stream, domain.TransferStreamPrefix):
		return s.lookupTransfer(ctx, key, c)
	case domain.IsTransactionStream(c.Stream):
		o, err := s.readTransaction(ctx, c.Stream)
		if err != nil || o == nil || domain.ClientKey(o.ev.Metadata) != key {
			return Reply{}, false, err // claimed, but its decision is not written (or not this key's)
		}
		r, err := o.reply(false)
		return r, err == nil, err
	}
	return Reply{}, false, nil
}

// LookupTransaction returns a transaction as its stream records it, from the
// event store; found is false when no transaction has the ID.
func (s *Service) LookupTransaction(ctx context.Context, id string) (reply.TransactionDetail, bool, error) {
	o, err := s.readTransaction(ctx, domain.TransactionStream(id))
	if err != nil || o == nil {
		return reply.TransactionDetail{}, false, err
	}
	d, err := reply.TransactionDetailOf(domain.ClientKey(o.ev.Metadata), o.payload, o.ev.Position)
	return d, err == nil, err
}
