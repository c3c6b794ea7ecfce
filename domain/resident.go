package domain

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"
)

// Resident is an account's state in compact form (issue 27): what deciding a
// command on it needs, and no more, so that every account of a ledger of
// millions can stay in memory apart from the bounded cache of full aggregates.
// It keeps the balances, the overdraft, the revision and the chain hash, the
// status, the currency, the effective opening, the metadata and the active
// holds (in its tail, below), and 8-byte fingerprints of the
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
	prints                 [ResidentPrints]uint64
	currency               [residentCurrency]byte // zero-padded
	nprints                uint8
	flags                  residentFlags
}

// A Resident holds no pointer (issue 27): a table of a million of them is
// memory the garbage collector never marks. What varies in size, the metadata
// and the active holds, goes in its tail, bytes the caller keeps beside it
// (nil for an account with neither), encoded by Compact and decoded by Into.

// ResidentPrints is how many of an account's most recent keys a Resident keeps
// the fingerprint of.
const ResidentPrints = 4

// residentCurrency is the longest currency a Resident holds (ValidCurrency's
// three letters): an account in a longer one is never compacted.
const residentCurrency = 3

type residentFlags uint8

const (
	resOpened residentFlags = 1 << iota
	resClosed
	resForgotKeys
	resForgotHolds
	resForgotRefunds
	resNoChain
)

// Compact is a's state as a Resident and its tail, print giving each recent
// key's fingerprint; ok is false when a holds something it may not forget (a
// key, closed hold or refunded original that no store lookup could find again:
// a pinned step, or any of them where a's limits keep all), when it has no
// events, when it is not the store's state (Account.Durable: it holds a
// decision the store has not confirmed, or a fold into it stopped half-way),
// when a time does not fit in Unix nanoseconds, or when its currency is
// longer than a Resident holds: what it forgets must be in the store, and
// what it keeps must be the store's.
func Compact(a *Account, print func(key string) uint64) (r Resident, tail []byte, ok bool) {
	if a.Revision < 0 || !a.Durable() || a.pinned > 0 || (a.KeyLimit == 0 && len(a.Keys) > 0) || !fitsCurrency(a.Currency) {
		return Resident{}, nil, false
	}
	r = Resident{balance: a.Balance, held: a.Held, overdraft: a.OverdraftLimit, revision: a.Revision, snapRev: a.SnapshotRevision}
	copy(r.currency[:], a.Currency)
	if r.flags, ok = compactFlags(a); !ok || !r.noteChain(a.LastChain) {
		return Resident{}, nil, false
	}
	if a.Opened {
		if r.effectiveFrom, ok = unixNano(a.EffectiveFrom); !ok {
			return Resident{}, nil, false
		}
	}
	if tail, ok = appendTail(nil, a); !ok {
		return Resident{}, nil, false
	}
	r.notePrints(a, print)
	return r, tail, true
}

// fitsCurrency reports whether a Resident holds c: at most residentCurrency
// bytes, none of them the zero byte its padding is.
func fitsCurrency(c string) bool {
	return len(c) <= residentCurrency && !strings.ContainsRune(c, 0)
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
	for _, sum := range a.Refunded.All() {
		if sum.Amount != 0 && (!sum.Findable || a.RefundLimit == 0) {
			return 0, false
		}
		f |= resForgotRefunds
	}
	return f, true
}

// appendTail appends a's metadata and active holds to tail, nothing when it
// has neither: the metadata's count plus one (0: nil) and its pairs in key
// order, then the active holds' count and each one's ID, key, amount, expiry
// (Unix nanoseconds, 0: never) and findability, in ID order. ok is false when
// an expiry does not fit in Unix nanoseconds.
func appendTail(tail []byte, a *Account) ([]byte, bool) {
	var holds []*Hold
	for _, h := range a.Holds {
		if h.Status == HoldStatusActive {
			holds = append(holds, h)
		}
	}
	if a.Metadata == nil && len(holds) == 0 {
		return tail, true
	}
	n := uint64(0)
	if a.Metadata != nil {
		n = uint64(len(a.Metadata)) + 1
	}
	tail = binary.AppendUvarint(tail, n)
	for _, k := range slices.Sorted(maps.Keys(a.Metadata)) {
		tail = appendString(appendString(tail, k), a.Metadata[k])
	}
	slices.SortFunc(holds, func(x, y *Hold) int { return strings.Compare(x.ID, y.ID) })
	tail = binary.AppendUvarint(tail, uint64(len(holds)))
	for _, h := range holds {
		exp := int64(0)
		if !h.ExpiresAt.IsZero() {
			var ok bool
			if exp, ok = unixNano(h.ExpiresAt); !ok || exp == 0 {
				return nil, false
			}
		}
		tail = appendString(appendString(tail, h.ID), h.Key)
		tail = binary.AppendVarint(binary.AppendVarint(tail, h.Amount), exp)
		tail = append(tail, boolByte(h.Findable))
	}
	return tail, true
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// tailReader reads a tail appendTail wrote; err is set at the first
// malformed field, and every read after it gives zero values.
type tailReader struct {
	b   []byte
	err error
}

var errResidentTail = errors.New("domain: malformed resident tail")

func (t *tailReader) uvarint() uint64 { return tailInt(t, binary.Uvarint) }
func (t *tailReader) varint() int64   { return tailInt(t, binary.Varint) }

// tailInt reads an integer of t with read (binary.Uvarint or Varint).
func tailInt[T uint64 | int64](t *tailReader, read func([]byte) (T, int)) T {
	v, n := read(t.b)
	if n <= 0 {
		t.err = errResidentTail
		return 0
	}
	t.b = t.b[n:]
	return v
}

func (t *tailReader) string() string {
	n := t.uvarint()
	if t.err != nil || n > uint64(len(t.b)) {
		t.err = errResidentTail
		return ""
	}
	s := string(t.b[:n])
	t.b = t.b[n:]
	return s
}

func (t *tailReader) byte() byte {
	if len(t.b) == 0 {
		t.err = errResidentTail
		return 0
	}
	c := t.b[0]
	t.b = t.b[1:]
	return c
}

// intoTail folds tail (appendTail) into a: its metadata and active holds.
func intoTail(a *Account, tail []byte) error {
	if len(tail) == 0 {
		return nil
	}
	t := &tailReader{b: tail}
	n := t.uvarint()
	if n > uint64(len(tail)) {
		return errResidentTail
	}
	if n > 0 {
		a.Metadata = make(map[string]string, n-1)
		for range n - 1 {
			k := t.string()
			a.Metadata[k] = t.string()
		}
	}
	holds := t.uvarint()
	for i := uint64(0); i < holds && t.err == nil; i++ {
		h := &Hold{ID: t.string(), Key: t.string(), Amount: t.varint(), Status: HoldStatusActive}
		if exp := t.varint(); exp != 0 {
			h.ExpiresAt = time.Unix(0, exp).UTC()
		}
		h.Findable = t.byte() == 1
		a.SetHold(h)
	}
	if t.err == nil && len(t.b) > 0 {
		t.err = errResidentTail
	}
	return t.err
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
// and its tail (Compact) hold: it decides every command as the aggregate r was
// made from would, reading from the store what r forgot. An error says the
// tail is not one Compact wrote; a is then not to be used.
func (r *Resident) Into(a *Account, tail []byte) error {
	a.Opened, a.Closed = r.flags&resOpened != 0, r.flags&resClosed != 0
	a.Currency = string(bytes.TrimRight(r.currency[:], "\x00"))
	a.Balance, a.Held, a.OverdraftLimit, a.Revision = r.balance, r.held, r.overdraft, r.revision
	a.durable = r.revision // a Resident is made of durable state only (Compact)
	a.SnapshotRevision = r.snapRev
	if r.flags&resNoChain == 0 {
		a.LastChain = hex.EncodeToString(r.chain[:])
	}
	if a.Opened {
		a.EffectiveFrom = time.Unix(0, r.effectiveFrom).UTC()
	}
	a.forgot = r.flags&resForgotKeys != 0
	a.forgotHolds = r.flags&resForgotHolds != 0
	a.forgotRefunds = r.flags&resForgotRefunds != 0
	a.keyPrints = slices.Clone(r.prints[:r.nprints])
	return intoTail(a, tail)
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
