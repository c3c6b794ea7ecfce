package domain

import "fmt"

// SnapshotAgreesWithHead checks a, the account a snapshot holds
// (DecodeSnapshot), against the stream's event at the snapshot's revision, of
// type typ and payload data: the balance and held amounts the event states
// (balance_after, held_after; an account opens and closes empty) are a's, and
// the hold the event places, captures or releases has in a the status the
// event leaves it in (a closed one may be missing when a says it forgot
// closed holds). A snapshot's hash proves only that it was not changed after
// it was written, and its chain that it sits on the stream's history at its
// revision; this is what a cold load can check of its state at the cost of
// decoding one event it reads anyway. With check (held is the active holds'
// sum), the active holds' total is pinned to what the stream says; a closed
// hold shown active whose amount another active hold gives up, or one closed
// before the event at the revision, is seen only by folding the stream (the
// audit's comparison, SameState).
func SnapshotAgreesWithHead(a *Account, typ string, data []byte) error {
	payload, err := DecodeEvent(typ, data)
	if err != nil {
		return err
	}
	e, err := asAccountEvent(payload)
	if err != nil {
		return err
	}
	c := e.Change()
	switch {
	case c.Balance.Known && c.Balance.Value != a.Balance:
		return fmt.Errorf("domain: balance %d, the %s at its revision %d", a.Balance, typ, c.Balance.Value)
	case c.Held.Known && c.Held.Value != a.Held:
		return fmt.Errorf("domain: held %d, the %s at its revision %d", a.Held, typ, c.Held.Value)
	case c.Hold.ID == "":
		return nil
	}
	h := a.Holds[c.Hold.ID]
	if (h == nil && (c.Hold.Status == HoldStatusActive || !a.forgotHolds)) || (h != nil && h.Status != c.Hold.Status) {
		return fmt.Errorf("domain: hold %s is %v, the %s at its revision leaves it %s", c.Hold.ID, holdStatusOf(h), typ, c.Hold.Status)
	}
	return nil
}

// holdStatusOf is h's status, "missing" for none.
func holdStatusOf(h *Hold) HoldStatus {
	if h == nil {
		return "missing"
	}
	return h.Status
}
