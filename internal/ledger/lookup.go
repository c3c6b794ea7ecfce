package ledger

import (
	"context"
	"strings"

	"github.com/ledgerworks/ledger/domain"
)

// Lookup returns the original reply of a decided client key, from the event store:
// found is false when the key was never decided (or only refused without record).
func (s *Service) Lookup(ctx context.Context, key string) (r Reply, found bool, err error) {
	c, err := s.readClaim(ctx, key)
	if err != nil || c == nil {
		return Reply{}, false, err
	}
	switch {
	case strings.HasPrefix(c.Stream, domain.AccountStreamPrefix):
		unlock, err := s.locks.lock(ctx, c.Stream)
		if err != nil {
			return Reply{}, false, err
		}
		defer unlock()
		acc, err := s.loadAccount(ctx, c.Stream, strings.TrimPrefix(c.Stream, domain.AccountStreamPrefix), true)
		if err != nil {
			return Reply{}, false, err
		}
		rec, ok := acc.Keys[key]
		if !ok {
			return Reply{}, false, nil // claimed, but its decision is not written yet
		}
		return recordReply(rec, false), true, nil
	case strings.HasPrefix(c.Stream, domain.TransferStreamPrefix):
		return s.lookupTransfer(ctx, key, c)
	}
	return Reply{}, false, nil
}
