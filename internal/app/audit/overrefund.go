package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

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
// account's stream, from the revision the original's key claim names up to
// the refund, answers both. Nothing is carried across
// a checkpoint: an incremental audit reads what its rows do not keep.

// originalsKept bounds the originals whose amount and refunded sum the
// over-refund check keeps per account (originalWindow): the last ones
// folded (a deposit or withdrawal seen) or read (a refund's original the
// window did not hold), the first kept forgotten first. A refund of an
// original it holds reads nothing; one of an original it does not hold
// reads it once, then holds it.
const originalsKept = 8

// originalSum is what the check knows of one original: its amount (found:
// a deposit or withdrawal of the account) and what was refunded of it up
// to the last event folded.
type originalSum struct {
	amount, refunded int64
	found            bool
}

// keptOriginal is one original of a window: the ID of its first event,
// derived from its key and stream (domain.EventID, what byID reads it by),
// its amount and what was refunded of it (whether it was found is the
// window's unfound). The ID, not the key: 16 bytes in place, where a key is
// a string of its own, so a window holds no pointer and the collector
// never scans it (issue 23). Two keys of one stream have one derived ID
// only if SHA-1 collides, which the ledger's idempotency already rules out
// (its events' IDs are these).
type keptOriginal struct {
	id               uuid.UUID
	amount, refunded int64
}

// originalWindow is one account's originals kept, the first kept first, at
// most originalsKept: a slice searched in order, not a map, held in the
// account's streamState, as a full audit keeps one window for every
// account (32 bytes an original, so at most 256 an account). unfound has
// bit i set when kept[i]'s original was not found (originalSum.found
// unset): a flag apart, not in each entry, where it would cost 8 bytes of
// padding an entry.
type originalWindow struct {
	kept    []keptOriginal
	unfound uint8
}

// unfound holds a bit per original kept.
var _ [8 - originalsKept]struct{}

// originalID is the window's name of original key on stream.
func originalID(key, stream string) uuid.UUID { return domain.EventID(key, stream, 0) }

// find is the index of id's original in w, or -1.
func (w *originalWindow) find(id uuid.UUID) int {
	for i := range w.kept {
		if w.kept[i].id == id {
			return i
		}
	}
	return -1
}

// sum is what w knows of its i-th original.
func (w *originalWindow) sum(i int) originalSum {
	return originalSum{amount: w.kept[i].amount, refunded: w.kept[i].refunded, found: w.unfound&(1<<i) == 0}
}

// put keeps s as id's, forgetting the first kept when full.
func (w *originalWindow) put(id uuid.UUID, s originalSum) {
	i := w.find(id)
	if i < 0 {
		if len(w.kept) == originalsKept {
			w.kept = append(w.kept[:0], w.kept[1:]...)
			w.unfound >>= 1
		}
		i = len(w.kept)
		w.kept = append(w.kept, keptOriginal{id: id})
	}
	w.kept[i].amount, w.kept[i].refunded = s.amount, s.refunded
	w.unfound &^= 1 << i
	if !s.found {
		w.unfound |= 1 << i
	}
}

// originals answers the over-refund check; nil: no store to read.
type originals struct {
	ctx     context.Context
	locator eventstore.EventLocator // nil: read the stream instead
	stream  eventstore.StreamReader
	refunds refundsReader
	// txRefunds are the refunded transactions kept (overrefundtx.go).
	txRefunds txRefundWindow
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

// checkRefund keeps an original folded into a (its command's first event
// m) in w, its stream's window, and checks a refund against its original;
// payload is re's decoded data.
func (f *Fold) checkRefund(re eventstore.RecordedEvent, m domain.Metadata, a *domain.Account, w *originalWindow, payload any) {
	if f.originals == nil {
		return
	}
	if amount, ok := originalOf(payload); ok && m.Index == 0 {
		w.put(originalID(m.Key, re.Stream), originalSum{amount: amount, found: true})
		return
	}
	key, part, ok := domain.RefundPayload(payload)
	if !ok {
		return
	}
	s, err := f.originals.of(re, a, w, key, part)
	switch {
	case err != nil:
		f.reloadErr = cmp.Or(f.reloadErr, fmt.Errorf("audit: the original of the refund %s@%d: %w", re.Stream, re.Revision, err))
	case !s.found:
		f.eventViolation(InvBalance, "refund_without_original", re, "a refund of %q, which is no deposit or withdrawal before it on %s", key, re.Stream)
	case s.refunded > s.amount:
		f.eventViolation(InvBalance, "refund_exceeds_original", re, "the refunds of %q sum %d up to revision %d, more than its amount %d", key, s.refunded, re.Revision, s.amount)
	}
}

// of is what is known of original key once re, a refund of part of it
// folded into a, is counted: from w, re's stream's window, when it holds
// key (no read), else read from the store and then kept.
func (o *originals) of(re eventstore.RecordedEvent, a *domain.Account, w *originalWindow, key string, part int64) (originalSum, error) {
	id := originalID(key, re.Stream)
	if i := w.find(id); i >= 0 {
		w.kept[i].refunded += part
		return w.sum(i), nil
	}
	var s originalSum
	var err error
	if o.locator == nil {
		s.refunded, s.amount, s.found, err = o.fromStream(re, key)
	} else {
		s, err = o.byID(re, a, key)
	}
	if err == nil {
		w.put(id, s)
	}
	return s, err
}

// byID is of's read on a store that finds an event by ID: the original's
// first event by its derived ID, what was refunded of it by the refunds'
// subject unless a keeps it.
func (o *originals) byID(re eventstore.RecordedEvent, a *domain.Account, key string) (originalSum, error) {
	orig, err := o.locator.ReadEventByID(o.ctx, originalID(key, re.Stream))
	if errors.Is(err, eventstore.ErrEventNotFound) {
		return originalSum{}, nil
	}
	if err != nil {
		return originalSum{}, err
	}
	s := originalSum{}
	s.amount, s.found = originalAmount(orig, re)
	if r, kept := a.Refunded.Lookup(key); kept && r.Amount != 0 {
		s.refunded = r.Amount
		return s, nil
	}
	sums := map[string]int64{key: 0}
	err = o.refunds(re.Stream, re.Revision, sums)
	s.refunded = sums[key]
	return s, err
}

// fromStream is of on a store that finds no event by ID (KurrentDB): re's
// stream read from the original's revision, as its key's claim names it
// (claimedFrom), up to re: the original's first event and every refund of
// it, none of which comes before it. When the claim names no revision, or
// the original is not found from it (a claim that is no lower bound), the
// stream is read from its first event, as before claims held revisions.
func (o *originals) fromStream(re eventstore.RecordedEvent, key string) (refunded, amount int64, found bool, err error) {
	from, err := o.claimedFrom(re, key)
	if err != nil {
		return 0, 0, false, err
	}
	refunded, amount, found, err = o.streamRange(re, key, from)
	if err == nil && !found && from > 0 {
		return o.streamRange(re, key, 0)
	}
	return refunded, amount, found, err
}

// claimedFrom is the revision of re's stream the claim of key names, where
// the ledger wrote (or was to write) its first event: a lower bound where the
// claim was written first (domain.KeyClaimed.Revision), as the ledger reads
// a forgotten key from it. 0 when key has no claim on re's stream, or one
// without a revision (an older claim), or one at or past re.
func (o *originals) claimedFrom(re eventstore.RecordedEvent, key string) (uint64, error) {
	recs, err := o.stream.ReadStream(o.ctx, domain.KeyStream(key), 0, eventstore.Forwards, 1)
	if err != nil || len(recs) == 0 {
		return 0, ignoreNotFound(err)
	}
	c, err := decodeClaim(recs[0].Type, recs[0].Data)
	if err != nil || c.Stream != re.Stream || c.Revision == nil || *c.Revision >= re.Revision {
		return 0, nil
	}
	return *c.Revision, nil
}

// streamRange is fromStream's read of re's stream from revision from up to re.
func (o *originals) streamRange(re eventstore.RecordedEvent, key string, from uint64) (refunded, amount int64, found bool, err error) {
	sums := map[string]int64{key: 0}
	err = readStreamRange(o.ctx, o.stream, re.Stream, from, int64(re.Revision), func(e eventstore.RecordedEvent) error {
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
	return originalOf(payload)
}

// originalOf is the amount of payload when it is a deposit or withdrawal,
// what a refund refunds.
func originalOf(payload any) (int64, bool) {
	switch e := payload.(type) {
	case *domain.Credited:
		return e.Amount, e.Reason == domain.ReasonDeposit
	case *domain.Debited:
		return e.Amount, e.Reason == domain.ReasonWithdrawal
	}
	return 0, false
}
