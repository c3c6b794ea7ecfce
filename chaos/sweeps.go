package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
)

// checkMoved is C4 for sweeps (PROTOCOL.md v1.2 §2.3): every definite reply of
// a withdrawal or transfer with up_to that applied says what moved, the same
// in every reply, and that is what the store moved (the withdrawal's debit,
// the transfer's completion); a refusal, or a command without up_to, says
// nothing moved. With the fold's checks (a sweep moves at most what it asked,
// never into the overdraft, less only when it took all that was available;
// a saga's steps move what it records), money is conserved with the moved
// amounts.
func checkMoved(keys map[string]*keyState, byKey map[string][]*stored, r *Report) {
	for k, ks := range keys {
		if len(ks.acked) == 0 || (ks.typ != string(domain.CmdWithdraw) && ks.typ != string(domain.CmdTransfer)) {
			continue
		}
		upTo := bytes.Contains(ks.firstBody, []byte(`"up_to":true`))
		moved, found := movedInStore(ks.typ, byKey[k])
		for _, rep := range ks.acked {
			switch {
			case rep.Status != domain.StatusApplied && rep.Moved != nil:
				r.fail(4, "key %q: %s, yet the reply says %d moved", k, rep.Code, *rep.Moved)
			case rep.Status != domain.StatusApplied:
			case upTo != (rep.Moved != nil):
				r.fail(4, "key %q (up_to %v): applied with moved %v", k, upTo, rep.Moved)
			case upTo && (!found || *rep.Moved != moved):
				r.fail(4, "key %q: the reply says %d moved, the store moved %d (found %v)", k, *rep.Moved, moved, found)
			}
		}
	}
}

// movedInStore is what a withdrawal's or transfer's events moved: its debit,
// or its transfer's completion.
func movedInStore(typ string, es []*stored) (int64, bool) {
	for _, e := range es {
		var v struct {
			Amount int64 `json:"amount"`
		}
		ours := (typ == string(domain.CmdWithdraw) && e.Type == domain.EvDebited && e.own()) ||
			(typ == string(domain.CmdTransfer) && e.Type == domain.EvTransferCompleted)
		if ours && json.Unmarshal(e.Data, &v) == nil {
			return v.Amount, true
		}
	}
	return 0, false
}

// Conditions sums up the workload's conditional writes and sweeps (v1.2 §2.3)
// by their first definite reply: the sweeps that moved all they asked, less
// (all that was available) or nothing (insufficient_funds); the writes with
// expected_revision that applied, and those refused revision_mismatch; the
// money commands booked late (effective_at) that applied; and the workload's
// refunds: applied, and refused refund_exceeds_original or otherwise.
func (h *History) Conditions() string {
	var full, partial, empty, condApplied, mismatch, backdated int
	refunds := map[string]int{}
	for _, ks := range h.Keys() {
		if len(ks.acked) == 0 {
			continue
		}
		var f struct {
			Amount   int64  `json:"amount"`
			UpTo     bool   `json:"up_to"`
			Expected *int64 `json:"expected_revision"`
			// Effective: an open_account's or a late booking's (v1.2 §2.3).
			Effective string `json:"effective_at"`
			Original  string `json:"original_key"` // a refund's
		}
		if json.Unmarshal(ks.firstBody, &f) != nil {
			continue
		}
		rep := ks.acked[0]
		switch {
		case f.UpTo && rep.Moved != nil && *rep.Moved == f.Amount:
			full++
		case f.UpTo && rep.Moved != nil:
			partial++
		case f.UpTo && rep.Code == domain.CodeInsufficientFunds:
			empty++
		}
		switch {
		case f.Original != "" && rep.Status == domain.StatusApplied:
			refunds["applied"]++
		case f.Original != "" && rep.Code == domain.CodeRefundExceedsOriginal:
			refunds["exceeds"]++
		case f.Original != "":
			refunds["other"]++
		}
		if f.Effective != "" && f.Amount > 0 && rep.Status == domain.StatusApplied {
			backdated++
		}
		switch {
		case f.Expected != nil && rep.Status == domain.StatusApplied:
			condApplied++
		case f.Expected != nil && rep.Code == domain.CodeRevisionMismatch:
			mismatch++
		}
	}
	return fmt.Sprintf("sweeps (up_to): %d moved all they asked, %d less (all available), %d nothing (insufficient_funds); expected_revision: %d applied, %d revision_mismatch; booked late (effective_at): %d applied; refunds: %d applied, %d refund_exceeds_original, %d refused otherwise",
		full, partial, empty, condApplied, mismatch, backdated, refunds["applied"], refunds["exceeds"], refunds["other"])
}
