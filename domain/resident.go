package domain

import (
	"encoding/hex"
	"slices"
	"time"
	"unique"
)

// Resident is an account's state in compact form (issue 27): what deciding a
// command on it needs, and no more, so that every account of a ledger of
// millions can stay in memory apart from the bounded cache of full aggregates.
// It keeps the balances, the overdraft, the revision and the chain hash, the
// status, the currency (interned), the effective opening, the metadata (shared,
// never changed once folded), the active holds, and 8-byte fingerprints of the
// most recent keys; not the key records, the closed holds or the refunded sums,
// which the store answers for (RecallKey, RecallHold, RecallRefunded), as for
// an aggregate loaded from a snapshot. An aggregate made from it (Into) says
// so (Forgot, ForgotHolds, ForgotRefunds).
//
// The fingerprints route, they never answer: a command whose key's print is
// among them is looked up in the store before it is decided (by its own
// derived event ID, so a collision finds nothing and the command is decided
// as new); one whose print is not is decided at once, and the store's unique
// event IDs refuse it should it be an older key (answered from the store then).
type Resident struct {
	balance, held, overdraft, revision int64
	// effectiveFrom is Account.EffectiveFrom in Unix nanoseconds (opened only);
	// snapRev is Account.SnapshotRevision.
	effectiveFrom, snapRev int64
	chain                  [32]byte // Account.LastChain, decoded
	currency               unique.Handle[string]
	metadata               map[string]string
	holds                  []residentHold // the active ones
	prints                 [ResidentPrints]uint64
	nprints                uint8
	flags                  residentFlags
}

// ResidentPrints is how many of an account's most recent keys a Resident keeps
// the fingerprint of.
const ResidentPrints = 4

type residentFlags uint8

const (
	resOpened residentFlags = 1 << iota
	resClosed
	resForgotKeys
	resForgotHolds
	resForgotRefunds
	resNoChain
)

type residentHold struct {
	id, key   string
	amount    int64
	expiresAt int64 // Unix nanoseconds; 0: never
	findable  bool
}

// Compact is a's state as a Resident, print giving each recent key's
// fingerprint; ok is false when a holds something it may not forget (a key,
// closed hold or refunded original that no store lookup could find again: a
// pinned step, or any of them where a's limits keep all), when it has no
// events, when it is not the store's state (Account.Durable: it holds a
// decision the store has not confirmed, or a fold into it stopped half-way),
// or when a time does not fit in Unix nanoseconds: what it forgets must be in
// the store, and what it keeps must be the store's.
func Compact(a *Account, print func(key string) uint64) (r *Resident, ok bool) {
	if a.Revision < 0 || !a.Durable() || a.pinned > 0 || (a.KeyLimit == 0 && len(a.Keys) > 0) {
		return nil, false
	}
	r = &Resident{balance: a.Balance, held: a.Held, overdraft: a.OverdraftLimit, revision: a.Revision, snapRev: a.SnapshotRevision,
		currency: unique.Make(a.Currency), metadata: a.Metadata}
	if r.flags, ok = compactFlags(a); !ok || !r.noteChain(a.LastChain) {
		return nil, false
	}
	if a.Opened {
		if r.effectiveFrom, ok = unixNano(a.EffectiveFrom); !ok {
			return nil, false
		}
	}
	if r.holds, ok = activeHolds(a); !ok {
		return nil, false
	}
	r.notePrints(a, print)
	return r, true
}

// noteChain keeps chain (a hex SHA-256, or "" for a stream written before
// events were chained); false for anything else.
func (r *Resident) noteChain(chain string) bool {
	if chain == "" {
		r.flags |= resNoChain
		return true
	}
	n, err := hex.Decode(r.chain[:], []byte(chain))
	return err == nil && n == len(r.chain) && hex.EncodeToString(r.chain[:]) == chain
}

// compactFlags are a's status and what a Resident of it forgets: ok is false
// when it would forget a closed hold or a refunded original it may not.
func compactFlags(a *Account) (f residentFlags, ok bool) {
	if a.Opened {
		f |= resOpened
	}
	if a.Closed {
		f |= resClosed
	}
	if a.forgot || len(a.Keys) > 0 {
		f |= resForgotKeys
	}
	if a.forgotHolds {
		f |= resForgotHolds
	}
	for _, h := range a.Holds {
		if h.Status == HoldStatusActive {
			continue
		}
		if !h.Findable || a.HoldLimit == 0 {
			return 0, false
		}
		f |= resForgotHolds
	}
	if a.forgotRefunds {
		f |= resForgotRefunds
	}
	for _, sum := range a.Refunded {
		if sum.Amount != 0 && (!sum.Findable || a.RefundLimit == 0) {
			return 0, false
		}
		f |= resForgotRefunds
	}
	return f, true
}

// activeHolds are a's active holds, compacted (nil for none).
func activeHolds(a *Account) ([]residentHold, bool) {
	var hs []residentHold
	for _, h := range a.Holds {
		if h.Status != HoldStatusActive {
			continue
		}
		rh := residentHold{id: h.ID, key: h.Key, amount: h.Amount, findable: h.Findable}
		if !h.ExpiresAt.IsZero() {
			var ok bool
			if rh.expiresAt, ok = unixNano(h.ExpiresAt); !ok || rh.expiresAt == 0 {
				return nil, false
			}
		}
		hs = append(hs, rh)
	}
	return slices.Clip(hs), true
}

// notePrints keeps the fingerprints of a's most recent keys: those it holds,
// newest last, after those it was made from (Into) and has not held since.
func (r *Resident) notePrints(a *Account, print func(string) uint64) {
	all := slices.Clone(a.keyPrints)
	for _, k := range a.keyOrder.names[a.keyOrder.head:] {
		all = append(all, print(k))
	}
	if len(all) > ResidentPrints {
		all = all[len(all)-ResidentPrints:]
	}
	r.nprints = uint8(copy(r.prints[:], all))
}

// unixNano is t in Unix nanoseconds, ok false when they do not hold it.
func unixNano(t time.Time) (int64, bool) {
	n := t.UnixNano()
	return n, time.Unix(0, n).Equal(t)
}

// Into makes a, a new aggregate (NewAccount, its limits set), the account r
// holds: it decides every command as the aggregate r was made from would,
// reading from the store what r forgot.
func (r *Resident) Into(a *Account) {
	a.Opened, a.Closed = r.flags&resOpened != 0, r.flags&resClosed != 0
	a.Currency, a.Metadata = r.currency.Value(), r.metadata
	a.Balance, a.Held, a.OverdraftLimit, a.Revision = r.balance, r.held, r.overdraft, r.revision
	a.durable = r.revision // a Resident is made of durable state only (Compact)
	a.SnapshotRevision = r.snapRev
	if r.flags&resNoChain == 0 {
		a.LastChain = hex.EncodeToString(r.chain[:])
	}
	if a.Opened {
		a.EffectiveFrom = time.Unix(0, r.effectiveFrom).UTC()
	}
	for _, rh := range r.holds {
		h := &Hold{ID: rh.id, Key: rh.key, Amount: rh.amount, Status: HoldStatusActive, Findable: rh.findable}
		if rh.expiresAt != 0 {
			h.ExpiresAt = time.Unix(0, rh.expiresAt).UTC()
		}
		a.Holds[h.ID] = h
	}
	a.forgot = r.flags&resForgotKeys != 0
	a.forgotHolds = r.flags&resForgotHolds != 0
	a.forgotRefunds = r.flags&resForgotRefunds != 0
	a.keyPrints = slices.Clone(r.prints[:r.nprints])
}

// Revision is the revision of the account r holds.
func (r *Resident) Revision() int64 { return r.revision }

// MayHaveDecided reports whether key's fingerprint (print) is among those of
// the recent keys of the Resident the aggregate was made from, which it holds
// no records of: the key may have been decided on the stream, and is looked up
// before it is decided. It prints nothing when there are none.
func (a *Account) MayHaveDecided(key string, print func(string) uint64) bool {
	return len(a.keyPrints) > 0 && slices.Contains(a.keyPrints, print(key))
}
