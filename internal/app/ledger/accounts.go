package ledger

import (
	"context"
	"time"

	"github.com/ledgerworks/ledger/domain"
)

// Commands whose home is one account stream (open, deposit, withdraw, holds,
// a capture into the held account, the refund of a deposit or withdrawal):
// decided by the write path (writepath.go); and what other commands read of
// an account (accountFacts).

// handleAccountCommand decides a client command whose home is an account stream.
func (s *Service) handleAccountCommand(ctx context.Context, cmd domain.Command, stream, accountID string) (Reply, error) {
	ans, err := s.decideOnAccount(ctx, cmd, stream, accountID, true)
	if err != nil {
		return Reply{}, err
	}
	return ans.reply(), nil // decideOnAccount returns a copy
}

func deref(r *Reply) Reply {
	if r == nil {
		return Reply{}
	}
	return *r
}

// accountOpened reports whether an account exists. An account never disappears,
// so a cached "open" is final; a cached "missing" is checked against the store.
func (s *Service) accountOpened(ctx context.Context, id string) (bool, error) {
	f, err := s.accountFacts(ctx, id)
	return f.opened, err
}

// accountFacts is what accountOpened reads: whether the account is open, its
// currency (which never changes once it is), and the revision its next event
// takes as far as this instance knows (a lower bound).
type accountFacts struct {
	opened   bool
	currency string
	next     uint64
	// effectiveFrom is the account's effective opening (domain.Account.EffectiveFrom).
	effectiveFrom time.Time
}

func (s *Service) accountFacts(ctx context.Context, id string) (f accountFacts, err error) {
	stream := domain.AccountStream(id)
	err = s.whenSettled(ctx, stream, func() error {
		acc, err := s.loadAccount(ctx, stream, id, false)
		if err == nil && !acc.Opened {
			acc, err = s.loadAccount(ctx, stream, id, true)
		}
		if err == nil {
			f = accountFacts{opened: acc.Opened, currency: acc.Currency, next: uint64(acc.Revision + 1), effectiveFrom: acc.EffectiveFrom}
		}
		return err
	})
	return f, err
}

// effectiveRefused is the refusal of cmd's effective_at on the accounts ids
// (domain.CheckEffectiveOn), nil when it has none or they allow it: the check a
// saga makes before its first step, since a step cannot be refused half-way.
func (s *Service) effectiveRefused(ctx context.Context, cmd domain.Command, ids ...string) (*domain.InvalidError, error) {
	if cmd.EffectiveAt.IsZero() {
		return nil, nil
	}
	for _, id := range ids {
		f, err := s.accountFacts(ctx, id)
		if err != nil {
			return nil, err
		}
		if ierr := domain.CheckEffectiveOn(cmd, id, f.opened, f.effectiveFrom); ierr != nil {
			return ierr, nil
		}
	}
	return nil, nil
}
