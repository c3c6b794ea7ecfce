package domain

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
)

// EventRef names one written event in a reply.
type EventRef struct {
	ID       uuid.UUID `json:"id"`
	Stream   string    `json:"stream"`
	Revision uint64    `json:"revision"`
	Type     string    `json:"type"`
}

// AccountView is the account as a reply shows it.
type AccountView struct {
	AccountID string `json:"account_id"`
	Currency  string `json:"currency"`
	Balance   int64  `json:"balance"`
	Held      int64  `json:"held"`
	Available int64  `json:"available"`
	Revision  uint64 `json:"revision"`
}

// KeyRecord is what an aggregate remembers of every key it decided: enough to
// answer a retry with the original outcome, forever, without reading history.
// Aggregates keep one per key for good, so it holds no more than a duplicate's
// answer needs: the request's raw hash, not its canonical JSON (a conflict, which
// names the differing fields, reads the original request from the store: the
// metadata of the key's first event, Events[0]).
type KeyRecord struct {
	Key         string
	Command     CommandType
	RequestHash Hash // SHA-256 of the canonical request; zero when the metadata's was not one
	Status      Status
	Code        Code
	Message     string
	Events      []EventRef
	// pinned: never forgotten (Account.PinUnclaimedSteps).
	pinned bool
	// upTo: the key's debit had up_to (v1.2 §2.3); Amount is what it moved.
	upTo bool
	// after and ident are the account right after the command (After): its
	// balances here, its name and currency shared by all the account's records.
	after    afterCounts
	ident    *accountIdent
	Position string // global position of the command's last event in this stream
	// Amount is the amount of a refundable original (a deposit or withdrawal),
	// or what a debit with up_to moved (Moved); what was refunded of an
	// original is the account's (Account.Refunded).
	Amount int64
}

// afterCounts are the parts of an AccountView that change from command to command.
type afterCounts struct {
	balance, held int64
	revision      uint64
}

// accountIdent is what an account's records share of its view: never changed
// once made (an account that changes either gets a new one), so records copied
// out of an aggregate read it without its lock.
type accountIdent struct {
	id, currency string
}

// After is the account right after the command (account streams), as replies show it.
func (r *KeyRecord) After() AccountView {
	v := AccountView{Balance: r.after.balance, Held: r.after.held, Available: r.after.balance - r.after.held, Revision: r.after.revision}
	if r.ident != nil {
		v.AccountID, v.Currency = r.ident.id, r.ident.currency
	}
	return v
}

// EventsOrNone is the record's events; none for a nil record (a step that never ran).
func (r *KeyRecord) EventsOrNone() []EventRef {
	if r == nil {
		return nil
	}
	return r.Events
}

// DecidedFor is what the record's key was decided for (Judge); nil for a nil
// record. A record keeps only the request's hash: read reads the request
// itself, for a conflict's fields.
func (r *KeyRecord) DecidedFor(read func() ([]byte, error)) *Decided {
	if r == nil {
		return nil
	}
	return &Decided{Hash: r.RequestHash, Read: read}
}

// HoldStatus is the life of a hold.
type HoldStatus string

const (
	HoldStatusActive   HoldStatus = "active"
	HoldStatusCaptured HoldStatus = "captured"
	HoldStatusReleased HoldStatus = "released"
	HoldStatusExpired  HoldStatus = "expired"
)

// Hold is reserved money on an account.
type Hold struct {
	ID        string
	Amount    int64
	ExpiresAt time.Time // zero: never
	Status    HoldStatus
	Key       string // the key that placed it
	// Findable: its events carry the hold's subject (EventSubject), so that a
	// store that reads events by subject finds it once the aggregate forgot it.
	// A hold placed before events had subjects is never forgotten.
	Findable bool
	// closedRev is the revision of the event that closed it (0 when recalled
	// from the store, durable by then).
	closedRev int64
}

// HoldSubject is the subject of a hold's events (eventstore.SubjectReader).
func HoldSubject(holdID string) string { return "hold:" + holdID }

// RefundSubject is the subject of the refunds of an original (a deposit or
// withdrawal, by its key).
func RefundSubject(originalKey string) string { return "refund:" + originalKey }

// EventSubject is what an account event is about, for a store that finds a
// stream's events by subject: HoldSubject for the events of a hold,
// RefundSubject for a refund, "" for the others. It runs for every event
// written, on the decided value (or pointer) as it is.
func EventSubject(ev NewEvent) string {
	e, ok := ev.Data.(AccountEvent)
	if !ok {
		return ""
	}
	c := e.Change()
	switch {
	case c.Hold.ID != "":
		return HoldSubject(c.Hold.ID)
	case c.Moves:
		return refundSubject(c.Reason, c.Ref)
	}
	return ""
}

// refundSubject is the subject of a credit or debit: its original's refunds'
// when it is a refund (its ref is the original's key), else none.
func refundSubject(reason, ref string) string {
	if reason != ReasonRefund {
		return ""
	}
	return RefundSubject(ref)
}

// Account is the state of an account stream. Revision is -1 before any event.
type Account struct {
	// The fields that hold pointers come first, the scalars and flags after
	// them, so that the collector scans the fewest words of the one Account
	// an aggregate is (issue 23: the audit keeps one for every account).
	ID       string
	Currency string
	Metadata map[string]string
	Holds    map[string]*Hold
	// Keys are the records of the keys this aggregate decided most recently: all
	// of them when KeyLimit is 0, otherwise at most KeyLimit, the oldest forgotten
	// first. A key not here may still have been decided: the store knows
	// (RecallKey rebuilds its record from its events).
	Keys map[string]*KeyRecord
	// keyOrder lists Keys (but the pinned) in the order they were recorded: the
	// next to forget first.
	keyOrder fifo
	// keyPrints are the fingerprints of the recent keys of the Resident the
	// aggregate was made from (Into), which it holds no records of.
	keyPrints []uint64
	// closedOrder lists the forgettable closed holds in Holds in the order they
	// closed: the next to forget first. forgotHolds: one was forgotten, or the
	// aggregate came from a snapshot taken by an aggregate that forgot some.
	closedOrder fifo
	// Refunded is how much of each refunded original (a deposit or withdrawal,
	// by its key) has been refunded so far: all of them when RefundLimit is 0,
	// otherwise at most RefundLimit findable ones (and every unfindable one),
	// the first kept forgotten first. An original not here may still have
	// been refunded when ForgotRefunds: its refunds' subject finds them
	// (RecallRefunded). It is part of the state (snapshots carry it), since an
	// original's record may be forgotten.
	Refunded Refunds
	// refundOrder lists the findable entries of Refunded in the order they
	// were first kept: the next to forget first. forgotRefunds: one was
	// forgotten, or the aggregate came from a snapshot taken by an aggregate
	// that forgot some.
	refundOrder fifo
	// LastChain is the tamper-evidence chain hash of the last event (ChainHash).
	LastChain string
	// ident is the account's name and currency as its key records share them.
	ident *accountIdent
	// stream is the account's stream name as its first recorded event gave it: the
	// key records' event references share it rather than each event's own copy.
	stream string
	// EffectiveFrom is when the account opened in the world: its opening's
	// effective time (EffectiveTime). No command's effective_at is earlier.
	EffectiveFrom  time.Time
	OverdraftLimit int64
	Balance        int64
	Held           int64
	Revision       int64
	// KeyLimit bounds Keys (0: unbounded). Set it before folding events.
	KeyLimit int
	// pinned counts the steps PinUnclaimedSteps pinned.
	pinned int
	// HoldLimit bounds the closed holds Holds keeps (0: all of them): the active
	// ones are always kept, and the most recently closed ones up to HoldLimit;
	// an older closed hold is forgotten and found again by its events' subject
	// (RecallHold). Set it before folding events.
	HoldLimit int
	// RefundLimit bounds the findable entries Refunded keeps (0: all of
	// them). Set it before folding events.
	RefundLimit int
	// SnapshotRevision is the revision of the latest snapshot of this aggregate
	// that was loaded or taken, -1 for none: the ledger's bookkeeping of when the
	// next one is due, not part of the state.
	SnapshotRevision int64
	// durable is the revision up to which a is confirmed the store's state:
	// folded only from events read from the store (EvolveAccount on a state
	// durable before it), from a snapshot or a Resident, or confirmed by the
	// store's acceptance of an append of the decisions folded into it
	// (ForgetDurable). A decision folded ahead (EvolveAccountDecided) leaves
	// it behind Revision until then, for good when its append fails. torn: a
	// fold into a stopped half-way; nothing of a is confirmed again. Compact
	// makes a Resident of a durable aggregate only (Durable).
	durable int64
	Opened  bool
	Closed  bool
	// PinUnclaimedSteps keeps, beyond KeyLimit, the records of saga steps
	// written without a claim of their own (Metadata.Claimed unset): on a store
	// that finds a forgotten key only by its claim (KurrentDB), nothing else
	// could tell that such a step was decided. Set it with KeyLimit. Only steps
	// written before steps claimed their keys are pinned, so their number stops
	// growing. pinned counts them.
	PinUnclaimedSteps bool
	// forgot: some key decided on the stream may not be in Keys (one was
	// forgotten, or the aggregate was loaded from a snapshot, which has none).
	forgot bool
	// ForgetUnfindableHolds lets HoldLimit bound the closed holds placed
	// without a subject too (Hold.Findable unset), which no store lookup could
	// find again (RecallHold): only for a reader that never decides a command
	// on the aggregate (the audit's fold), or a history written before holds
	// had subjects keeps every closed hold of it. Set it before folding events.
	ForgetUnfindableHolds bool
	// forgotHolds: see closedOrder.
	forgotHolds bool
	// forgotRefunds: see refundOrder.
	forgotRefunds bool
	// torn: see durable.
	torn bool
	// decidedHead: the last event folded into a is one this process decided
	// (EvolveAccountDecided), not one read from the store.
	decidedHead bool
}

// DecidedHead reports whether the last event folded into a is one this
// process decided and folded as it wrote it (EvolveAccountDecided), rather
// than one read from the store: what the ledger counts of the residents it
// makes (a written account must become one once its append is confirmed).
func (a *Account) DecidedHead() bool { return a.decidedHead }

// Durable reports whether a is the store's state at its revision: every
// event folded into it was read from the store or confirmed written
// (ForgetDurable), and no fold into it stopped half-way. An aggregate that
// holds a decision the store refused never is.
func (a *Account) Durable() bool { return !a.torn && a.durable == a.Revision }

// NewAccount is the state of an account stream that has no events. Its
// maps (Holds, Keys) and Refunded's storage are made on first use, each
// written through one method (SetHold, remember, SetRefunded), and left nil
// again when emptied (ForgetKeys, ForgetClosedHold, Refunds.Delete): a reader of every
// account (the audit's fold keeps 200,000 and more) pays for none of them
// on an account that holds none (issue 23). Reading a nil map is reading an
// empty one.
func NewAccount(id string) *Account {
	return &Account{ID: id, Revision: -1, SnapshotRevision: -1, durable: -1}
}

// SetHold puts h into Holds by its ID: the one write of Holds, which it
// makes on first use (NewAccount).
func (a *Account) SetHold(h *Hold) {
	if a.Holds == nil {
		a.Holds = map[string]*Hold{}
	}
	a.Holds[h.ID] = h
}

// SetRefunded puts r into Refunded as originalKey's: the one write of
// Refunded, which makes its storage on first use (NewAccount).
func (a *Account) SetRefunded(originalKey string, r RefundedSum) {
	a.Refunded.set(originalKey, r)
}

// RefundedSum is what was refunded so far of one refunded original.
type RefundedSum struct {
	Amount int64
	// Findable: every refund of it carries its subject (RefundSubject), so
	// that a store that reads events by subject finds them all once the
	// aggregate forgot it. An original refunded before refunds had subjects is
	// never forgotten.
	Findable bool
	// rev is the revision of the refund that last changed it (0 when recalled
	// from the store, durable by then).
	rev int64
}

// Approximate heap bytes of an aggregate's parts, measured on aggregates folded
// from stored events (BenchmarkAccountHeapPerPart, 2026-11-26, two runs:
// 1,088-1,094 bytes for an account with one key record, 358 per key record,
// 195 per active hold and 214 per closed one (its place in the queue of those
// to forget), 130 per refunded original: its map entry, its 36-byte key and
// its place in that queue). The cache's memory budget adds them up
// (ApproxBytes), a hold at the larger of its two sizes. Measured again once
// the maps were made on first use (NewAccount; 2026-11-28, two runs): the
// account 1,056-1,061 bytes, the parts as before; AccountBaseBytes is left
// at 1,100, an upper bound still, so that the cache's budget (the ledger's
// behaviour) does not change.
const (
	AccountBaseBytes  = 1100
	KeyRecordBytes    = 360
	HoldBytes         = 215
	RefundedEntryByte = 130
)

// ApproxBytes estimates the heap an aggregate holds.
func (a *Account) ApproxBytes() int64 {
	n := AccountBaseBytes + len(a.Keys)*KeyRecordBytes + len(a.Holds)*HoldBytes + a.Refunded.Len()*RefundedEntryByte
	for k, v := range a.Metadata {
		n += 32 + len(k) + len(v)
	}
	return int64(n)
}

// Pinned is how many keys the aggregate keeps beyond KeyLimit
// (PinUnclaimedSteps): keys no store lookup could find again.
func (a *Account) Pinned() int { return a.pinned }

// ForgotHolds reports whether a hold placed on the stream may be missing from
// Holds (a closed one): when it does not, a hold not in Holds never existed.
func (a *Account) ForgotHolds() bool { return a.forgotHolds }

// ForgotRefunds reports whether a refunded original may be missing from
// Refunded: when it does not, an original not in Refunded was never refunded.
func (a *Account) ForgotRefunds() bool { return a.forgotRefunds }

// closed notes that a hold closed: a findable one (any one, with
// ForgetUnfindableHolds) joins the closed holds that may be forgotten, the
// oldest forgotten beyond HoldLimit.
func (a *Account) closed(h *Hold) {
	if !h.Findable && !a.ForgetUnfindableHolds {
		return
	}
	h.closedRev = a.Revision + 1 // the event being folded
	a.closedOrder.push(h.ID)
}

// ForgetDurable forgets the oldest closed holds beyond HoldLimit and the
// oldest refunded originals beyond RefundLimit whose last event (the hold's
// closure, the original's last refund) is at or below durable: one changed by
// an append still in flight stays until that append is durable, since the
// store could not show it yet. The ledger calls it once the store accepted the
// append of a decision it folded ahead (EvolveAccountDecided): it confirms a
// as the store's state up to durable (Durable).
//
// It raises the confirmed revision to durable without checking the revisions
// in between: that a confirmed append confirms every decision folded before
// it rests on the caller. The ledger passes only its own accepted append's
// last revision, or a.Revision only while the stream is drained (nothing in
// flight) and locked; and its committer kills the rest of a pipeline chain
// once one append of it is refused or fails (the dead chains of
// ledger.committer), so no later append of that chain is ever accepted to
// confirm the refused decision below it.
func (a *Account) ForgetDurable(durable int64) {
	a.durable = max(a.durable, durable)
	a.forgetDurable(durable)
}

func (a *Account) forgetDurable(durable int64) {
	a.forgetClosedHolds(durable)
	a.forgetRefunded(durable)
}

func (a *Account) forgetClosedHolds(durable int64) {
	for a.HoldLimit > 0 && a.closedOrder.len() > a.HoldLimit {
		h := a.Holds[a.closedOrder.peek()]
		if h != nil && h.closedRev > durable {
			return
		}
		delete(a.Holds, a.closedOrder.pop())
		a.forgotHolds = true
	}
}

// forgetRefunded is ForgetDurable for Refunded. An entry that turned
// unfindable after it was queued (a refund written without a subject, by an
// instance that did not write them yet) leaves the queue, not Refunded.
func (a *Account) forgetRefunded(durable int64) {
	for a.RefundLimit > 0 && a.refundOrder.len() > a.RefundLimit {
		r := a.Refunded.Of(a.refundOrder.peek())
		if r.Findable && r.rev > durable {
			return
		}
		key := a.refundOrder.pop()
		if r.Findable {
			a.Refunded.Delete(key)
			a.forgotRefunds = true
		}
	}
}

// fifo is a queue of names, the oldest first, that reuses its storage.
type fifo struct {
	names []string
	head  int // names[head] is the oldest
}

func (q *fifo) push(name string) { q.names = append(q.names, name) }

func (q *fifo) len() int { return len(q.names) - q.head }

// peek is the oldest name.
func (q *fifo) peek() string { return q.names[q.head] }

// drop removes name from the queue, if it is there; an emptied queue frees
// its storage.
func (q *fifo) drop(name string) {
	if i := slices.Index(q.names[q.head:], name); i >= 0 {
		q.names = slices.Delete(q.names, q.head+i, q.head+i+1)
	}
	if q.len() == 0 {
		*q = fifo{}
	}
}

// pop removes and returns the oldest name.
func (q *fifo) pop() string {
	name := q.names[q.head]
	q.names[q.head] = ""
	q.head++
	if q.head*2 >= len(q.names) { // reuse the forgotten half
		n := copy(q.names, q.names[q.head:])
		clear(q.names[n:])
		q.names, q.head = q.names[:n], 0
	}
	return name
}

// RecallHold puts back into Holds a closed hold the aggregate forgot, folded
// from its events (the store's events of its subject, in revision order); it
// does nothing when they hold no placement or the hold is known. The hold is
// then one of the most recently closed.
func (a *Account) RecallHold(events []StoredEvent) error {
	var h *Hold
	for _, ev := range events {
		if int64(ev.Revision) > a.Revision {
			// Another instance's event the aggregate has not folded: recalled,
			// the hold would be folded again on catching up.
			return fmt.Errorf("%w: %s: an event of a hold at revision %d, beyond the aggregate's %d", ErrRecallUnsettled, a.ID, ev.Revision, a.Revision)
		}
		payload, err := DecodeEvent(ev.Type, ev.Data)
		if err != nil {
			return err
		}
		switch e := payload.(type) {
		case *HoldPlaced:
			h = &Hold{ID: e.HoldID, Amount: e.Amount, Status: HoldStatusActive, Key: ev.Metadata.Key, Findable: true}
			if e.ExpiresAt != nil {
				h.ExpiresAt = *e.ExpiresAt
			}
		case *HoldCaptured:
			if h != nil {
				h.Status = HoldStatusCaptured
			}
		case *HoldReleased:
			if h != nil {
				h.Status = releasedStatus(e.Reason)
			}
		}
	}
	if h == nil || a.Holds[h.ID] != nil {
		return nil
	}
	if h.Status == HoldStatusActive {
		return fmt.Errorf("%w: %s: hold %s", ErrHoldInFlight, a.ID, h.ID)
	}
	a.SetHold(h)
	a.closed(h)
	h.closedRev = 0 // durable
	a.forgetClosedHolds(a.Revision)
	return nil
}

// ErrRecallUnsettled: what the store shows of a hold or a refunded original
// the aggregate forgot does not fit the aggregate, because appends to the
// stream have not settled (one in flight, or another instance's not folded
// yet). The caller decides again once they have, on the store's head.
var ErrRecallUnsettled = errors.New("domain: the store's events of what the aggregate forgot do not fit it (appends not settled)")

// ErrHoldInFlight: the store's events show active a hold that the aggregate
// no longer keeps, so closed: its closure is in an append not yet durable.
var ErrHoldInFlight = fmt.Errorf("%w: a forgotten hold is still active in the store (its closure is in flight)", ErrRecallUnsettled)

// RecallRefunded puts back into Refunded what was refunded of an original the
// aggregate forgot: the sum of its refunds, the store's events of its subject
// (RefundSubject) up to the aggregate's revision; an entry of 0 when there are
// none, which the refund decided next adds to (a refund of an original not
// kept is never folded into an aggregate that forgot some: see noteRefund).
// It does nothing when the original is kept or the aggregate forgot none.
// ErrRecallUnsettled when the store holds a refund beyond the aggregate's
// revision (another instance's): decide again on the store's head.
func (a *Account) RecallRefunded(originalKey string, events []StoredEvent) error {
	if _, kept := a.Refunded.Lookup(originalKey); kept || !a.forgotRefunds {
		return nil
	}
	var sum int64
	for _, ev := range events {
		if int64(ev.Revision) > a.Revision {
			return fmt.Errorf("%w: %s: a refund of %q at revision %d, beyond the aggregate's %d", ErrRecallUnsettled, a.ID, originalKey, ev.Revision, a.Revision)
		}
		amount, err := refundAmount(ev, originalKey)
		if err != nil {
			return err
		}
		sum += amount
	}
	a.SetRefunded(originalKey, RefundedSum{Amount: sum, Findable: true})
	a.refundOrder.push(originalKey)
	return nil
}

// refundAmount is the amount of a stored refund of originalKey.
func refundAmount(ev StoredEvent, originalKey string) (int64, error) {
	ref, amount, err := RefundOf(ev)
	if err != nil {
		return 0, err
	}
	if ref != originalKey {
		return 0, fmt.Errorf("domain: %s@%d is no refund of %q", ev.Stream, ev.Revision, originalKey)
	}
	return amount, nil
}

// RefundOf is the original (its key) a stored event refunds and the amount
// refunded; "" for an event that is no refund.
func RefundOf(ev StoredEvent) (originalKey string, amount int64, err error) {
	payload, err := DecodeEvent(ev.Type, ev.Data)
	if err != nil {
		return "", 0, err
	}
	originalKey, amount, _ = RefundPayload(payload)
	return originalKey, amount, nil
}

// RefundPayload is RefundOf for an event's decoded data (DecodeEvent's
// pointer form): ok is false for an event that is no refund.
func RefundPayload(payload any) (originalKey string, amount int64, ok bool) {
	var reason string
	switch e := payload.(type) {
	case *Credited:
		reason, originalKey, amount = e.Reason, e.Ref, e.Amount
	case *Debited:
		reason, originalKey, amount = e.Reason, e.Ref, e.Amount
	}
	if reason != ReasonRefund {
		return "", 0, false
	}
	return originalKey, amount, true
}

// releasedStatus is the status a release leaves.
func releasedStatus(reason string) HoldStatus {
	if reason == ReasonHoldExpired {
		return HoldStatusExpired
	}
	return HoldStatusReleased
}

// Forgot reports whether a key decided on the stream may be missing from Keys:
// when it does not, a key not in Keys was never decided here.
func (a *Account) Forgot() bool { return a.forgot }

// ForgetKeys forgets every key record the aggregate keeps but the pinned ones
// (PinUnclaimedSteps), as KeyLimit forgets the oldest: a reader that needs no
// record once its command's events are folded (the audit's fold) keeps none
// between commands. Keys is then nil, so that what the old map grew to is
// freed (remember makes one again).
func (a *Account) ForgetKeys() { a.ForgetKeysInto(nil) }

// SpareKeys is the storage of one aggregate's emptied Keys (its map and the
// queue of their order), handed by a reader that forgets each aggregate's
// keys after each command to the next command it folds, of any aggregate
// (ForgetKeysInto, UseSpareKeys): it then makes a map per aggregate that
// keeps keys at once, not one per command (issue 23: the audit's fold made
// a map of 8 slots and a queue for every command, some 230 bytes and 3
// objects, its largest garbage an event), and keeps no map per account
// between commands. What the aggregates hold is the same either way.
type SpareKeys struct {
	m     map[string]*KeyRecord
	names []string
}

// ForgetKeysInto is ForgetKeys, the emptied storage of Keys kept in spare
// (nil: freed) when none is kept there already.
func (a *Account) ForgetKeysInto(spare *SpareKeys) {
	if a.keyOrder.len() == 0 {
		return
	}
	if a.pinned == 0 {
		if spare != nil && spare.m == nil {
			clear(a.Keys)
			clear(a.keyOrder.names)
			spare.m, spare.names = a.Keys, a.keyOrder.names[:0]
		}
		a.Keys = nil
	} else {
		for a.keyOrder.len() > 0 {
			delete(a.Keys, a.keyOrder.pop())
		}
	}
	a.keyOrder, a.forgot = fifo{}, true
}

// ForgetClosedHold forgets hold id if it is closed, whatever HoldLimit: a
// reader that keeps apart what it needs of a closed hold (the audit's fold
// keeps its ID, status and a digest of the rest) keeps none of them. The
// account says it forgot holds (ForgotHolds) only when dropped: the reader
// keeps nothing of this hold, or has just dropped what it kept apart of an
// earlier one; a hold kept apart is not forgotten, so that a snapshot that
// lacks it is still named. Holds left empty is then nil, so that what the
// old map grew to is freed (ForgetKeys).
func (a *Account) ForgetClosedHold(id string, dropped bool) {
	if h := a.Holds[id]; h == nil || h.Status == HoldStatusActive {
		return
	}
	delete(a.Holds, id)
	if len(a.Holds) == 0 {
		a.Holds = nil
	}
	a.closedOrder.drop(id)
	a.forgotHolds = a.forgotHolds || dropped
}

// UseSpareKeys gives a the storage spare keeps (ForgetKeysInto) when a keeps
// no key: what its next key record is remembered in.
func (a *Account) UseSpareKeys(spare *SpareKeys) {
	if a.Keys != nil || a.keyOrder.names != nil || spare.m == nil {
		return
	}
	a.Keys, a.keyOrder = spare.m, fifo{names: spare.names}
	*spare = SpareKeys{}
}

// remember adds a key's record to Keys, forgetting the oldest beyond
// KeyLimit: the one write of Keys, which it makes on first use (NewAccount).
func (a *Account) remember(rec *KeyRecord) {
	if a.Keys == nil {
		a.Keys = map[string]*KeyRecord{}
	}
	if old, known := a.Keys[rec.Key]; !known {
		if rec.pinned {
			a.pinned++
		} else {
			a.keyOrder.push(rec.Key)
		}
	} else {
		rec.pinned = old.pinned // counted once, as first recorded
	}
	a.Keys[rec.Key] = rec
	for a.KeyLimit > 0 && len(a.Keys)-a.pinned > a.KeyLimit {
		delete(a.Keys, a.keyOrder.pop())
		a.forgot = true
	}
}

// activeHold names an active hold of the account, "" when it has none.
func (a *Account) activeHold() string {
	for id, h := range a.Holds {
		if h.Status == HoldStatusActive {
			return id
		}
	}
	return ""
}

// Status is the account's status as the read models show it (the status the
// last AccountChange that named one gave it); "" before it opens.
func (a *Account) Status() AccountStatus {
	switch {
	case a.Closed:
		return AccountStatusClosed
	case a.Opened:
		return AccountStatusOpen
	}
	return ""
}

// Available is balance minus held.
func (a *Account) Available() int64 { return a.Balance - a.Held }

// View is the account as replies show it.
func (a *Account) View() AccountView {
	rev := uint64(0)
	if a.Revision >= 0 {
		rev = uint64(a.Revision)
	}
	return AccountView{AccountID: a.ID, Currency: a.Currency, Balance: a.Balance, Held: a.Held, Available: a.Available(), Revision: rev}
}

// Decision is what Decide concluded. Exactly one of Events (applied, or a recorded
// rejection whose single event is CommandRejected), Rejection without events (not
// recorded) or Invalid is meaningful.
type Decision struct {
	Events    []NewEvent
	Rejection *Rejection
	Invalid   *InvalidError
}

// Applied reports whether the decision moves money or changes state.
func (d Decision) Applied() bool { return d.Rejection == nil && d.Invalid == nil }

func reject(cmd Command, code Code, recorded bool, format string, args ...any) Decision {
	r := &Rejection{Code: code, Message: fmt.Sprintf(format, args...), Recorded: recorded}
	d := Decision{Rejection: r}
	if recorded {
		d.Events = []NewEvent{{Type: EvCommandRejected, Data: CommandRejected{Command: string(cmd.Type), Code: code, Message: r.Message}}}
	}
	return d
}

func apply(events ...NewEvent) Decision { return Decision{Events: events} }

// DecideAccount decides a command against an account. It does not look at keys:
// the caller answers known keys from a.Keys first (KeyRecord.Verdict). A refund
// reads its original's record from a.Keys: the caller recalls it there first
// when the aggregate has forgotten it.
func DecideAccount(a *Account, cmd Command) Decision {
	return stampAfter(a, decideAccount(a, cmd))
}

// stampAfter writes into a recorded refusal the account as it leaves it.
func stampAfter(a *Account, d Decision) Decision {
	if len(d.Events) == 1 {
		if r, ok := d.Events[0].Data.(CommandRejected); ok {
			r.BalanceAfter, r.HeldAfter = ptr(a.Balance), ptr(a.Held)
			d.Events[0].Data = r
		}
	}
	return d
}

func ptr(v int64) *int64 { return &v }

func decideAccount(a *Account, cmd Command) Decision {
	if !cmd.Type.IsClient() {
		// a step of a command checked where it was decided (DecideTransferAtomically)
	} else if ierr := a.CheckEffective(cmd); ierr != nil {
		return Decision{Invalid: ierr}
	}
	if cmd.Type == CmdOpenAccount {
		if a.Opened {
			return reject(cmd, CodeAccountExists, true, "account %s already exists", a.ID)
		}
		return apply(NewEvent{EvAccountOpened, AccountOpened{AccountID: cmd.AccountID, Currency: cmd.Currency, OverdraftLimit: cmd.OverdraftLimit, Metadata: cmd.Metadata}})
	}
	if !a.Opened {
		return reject(cmd, CodeAccountNotFound, false, "account %s does not exist", a.ID)
	}
	if cmd.HasExpectedRevision && cmd.ExpectedRevision != a.Revision {
		return reject(cmd, CodeRevisionMismatch, true, "account %s is at revision %d, not the expected %d", a.ID, a.Revision, cmd.ExpectedRevision)
	}
	switch cmd.Type {
	case CmdDeposit, CmdTransferCredit:
		reason := cmd.Reason
		if cmd.Type == CmdDeposit {
			reason = ReasonDeposit
		}
		return a.decideCredit(cmd, movement{cmd.Amount, cmd.Currency, reason, cmd.Ref}, false)
	case CmdTransferCompensate:
		// Compensation returns money that left this account; it is never refused,
		// not even by a close that happened in between.
		return a.decideCredit(cmd, movement{cmd.Amount, cmd.Currency, cmd.Reason, cmd.Ref}, true)
	case CmdWithdraw, CmdTransferDebit:
		reason := cmd.Reason
		if cmd.Type == CmdWithdraw {
			reason = ReasonWithdrawal
		}
		return a.decideDebit(cmd, movement{cmd.Amount, cmd.Currency, reason, cmd.Ref})
	case CmdPlaceHold, CmdCaptureGuard:
		return a.decidePlaceHold(cmd)
	case CmdTransactionReserve:
		return a.decideTransactionReserve(cmd)
	case CmdTransactionLeg:
		return a.decideReservedLegs(cmd)
	case CmdCaptureHold:
		d := a.decideCaptureHold(cmd)
		if cmd.ToRefusal != nil && d.Rejection == nil {
			return refuseCaptureTo(cmd, cmd.ToRefusal)
		}
		return d
	case CmdCaptureCredit:
		return a.decideCaptureCredit(cmd)
	case CmdReleaseHold, CmdExpireHold:
		return a.decideReleaseHold(cmd)
	case CmdRefund:
		return a.decideRefund(cmd)
	case CmdCloseAccount:
		if a.Closed {
			return reject(cmd, CodeAccountClosed, true, "account %s is already closed", a.ID)
		}
		if a.Balance != 0 || a.Held != 0 {
			return reject(cmd, CodeAccountNotEmpty, true, "account %s has balance %d and held %d", a.ID, a.Balance, a.Held)
		}
		if id := a.activeHold(); id != "" { // a transaction's reservation of nothing (it only credits the account)
			return reject(cmd, CodeAccountNotEmpty, true, "account %s has hold %s active", a.ID, id)
		}
		return apply(NewEvent{EvAccountClosed, AccountClosed{AccountID: a.ID}})
	}
	return Decision{Invalid: invalid("type", "command %s does not apply to an account", cmd.Type)}
}

// movement is one entry a decision writes on an account: how much, in which
// currency, why (the entry's reason) and what it refers to (its ref).
type movement struct {
	amount      int64
	currency    string
	reason, ref string
}

func (a *Account) decideCredit(cmd Command, m movement, compensation bool) Decision {
	if a.Closed && !compensation {
		return reject(cmd, CodeAccountClosed, true, "account %s is closed", a.ID)
	}
	if m.currency != a.Currency {
		return reject(cmd, CodeCurrencyMismatch, true, "account %s holds %s, not %s", a.ID, a.Currency, m.currency)
	}
	bal, ok := addMinor(a.Balance, m.amount)
	if !ok {
		return reject(cmd, CodeAmountOverflow, true, "balance of %s would leave the int64 range", a.ID)
	}
	return apply(NewEvent{EvCredited, Credited{Amount: m.amount, Currency: m.currency, Reason: m.reason, Ref: m.ref, BalanceAfter: bal, HeldAfter: ptr(a.Held), Metadata: cmd.Metadata}})
}

func (a *Account) decideDebit(cmd Command, m movement) Decision {
	if a.Closed {
		return reject(cmd, CodeAccountClosed, true, "account %s is closed", a.ID)
	}
	amount, currency := m.amount, m.currency
	if currency != a.Currency {
		return reject(cmd, CodeCurrencyMismatch, true, "account %s holds %s, not %s", a.ID, a.Currency, currency)
	}
	var requested *int64
	if cmd.UpTo {
		if a.Available() <= 0 {
			return reject(cmd, CodeInsufficientFunds, true, "account %s has %d available (its overdraft is not swept), up to %d requested", a.ID, a.Available(), amount)
		}
		requested, amount = ptr(amount), min(amount, a.Available())
	}
	bal, ok := subMinor(a.Balance, amount)
	if !ok {
		return reject(cmd, CodeAmountOverflow, true, "balance of %s would leave the int64 range", a.ID)
	}
	if !a.withinOverdraft(bal - a.Held) {
		return reject(cmd, CodeInsufficientFunds, true, "account %s has %d available (overdraft limit %d), %d requested", a.ID, a.Available(), a.OverdraftLimit, amount)
	}
	return apply(NewEvent{EvDebited, Debited{Amount: amount, Currency: currency, Reason: m.reason, Ref: m.ref, BalanceAfter: bal, HeldAfter: ptr(a.Held), Metadata: cmd.Metadata, Requested: requested}})
}

// RefuseStep is the recorded refusal of an internal step on an account, for a
// reason found elsewhere (the other account of an atomic transfer refused its
// part), with the account as it stands.
func RefuseStep(a *Account, cmd Command, code Code, message string) Decision {
	return stampAfter(a, reject(cmd, code, true, "%s", message))
}

// DecideCaptureTo decides a capture_hold with `to` against the held account and
// the account credited: the capture, and the credit of what it captures to `to`
// (as a transfer's credit is allowed: open, same currency), or a refusal of both
// recorded on the held account. Neither account is changed.
func DecideCaptureTo(held, to *Account, cmd Command) (capture, credit Decision) {
	if ierr := to.CheckEffective(cmd); ierr != nil {
		return Decision{Invalid: ierr}, Decision{}
	}
	capture = DecideAccount(held, cmd)
	if len(capture.Events) != 1 || capture.Rejection != nil || capture.Invalid != nil {
		return capture, Decision{}
	}
	if !to.Opened {
		return refuseCaptureTo(cmd, MissingAccount(to.ID)), Decision{}
	}
	c := capture.Events[0].Data.(HoldCaptured)
	credit = to.decideCredit(Command{Metadata: cmd.Metadata}, movement{c.Amount, c.Currency, ReasonCaptureIn, cmd.HoldID}, false)
	if r := credit.Rejection; r != nil {
		return stampAfter(held, refuseCaptureTo(cmd, r)), Decision{}
	}
	return capture, credit
}

// withinOverdraft reports whether an available amount respects the overdraft limit.
func (a *Account) withinOverdraft(available int64) bool { return available >= -a.OverdraftLimit }

func (a *Account) decidePlaceHold(cmd Command) Decision {
	if a.Closed {
		return reject(cmd, CodeAccountClosed, true, "account %s is closed", a.ID)
	}
	if cmd.Currency != a.Currency {
		return reject(cmd, CodeCurrencyMismatch, true, "account %s holds %s, not %s", a.ID, a.Currency, cmd.Currency)
	}
	if _, exists := a.Holds[cmd.HoldID]; exists {
		return reject(cmd, CodeHoldExists, true, "hold %s already exists on %s", cmd.HoldID, a.ID)
	}
	if !cmd.ExpiresAt.IsZero() && !cmd.ExpiresAt.After(cmd.At) {
		return Decision{Invalid: invalid("expires_at", "must be in the future (the ledger's time is %s)", cmd.At.UTC().Format(time.RFC3339))}
	}
	held, ok := addMinor(a.Held, cmd.Amount)
	if !ok {
		return reject(cmd, CodeAmountOverflow, true, "held amount of %s would leave the int64 range", a.ID)
	}
	if avail, ok := subMinor(a.Balance, held); !ok || !a.withinOverdraft(avail) {
		return reject(cmd, CodeInsufficientFunds, true, "account %s has %d available, hold of %d requested", a.ID, a.Available(), cmd.Amount)
	}
	ev := HoldPlaced{HoldID: cmd.HoldID, Amount: cmd.Amount, Currency: cmd.Currency, HeldAfter: held, BalanceAfter: ptr(a.Balance), Metadata: cmd.Metadata}
	if !cmd.ExpiresAt.IsZero() {
		t := cmd.ExpiresAt.UTC()
		ev.ExpiresAt = &t
	}
	return apply(NewEvent{EvHoldPlaced, ev})
}

// expired reports whether an active hold has passed its expiry at t.
func (h *Hold) expired(t time.Time) bool { return !h.ExpiresAt.IsZero() && !t.Before(h.ExpiresAt) }

func (a *Account) decideCaptureHold(cmd Command) Decision {
	h, ok := a.Holds[cmd.HoldID]
	if !ok {
		return reject(cmd, CodeHoldNotFound, true, "hold %s does not exist on %s", cmd.HoldID, a.ID)
	}
	if h.Status == HoldStatusExpired || (h.Status == HoldStatusActive && h.expired(cmd.At)) {
		return reject(cmd, CodeHoldExpired, true, "hold %s expired at %s", h.ID, h.ExpiresAt.Format(time.RFC3339))
	}
	if h.Status != HoldStatusActive {
		return reject(cmd, CodeHoldNotActive, true, "hold %s is %s", h.ID, h.Status)
	}
	amount := h.Amount
	if cmd.HasAmount {
		if cmd.Amount > h.Amount {
			return reject(cmd, CodeInsufficientFunds, true, "capture of %d exceeds hold %s of %d", cmd.Amount, h.ID, h.Amount)
		}
		amount = cmd.Amount
	}
	return apply(NewEvent{EvHoldCaptured, HoldCaptured{
		HoldID: h.ID, Amount: amount, Released: h.Amount - amount, Currency: a.Currency,
		BalanceAfter: a.Balance - amount, HeldAfter: a.Held - h.Amount, To: cmd.To, Metadata: cmd.Metadata,
	}})
}

func (a *Account) decideReleaseHold(cmd Command) Decision {
	internal := cmd.Type == CmdExpireHold
	h, ok := a.Holds[cmd.HoldID]
	if !ok {
		return reject(cmd, CodeHoldNotFound, !internal, "hold %s does not exist on %s", cmd.HoldID, a.ID)
	}
	if h.Status != HoldStatusActive {
		return reject(cmd, CodeHoldNotActive, !internal, "hold %s is %s", h.ID, h.Status)
	}
	reason := ReasonHoldReleased
	if internal {
		if !h.expired(cmd.At) {
			return reject(cmd, CodeHoldNotActive, false, "hold %s does not expire before %s", h.ID, h.ExpiresAt.Format(time.RFC3339))
		}
		reason = ReasonHoldExpired
	}
	return apply(NewEvent{EvHoldReleased, HoldReleased{HoldID: h.ID, Amount: h.Amount, Reason: reason, HeldAfter: a.Held - h.Amount, BalanceAfter: ptr(a.Balance)}})
}

// decideRefund refunds a deposit (money goes back out) or a withdrawal (money
// comes back in) that this account decided under cmd.OriginalKey.
func (a *Account) decideRefund(cmd Command) Decision {
	orig, ok := a.Keys[cmd.OriginalKey]
	if !ok {
		return reject(cmd, CodeOriginalNotFound, false, "no command with key %q on %s", cmd.OriginalKey, a.ID)
	}
	if orig.Status != StatusApplied || (orig.Command != CmdDeposit && orig.Command != CmdWithdraw) {
		return reject(cmd, CodeNotRefundable, true, "%s %q (%s) cannot be refunded", orig.Command, cmd.OriginalKey, orig.Status)
	}
	remaining := orig.Amount - a.Refunded.Of(cmd.OriginalKey).Amount
	amount := remaining
	if cmd.HasAmount {
		amount = cmd.Amount
	}
	if amount <= 0 || amount > remaining {
		return reject(cmd, CodeRefundExceedsOriginal, true, "refund of %d exceeds the %d still refundable of %q", amount, remaining, cmd.OriginalKey)
	}
	if orig.Command == CmdDeposit {
		return a.decideDebit(cmd, movement{amount, a.Currency, ReasonRefund, cmd.OriginalKey})
	}
	if a.Closed {
		return reject(cmd, CodeAccountClosed, true, "account %s is closed", a.ID)
	}
	return a.decideCredit(cmd, movement{amount, a.Currency, ReasonRefund, cmd.OriginalKey}, false)
}

// EvolveAccount applies a stored event to the account, in place: an aggregate that
// remembers every key is too large to copy per event. Events must come in stream
// order; a gap or a foreign stream is an error (the caller's invariant broke).
func EvolveAccount(a *Account, ev StoredEvent) error {
	if err := a.nextRevision(ev); err != nil {
		return err
	}
	payload, err := DecodeEvent(ev.Type, ev.Data)
	if err != nil {
		return err
	}
	wasDurable := a.Durable()
	if err := a.fold(ev, payload); err != nil {
		return err
	}
	if wasDurable { // a stored event on the store's state: still the store's
		a.durable = a.Revision
	}
	a.forgetDurable(a.Revision) // a stored event is durable
	a.decidedHead = false
	return nil
}

// EvolveAccountDecided is EvolveAccount for an event this process has just written:
// payload is its decided data (the NewEvent's Data that ev.Data encodes, a value or
// a pointer), folded as it is rather than decoded again from ev.Data.
func EvolveAccountDecided(a *Account, ev StoredEvent, payload any) error {
	if err := a.nextRevision(ev); err != nil {
		return err
	}
	a.decidedHead = true
	return a.fold(ev, payload)
}

func (a *Account) nextRevision(ev StoredEvent) error {
	if int64(ev.Revision) != a.Revision+1 {
		return fmt.Errorf("domain: %s: event at revision %d after revision %d", ev.Stream, ev.Revision, a.Revision)
	}
	return nil
}

func (a *Account) fold(ev StoredEvent, payload any) error {
	e, err := asAccountEvent(payload)
	if err == nil {
		err = e.foldAccount(a, ev.Metadata)
	}
	if err != nil {
		a.torn = true // what it changed before it stopped is no one's state
		return fmt.Errorf("domain: %s@%d: %w", ev.Stream, ev.Revision, err)
	}
	a.Revision = int64(ev.Revision)
	a.LastChain = ev.Metadata.Chain
	a.record(ev, e)
	return nil
}

// asAccountEvent is payload as an account event, decoded or decided; an error
// when it is another stream's.
func asAccountEvent(payload any) (AccountEvent, error) {
	e, ok := payload.(AccountEvent)
	if !ok {
		return nil, fmt.Errorf("event %T does not belong to an account stream", payload)
	}
	return e, nil
}

// moved folds a credit or debit e (a Debited as its Credited) that leaves the
// balance at bal.
func (a *Account) moved(bal int64, e Credited, m Metadata) error {
	if err := a.stated("held_after", e.HeldAfter, a.Held); err != nil {
		return err
	}
	a.Balance = bal
	a.noteRefund(e.Reason, e.Ref, e.Amount, m.Subject != "")
	return nil
}

// stated checks an amount an event states the account has (nil in events
// written before it was stated) against the fold's.
func (a *Account) stated(field string, stated *int64, fold int64) error {
	if stated != nil && *stated != fold {
		return fmt.Errorf("%s %d does not match the account's %d", field, *stated, fold)
	}
	return nil
}

// noteRefund adds a refund to what was refunded of its original; findable:
// the refund carries its subject. An original not kept by an aggregate that
// forgot some stays out of Refunded: what was refunded of it before is not
// known here, and the store, which holds this refund (a stored event), is read
// before its next refund is decided (RecallRefunded; the refund the ledger
// decides itself it recalls first).
func (a *Account) noteRefund(reason, originalKey string, amount int64, findable bool) {
	if reason != ReasonRefund {
		return
	}
	r, kept := a.Refunded.Lookup(originalKey)
	if !kept {
		if a.forgotRefunds {
			return
		}
		r.Findable = findable
		if findable {
			a.refundOrder.push(originalKey)
		}
	}
	r.Amount += amount
	r.Findable = r.Findable && findable
	r.rev = a.Revision + 1 // the event being folded
	a.SetRefunded(originalKey, r)
}

// record adds an event to the key record of the command that wrote it; e is
// the event's data, decoded or as decided.
func (a *Account) record(ev StoredEvent, e AccountEvent) {
	m := ev.Metadata
	rec := a.Keys[m.Key]
	if rec == nil || m.Index == 0 {
		h := &recordWithEvent{rec: KeyRecord{Key: m.Key, Command: internCommand(m.Command), RequestHash: ParseHash(m.RequestHash), Status: StatusApplied, Code: CodeOK,
			pinned: a.PinUnclaimedSteps && m.Origin != "" && !m.Claimed}}
		rec = &h.rec
		rec.Events = h.first[:0:1]
		a.remember(rec)
	}
	if a.stream != ev.Stream {
		a.stream = ev.Stream
	}
	rec.Events = append(rec.Events, EventRef{ID: ev.ID, Stream: a.stream, Revision: ev.Revision, Type: internEventType(ev.Type)})
	rec.Position = ev.Position
	rec.note(e.Change())
	rec.after, rec.ident = afterCounts{balance: a.Balance, held: a.Held, revision: ev.Revision}, a.identity()
}

// identity is the account's name and currency as its records share them.
func (a *Account) identity() *accountIdent {
	if a.ident == nil || a.ident.id != a.ID || a.ident.currency != a.Currency {
		a.ident = &accountIdent{id: a.ID, currency: a.Currency}
	}
	return a.ident
}

// recordWithEvent is a key record allocated with room for its first event: most
// commands write one, which then lies beside the record (one object, not two).
type recordWithEvent struct {
	rec   KeyRecord
	first [1]EventRef
}

// noteAmount remembers the amount of a refundable original (deposits and withdrawals).
func (rec *KeyRecord) noteAmount(amount int64) {
	if rec.Command == CmdDeposit || rec.Command == CmdWithdraw {
		rec.Amount = amount
	}
}

// internCommand is a command type as the package constant when it is one, so that
// the records of an aggregate read from a store share it rather than each keeping
// the copy its metadata was decoded into.
func internCommand(c string) CommandType {
	switch t := CommandType(c); t {
	case CmdOpenAccount:
		return CmdOpenAccount
	case CmdDeposit:
		return CmdDeposit
	case CmdWithdraw:
		return CmdWithdraw
	case CmdPlaceHold:
		return CmdPlaceHold
	case CmdCaptureHold:
		return CmdCaptureHold
	case CmdReleaseHold:
		return CmdReleaseHold
	case CmdRefund:
		return CmdRefund
	case CmdCloseAccount:
		return CmdCloseAccount
	case CmdTransferDebit:
		return CmdTransferDebit
	case CmdTransferCredit:
		return CmdTransferCredit
	case CmdTransferCompensate:
		return CmdTransferCompensate
	case CmdExpireHold:
		return CmdExpireHold
	default:
		return t
	}
}
