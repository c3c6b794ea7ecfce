package domain

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Snapshots (ARCHITECTURE: hot accounts and long histories) let a cold load read
// an account's state at a revision and only the events after it. They are an
// optimisation, never a source of truth: a snapshot of another version, whose
// hash does not match its state, or whose chain is not the stream's at its
// revision is ignored, and the account is folded from its events.

// SnapshotVersion is the layout of a snapshot's state. A snapshot of any other
// version is ignored (and replaced by the next one taken).
// Version 2: holds say whether they are findable, and an aggregate that forgot
// closed holds says so. Since, within version 2: the findable refunded
// originals are listed, and an aggregate that forgot some says so (a snapshot
// written before lists none: every original it holds is kept for good).
// Version 3: the account's effective opening (Account.EffectiveFrom, v1.2
// §2.3); a version 2 snapshot is ignored and the stream folded once.
const SnapshotVersion = 3

// snapshot is a snapshot as stored: its state's exact bytes and their hash.
type snapshot struct {
	Version  int             `json:"v"`
	Stream   string          `json:"stream"`
	Revision uint64          `json:"revision"`
	Chain    string          `json:"chain"` // the chain hash of the event at Revision
	Hash     string          `json:"hash"`  // hex SHA-256 of State
	State    json.RawMessage `json:"state"`
}

// snapshotState is the account's state: everything but its recent keys, which
// the store answers for (RecallKey).
type snapshotState struct {
	ID             string            `json:"id"`
	Opened         bool              `json:"opened"`
	Closed         bool              `json:"closed"`
	Currency       string            `json:"currency"`
	OverdraftLimit int64             `json:"overdraft_limit"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Balance        int64             `json:"balance"`
	Held           int64             `json:"held"`
	Holds          []snapshotHold    `json:"holds"`
	Refunded       map[string]int64  `json:"refunded"`
	// ForgotHolds: closed holds are missing (found by their subject).
	ForgotHolds bool `json:"forgot_holds,omitempty"`
	// FindableRefunds lists the originals of Refunded that are findable
	// (RefundedSum.Findable), in order; ForgotRefunds: refunded originals are
	// missing (found by their refunds' subject).
	FindableRefunds []string `json:"findable_refunds,omitempty"`
	ForgotRefunds   bool     `json:"forgot_refunds,omitempty"`
	// EffectiveFrom is Account.EffectiveFrom; nil before the account opened.
	EffectiveFrom *time.Time `json:"effective_from,omitempty"`
}

type snapshotHold struct {
	ID        string     `json:"id"`
	Amount    int64      `json:"amount"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Status    HoldStatus `json:"status"`
	Key       string     `json:"key"`
	Findable  bool       `json:"findable,omitempty"`
}

// EncodeSnapshot is the snapshot of a at its revision, in stream. The account
// must have events (a snapshot of nothing is nothing).
func EncodeSnapshot(stream string, a *Account) ([]byte, error) {
	if a.Revision < 0 {
		return nil, fmt.Errorf("domain: %s: no snapshot of a stream without events", stream)
	}
	return encodeState(stream, uint64(a.Revision), a.LastChain, a.snapshotState())
}

// encodeState is the snapshot of state st at revision rev, whose event has
// chain hash chain, in stream.
func encodeState(stream string, rev uint64, chain string, st snapshotState) ([]byte, error) {
	state, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(state)
	return json.Marshal(snapshot{Version: SnapshotVersion, Stream: stream, Revision: rev, Chain: chain, Hash: hex.EncodeToString(sum[:]), State: state})
}

func (a *Account) snapshotState() snapshotState {
	st := snapshotState{ID: a.ID, Opened: a.Opened, Closed: a.Closed, Currency: a.Currency, OverdraftLimit: a.OverdraftLimit,
		Metadata: a.Metadata, Balance: a.Balance, Held: a.Held, Holds: make([]snapshotHold, 0, len(a.Holds)), Refunded: make(map[string]int64, a.Refunded.Len()),
		ForgotHolds: a.forgotHolds, ForgotRefunds: a.forgotRefunds}
	if a.Opened {
		t := a.EffectiveFrom.UTC()
		st.EffectiveFrom = &t
	}
	for _, h := range a.Holds {
		sh := snapshotHold{ID: h.ID, Amount: h.Amount, Status: h.Status, Key: h.Key, Findable: h.Findable}
		if !h.ExpiresAt.IsZero() {
			t := h.ExpiresAt.UTC()
			sh.ExpiresAt = &t
		}
		st.Holds = append(st.Holds, sh)
	}
	slices.SortFunc(st.Holds, func(x, y snapshotHold) int { return strings.Compare(x.ID, y.ID) })
	for k, r := range a.Refunded.All() {
		if r.Amount == 0 {
			continue // recalled for a refund that was refused: as good as forgotten
		}
		st.Refunded[k] = r.Amount
		if r.Findable {
			st.FindableRefunds = append(st.FindableRefunds, k)
		}
	}
	slices.Sort(st.FindableRefunds)
	return st
}

// DecodeSnapshot is the account a snapshot of stream holds, at its revision, with
// no recent keys. It fails when the snapshot is not one of stream, of this
// version, or its state does not match its hash. The caller still checks that
// the stream's event at the revision has the snapshot's chain (SnapshotChain).
func DecodeSnapshot(stream string, b []byte) (*Account, error) {
	var s snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("domain: snapshot of %s: %w", stream, err)
	}
	if s.Version != SnapshotVersion {
		return nil, fmt.Errorf("domain: snapshot of %s: version %d, not %d", stream, s.Version, SnapshotVersion)
	}
	if s.Stream != stream {
		return nil, fmt.Errorf("domain: snapshot of %s names stream %q", stream, s.Stream)
	}
	if sum := sha256.Sum256(s.State); hex.EncodeToString(sum[:]) != s.Hash {
		return nil, fmt.Errorf("domain: snapshot of %s@%d: its state does not match its hash", stream, s.Revision)
	}
	var st snapshotState
	dec := json.NewDecoder(bytes.NewReader(s.State))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("domain: snapshot of %s@%d: %w", stream, s.Revision, err)
	}
	if err := st.check(stream); err != nil {
		return nil, fmt.Errorf("domain: snapshot of %s@%d: %w", stream, s.Revision, err)
	}
	a := NewAccount(st.ID)
	a.Opened, a.Closed, a.Currency, a.OverdraftLimit, a.Metadata = st.Opened, st.Closed, st.Currency, st.OverdraftLimit, st.Metadata
	a.Balance, a.Held, a.Revision, a.LastChain = st.Balance, st.Held, int64(s.Revision), s.Chain
	a.durable = a.Revision // a snapshot is of the store's state (its chain is checked by the caller)
	a.forgot = true        // a snapshot keeps no keys
	if st.EffectiveFrom != nil {
		a.EffectiveFrom = *st.EffectiveFrom
	}
	a.forgotHolds = st.ForgotHolds
	for _, h := range st.Holds {
		hold := &Hold{ID: h.ID, Amount: h.Amount, Status: h.Status, Key: h.Key, Findable: h.Findable}
		if h.ExpiresAt != nil {
			hold.ExpiresAt = *h.ExpiresAt
		}
		a.SetHold(hold)
		if hold.Status != HoldStatusActive && hold.Findable {
			a.closedOrder.push(h.ID) // in ID order: the order they closed in is not kept
		}
	}
	a.forgotRefunds = st.ForgotRefunds
	for k, v := range st.Refunded {
		a.SetRefunded(k, RefundedSum{Amount: v})
	}
	for _, k := range st.FindableRefunds { // in key order: the order they were kept in is not kept
		r, ok := a.Refunded.Lookup(k)
		if !ok || r.Findable {
			return nil, fmt.Errorf("domain: snapshot of %s@%d: findable refund of %q not refunded, or listed twice", stream, s.Revision, k)
		}
		r.Findable = true
		a.SetRefunded(k, r)
		a.refundOrder.push(k)
	}
	return a, nil
}

// check refuses a state EncodeSnapshot never writes: its account not the
// stream's, a hold without an ID, of an unknown status, or listed twice, a
// hold of a negative amount (an active hold of 0 is the ledger's own: a
// capture saga's guard on the account it credits, a transaction's reservation
// on an account its postings only credit; the audit's checkpoint rows carry a
// closed hold it forgot as a stub of amount 0), a held amount that is not the
// sum of the active holds' (every hold event moves held by its hold's amount,
// and an active hold is never forgotten, so the fold keeps them equal: a
// forged held would make funds available that are held, or refuse what is
// not), a refunded original without a key or of a sum not positive. A snapshot
// is a cold load's starting point, checked against the stream's fold only by
// the audit, and compared there on what both keep (SameState): a refunded sum
// of 0 would read as an original refunded nothing, then refunded again in
// full, and the comparison, which drops sums of 0, would not see it. The
// findable refunds are checked as they are read (DecodeSnapshot).
func (st *snapshotState) check(stream string) error {
	if AccountStream(st.ID) != stream {
		return fmt.Errorf("holds account %q", st.ID)
	}
	seen := make(map[string]bool, len(st.Holds))
	var active int64
	for _, h := range st.Holds {
		ok := true
		if h.Status == HoldStatusActive {
			active, ok = addMinor(active, h.Amount)
		}
		switch {
		case !ok:
			return fmt.Errorf("active holds summing beyond the int64 range")
		case h.ID == "" || seen[h.ID]:
			return fmt.Errorf("hold %q without an ID or listed twice", h.ID)
		case h.Status != HoldStatusActive && h.Status != HoldStatusCaptured && h.Status != HoldStatusReleased && h.Status != HoldStatusExpired:
			return fmt.Errorf("hold %q of status %q", h.ID, h.Status)
		case h.Amount < 0:
			return fmt.Errorf("hold %q (%s) of amount %d", h.ID, h.Status, h.Amount)
		}
		seen[h.ID] = true
	}
	if active != st.Held {
		return fmt.Errorf("held %d, its active holds %d", st.Held, active)
	}
	for k, v := range st.Refunded {
		if k == "" || v <= 0 {
			return fmt.Errorf("refunded %d of original %q: a refunded sum is of a named original and positive", v, k)
		}
	}
	return nil
}

// SameState reports whether two aggregates of one account hold the same state
// (everything a snapshot keeps), and if not, what differs: the audit's check of a
// snapshot against the fold of its stream.
func SameState(x, y *Account) (bool, string) {
	if x.Revision != y.Revision || x.LastChain != y.LastChain {
		return false, fmt.Sprintf("revision %d chain %s, the stream's %d chain %s", x.Revision, x.LastChain, y.Revision, y.LastChain)
	}
	xs, ys := x.snapshotState(), y.snapshotState()
	// Either may have forgotten closed holds and refunded originals that the
	// other keeps (each bounded by its own limits, or one not at all), if it
	// says so: compare what both keep.
	for _, diff := range []string{keepHoldsOf(x, &ys), keepHoldsOf(y, &xs), keepRefundsOf(x, y, &ys), keepRefundsOf(y, x, &xs)} {
		if diff != "" {
			return false, diff
		}
	}
	xs.ForgotHolds, ys.ForgotHolds, xs.ForgotRefunds, ys.ForgotRefunds = false, false, false, false
	bx, err1 := json.Marshal(xs)
	by, err2 := json.Marshal(ys)
	if err1 != nil || err2 != nil || !bytes.Equal(bx, by) {
		return false, fmt.Sprintf("state %s, the stream's %s", bx, by)
	}
	return true, ""
}

// keepHoldsOf leaves in os the holds keeper keeps, and those it cannot forget
// (the active, and the unfindable unless it forgets those too,
// ForgetUnfindableHolds); "" unless keeper forgot some and does not
// say so.
func keepHoldsOf(keeper *Account, os *snapshotState) string {
	kept := os.Holds[:0:0]
	for _, h := range os.Holds {
		if _, in := keeper.Holds[h.ID]; in || h.Status == HoldStatusActive || (!h.Findable && !keeper.ForgetUnfindableHolds) {
			kept = append(kept, h)
		}
	}
	if len(kept) < len(os.Holds) && !keeper.forgotHolds {
		return fmt.Sprintf("%d closed holds missing from an aggregate that says it forgot none", len(os.Holds)-len(kept))
	}
	os.Holds = kept
	return ""
}

// keepRefundsOf is keepHoldsOf for the refunded originals of other's state
// os (the unfindable are never forgotten).
func keepRefundsOf(keeper, other *Account, os *snapshotState) string {
	kept := make(map[string]int64, len(os.Refunded))
	for k, v := range os.Refunded {
		if r, in := keeper.Refunded.Lookup(k); (in && r.Amount != 0) || !other.Refunded.Of(k).Findable {
			kept[k] = v
		}
	}
	if len(kept) < len(os.Refunded) && !keeper.forgotRefunds {
		return fmt.Sprintf("%d refunded originals missing from an aggregate that says it forgot none", len(os.Refunded)-len(kept))
	}
	findable := os.FindableRefunds[:0:0]
	for _, k := range os.FindableRefunds {
		if _, in := kept[k]; in {
			findable = append(findable, k)
		}
	}
	os.Refunded, os.FindableRefunds = kept, findable
	return ""
}
