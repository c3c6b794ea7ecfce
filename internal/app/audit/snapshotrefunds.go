package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// The fold keeps one refunded original per account (boundAccount), and a
// snapshot is compared with it on what both keep (domain.SameState), so the
// refunded sums a snapshot carries beyond that (a ledger's keeps up to
// --recent-refunds, 1,024) are checked against the store instead: each
// findable one the comparison did not cover, and each not findable one the
// fold, having forgot some, does not keep (lendRefunded), must be the sum of
// that original's refunds up to the snapshot's revision. On a store that
// finds events by subject (eventstore.SubjectReader: PostgreSQL, memory)
// they are read as the ledger recalls a forgotten original
// (domain.RecallRefunded): one indexed read of the original's refunds
// (domain.RefundSubject, which every refund stored has since migration
// 00027) per original; on one that does not (KurrentDB, whose ledger's aggregates keep
// every original) by one read of the account's stream from its first event
// up to the snapshot's revision. A snapshot that says it forgot none while
// the fold forgot some must list every refunded original: its listed sums,
// each checked so, must add up to the fold's total of the stream's refunds
// (refundsTotal, carried in the checkpoint's rows); only where that total
// is not known is its stream read instead (sameAllRefunded). Either way the
// audit holds one snapshot's list of originals and their sums at a time. A
// mismatch is a snapshot_mismatch (invariant 7), and the snapshot is not
// recorded as checked. docs/design.md, invariant 7, says why that is enough.

// refundsTotal is the sum of the amounts of every refund of an account's
// stream up to the fold's revision of it (domain.RefundPayload): what a
// snapshot's refunded sums must add up to when it says it forgot no
// refunded original. Unknown when it cannot serve so: a stream with a
// refund of no positive amount (then a sum of zero would not mean no
// refund), a sum beyond int64, or an account read from a checkpoint row that
// does not carry it (stored before migration 00026).
type refundsTotal struct {
	sum     int64
	unknown bool
}

// add adds a refund's amount.
func (t *refundsTotal) add(amount int64) {
	if t.unknown || amount <= 0 || t.sum > math.MaxInt64-amount {
		*t = refundsTotal{unknown: true}
		return
	}
	t.sum += amount
}

// addEvent adds an account event's amount when it is a refund (payload: its
// decoded data).
func (t *refundsTotal) addEvent(payload any) {
	if _, amount, ok := domain.RefundPayload(payload); ok {
		t.add(amount)
	}
}

// row is t as a checkpoint row carries it (nil: not known).
func (t refundsTotal) row() *int64 {
	if t.unknown {
		return nil
	}
	return &t.sum
}

// refundsTotalOfRow is the total a checkpoint row carries.
func refundsTotalOfRow(v *int64) refundsTotal {
	if v == nil || *v < 0 {
		return refundsTotal{unknown: true}
	}
	return refundsTotal{sum: *v}
}

// refundsTotalOf is the fold's total of stream's refunds.
func (f *Fold) refundsTotalOf(stream string) refundsTotal {
	if ss := f.streams[stream]; ss != nil {
		return ss.refunds
	}
	return refundsTotal{unknown: true}
}

// refundsReader sums, of an account's stream up to a revision, the refunds
// of each of the originals named (the keys of sums, whose values it adds to).
type refundsReader func(stream string, rev uint64, sums map[string]int64) error

// newRefundsReader is the store's refundsReader: by subject when it reads
// them, else by the stream; nil when it reads neither.
func newRefundsReader(ctx context.Context, store Store) refundsReader {
	if sub, ok := store.(eventstore.SubjectReader); ok {
		return func(stream string, rev uint64, sums map[string]int64) error {
			for _, k := range slices.Sorted(maps.Keys(sums)) {
				evs, err := sub.ReadStreamSubject(ctx, stream, domain.RefundSubject(k), 0)
				if err != nil {
					return err
				}
				for _, re := range evs {
					if re.Revision <= rev {
						if err := addRefund(sums, re, k); err != nil {
							return err
						}
					}
				}
			}
			return nil
		}
	}
	sr, ok := store.(eventstore.StreamReader)
	if !ok {
		return nil
	}
	return func(stream string, rev uint64, sums map[string]int64) error {
		err := readStreamRange(ctx, sr, stream, 0, int64(rev), func(re eventstore.RecordedEvent) error {
			return addRefund(sums, re, "")
		})
		if errors.Is(err, eventstore.ErrStreamNotFound) {
			return nil
		}
		return err
	}
}

// addRefund adds re to the sum of the original it refunds, when sums names
// it; of an event read by the subject of original want, an error unless it
// is a refund of want.
func addRefund(sums map[string]int64, re eventstore.RecordedEvent, want string) error {
	ref, amount, err := domain.RefundOf(storedEvent(re, domain.Metadata{}))
	if err == nil && want != "" && ref != want {
		err = fmt.Errorf("written with the subject of %q, is no refund of it", want)
	}
	if err != nil {
		return fmt.Errorf("%s@%d: %w", re.Stream, re.Revision, err)
	}
	if _, ok := sums[ref]; ok {
		sums[ref] += amount
	}
	return nil
}

// sameRefunded checks the refunded sums of snapshot snap of stream that the
// comparison with the fold's account a did not cover (findable, and not kept
// by a with an amount: domain.SameState) against the store, and, when snap
// says it forgot no refunded original while a forgot some, that its sums add
// up to total, the fold's total of the stream's refunds up to snap's
// revision; "" when they match. A read that fails sets reloadErr and reports
// them as matching (the audit ends in that error).
func (f *Fold) sameRefunded(stream string, snap, a *domain.Account, total refundsTotal) (bool, string) {
	all := !snap.ForgotRefunds() && a.ForgotRefunds()
	sums := uncheckedSums(snap, a)
	if all && (total.unknown || (len(sums) > 0 && f.readRefunds == nil)) {
		return f.sameAllRefunded(stream, snap, sums)
	}
	if len(sums) > 0 && f.readRefunds != nil {
		if err := f.readRefunds(stream, uint64(snap.Revision), sums); err != nil {
			f.reloadErr = cmp.Or(f.reloadErr, fmt.Errorf("audit: the refunds of the snapshot of %s: %w", stream, err))
			return true, ""
		}
		if same, diff := sameSums(snap, sums); !same {
			return false, diff
		}
	}
	if all {
		return sameTotal(snap, total)
	}
	return true, ""
}

// uncheckedSums names, with a sum of 0 each, the originals of snap whose
// refunded sums the comparison with the fold's a does not cover: not kept by
// a with an amount, and findable, or not findable while a forgot some (met
// by a after it forgot some, as lendRefunded has it).
func uncheckedSums(snap, a *domain.Account) map[string]int64 {
	sums := map[string]int64{}
	for k, r := range snap.Refunded.All() {
		if (r.Findable || a.ForgotRefunds()) && unkept(a, k) {
			sums[k] = 0
		}
	}
	return sums
}

// unkept reports whether a keeps no refunded sum of original k.
func unkept(a *domain.Account, k string) bool {
	kept, in := a.Refunded.Lookup(k)
	return !in || kept.Amount == 0
}

// lendRefunded puts among the fold's a, until the function it returns is
// called (which leaves a's refunded originals as they were: nil when it kept
// none), the refunded originals snap lists as not findable that a, which
// forgot some, does not keep: so domain.SameState compares them as a's own,
// and sameRefunded checks their sums against the store (uncheckedSums). A
// ledger never forgets such an original, but a fold keeps no original it
// meets after it forgot some (domain.Account's noteRefund): the audit's,
// keeping one, forgets long before the ledger's, and a refund written
// without a subject (by a build before refunds had one) after that is one
// its fold never keeps, while the ledger's true snapshot lists it. Its
// refunds are all found by its subject since migration 00027.
func lendRefunded(snap, a *domain.Account) func() {
	if !a.ForgotRefunds() {
		return func() {}
	}
	type entry struct {
		sum domain.RefundedSum
		in  bool
	}
	lent := map[string]entry{}
	for k, r := range snap.Refunded.All() {
		if !r.Findable && unkept(a, k) {
			was, in := a.Refunded.Lookup(k)
			lent[k] = entry{was, in}
			a.SetRefunded(k, domain.RefundedSum{Amount: r.Amount})
		}
	}
	return func() {
		for k, e := range lent {
			if e.in {
				a.SetRefunded(k, e.sum)
			} else {
				a.Refunded.Delete(k) // emptied, it holds no storage, as it was
			}
		}
	}
}

// sameTotal checks that the refunded sums of snap, each checked already
// (against the fold or the store), add up to total: with every refund of a
// positive amount, a refunded original snap omits, or a sum of one that
// counts less than all its refunds, leaves them short of it.
func sameTotal(snap *domain.Account, total refundsTotal) (bool, string) {
	listed := refundsTotal{}
	for _, r := range snap.Refunded.All() {
		if r.Amount != 0 {
			listed.add(r.Amount)
		}
	}
	if listed.unknown || listed.sum != total.sum {
		return false, fmt.Sprintf("its %d refunded originals sum %d, the stream's refunds up to revision %d sum %d: it omits a refunded original while it says it forgot none", snap.Refunded.Len(), listed.sum, snap.Revision, total.sum)
	}
	return true, ""
}

// sameSums compares the refunded sums read from the store with snap's.
func sameSums(snap *domain.Account, sums map[string]int64) (bool, string) {
	for _, k := range slices.Sorted(maps.Keys(sums)) {
		if got := snap.Refunded.Of(k).Amount; got != sums[k] {
			return false, fmt.Sprintf("refunded %d of original %q, the store's refunds of it up to revision %d sum %d", got, k, snap.Revision, sums[k])
		}
	}
	return true, ""
}

// sameAllRefunded checks a snapshot that says it forgot no refunded original
// while the fold forgot some, where the fold's total of its refunds is not
// known (refundsTotal): one read of the account's stream up to the
// snapshot's revision, in pages, in which every refund's original must be
// one the snapshot lists, and each listed original of sums (uncheckedSums)
// must sum as the snapshot says. An omitted original would be refunded again
// in full by a ledger that cold-loads the snapshot (it recalls only when the
// snapshot says it forgot some). The audit holds the snapshot's list and one
// page of events; the read costs the stream's length, once per such
// snapshot checked.
func (f *Fold) sameAllRefunded(stream string, snap *domain.Account, sums map[string]int64) (bool, string) {
	if f.readStreamTo == nil {
		f.reloadErr = cmp.Or(f.reloadErr, fmt.Errorf("audit: the snapshot of %s lists every refunded original and the store reads no streams", stream))
		return true, ""
	}
	missing := ""
	err := f.readStreamTo(stream, snap.Revision, func(re eventstore.RecordedEvent) error {
		ref, _, err := domain.RefundOf(storedEvent(re, domain.Metadata{}))
		if err == nil && ref != "" && missing == "" {
			if _, listed := snap.Refunded.Lookup(ref); !listed {
				missing = fmt.Sprintf("original %q refunded at revision %d is missing from a snapshot that says it forgot no refunded original", ref, re.Revision)
			}
		}
		return addRefund(sums, re, "")
	})
	if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
		f.reloadErr = cmp.Or(f.reloadErr, fmt.Errorf("audit: the refunds of the snapshot of %s: %w", stream, err))
		return true, ""
	}
	if missing != "" {
		return false, missing
	}
	return sameSums(snap, sums)
}
