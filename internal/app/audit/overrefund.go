package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// Over-refunds (invariant 3). The ledger refuses a refund beyond what is
// left of its original (refund_exceeds_original), so the refunds of one
// original (a deposit or withdrawal, by its key, on its account) never sum
// to more than its amount. The fold checks it at each refund: what is
// refunded of the original up to it is the account's refunded sum when the
// fold keeps the original (domain.Account.Refunded, bounded to the last
// one refunded, boundAccount), else read from the store as the ledger
// recalls it (refundsReader: by the refunds' subject); the original's
// amount is read from its first event, found by its derived ID as the
// ledger finds a forgotten key (eventstore.EventLocator: PostgreSQL,
// memory). On a store that finds no event by ID (KurrentDB) one read of the
// account's stream up to the refund answers both. Nothing is carried across
// a checkpoint: an incremental audit reads what its rows do not keep.

// originals answers the over-refund check's reads; nil: no store to read.
type originals struct {
	ctx     context.Context
	locator eventstore.EventLocator // nil: read the stream instead
	stream  eventstore.StreamReader
	refunds refundsReader
}

func newOriginals(ctx context.Context, store Store) *originals {
	o := &originals{ctx: ctx, refunds: newRefundsReader(ctx, store)}
	o.locator, _ = store.(eventstore.EventLocator)
	o.stream, _ = store.(eventstore.StreamReader)
	if o.refunds == nil || (o.locator == nil && o.stream == nil) {
		return nil
	}
	return o
}

// checkRefund checks a refund event re, folded into a, against its
// original; payload is its decoded data.
func (f *Fold) checkRefund(re eventstore.RecordedEvent, a *domain.Account, payload any) {
	key, _, ok := domain.RefundPayload(payload)
	if !ok || f.originals == nil {
		return
	}
	refunded, amount, found, err := f.originals.of(re, a, key)
	switch {
	case err != nil:
		f.reloadErr = cmp.Or(f.reloadErr, fmt.Errorf("audit: the original of the refund %s@%d: %w", re.Stream, re.Revision, err))
	case !found:
		f.eventViolation(InvBalance, "refund_without_original", re, "a refund of %q, which is no deposit or withdrawal before it on %s", key, re.Stream)
	case refunded > amount:
		f.eventViolation(InvBalance, "refund_exceeds_original", re, "the refunds of %q sum %d up to revision %d, more than its amount %d", key, refunded, re.Revision, amount)
	}
}

// of is what is refunded of original key up to re (a refund of it folded
// into a) and the original's amount; found is false when key names no
// deposit or withdrawal of re's stream before re.
func (o *originals) of(re eventstore.RecordedEvent, a *domain.Account, key string) (refunded, amount int64, found bool, err error) {
	if o.locator == nil {
		return o.fromStream(re, key)
	}
	orig, err := o.locator.ReadEventByID(o.ctx, domain.EventID(key, re.Stream, 0))
	if errors.Is(err, eventstore.ErrEventNotFound) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, err
	}
	amount, found = originalAmount(orig, re)
	if r, kept := a.Refunded[key]; kept && r.Amount != 0 {
		return r.Amount, amount, found, nil
	}
	sums := map[string]int64{key: 0}
	err = o.refunds(re.Stream, re.Revision, sums)
	return sums[key], amount, found, err
}

// fromStream is of, reading re's stream from its first event up to re.
func (o *originals) fromStream(re eventstore.RecordedEvent, key string) (refunded, amount int64, found bool, err error) {
	sums := map[string]int64{key: 0}
	err = readStreamRange(o.ctx, o.stream, re.Stream, 0, int64(re.Revision), func(e eventstore.RecordedEvent) error {
		m, err := domain.DecodeMetadata(e.Metadata)
		if err != nil {
			return err
		}
		if m.Key == key && m.Index == 0 {
			amount, found = originalAmount(e, re)
		}
		return addRefund(sums, e, "")
	})
	return sums[key], amount, found, err
}

// originalAmount is the amount of orig, the first event of a refund re's
// original: a deposit or withdrawal of re's stream before it.
func originalAmount(orig, re eventstore.RecordedEvent) (int64, bool) {
	if orig.Stream != re.Stream || orig.Revision >= re.Revision {
		return 0, false
	}
	payload, err := domain.DecodeEvent(orig.Type, orig.Data)
	if err != nil {
		return 0, false
	}
	switch e := payload.(type) {
	case *domain.Credited:
		return e.Amount, e.Reason == domain.ReasonDeposit
	case *domain.Debited:
		return e.Amount, e.Reason == domain.ReasonWithdrawal
	}
	return 0, false
}
