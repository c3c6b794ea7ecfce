package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/ledgerworks/ledger/domain"
)

// TestLendRefundedLeavesTheAccountAsItWas: lendRefunded lends the fold's
// account, which forgot refunded originals, a snapshot's unfindable one and
// takes it back. An account that keeps none (Refunded holding no storage:
// domain.Account makes it on first use) is left so, not with an emptied
// slice or map (bytes an account so checked); one that keeps another keeps it as it was.
func TestLendRefundedLeavesTheAccountAsItWas(t *testing.T) {
	snap := domain.NewAccount("r")
	snap.SetRefunded("k", domain.RefundedSum{Amount: 5})
	for name, refunded := range map[string]string{"none kept": `{}`, "one kept": `{"j":7}`} {
		a := forgetfulAccount(t, refunded)
		was, none := a.Refunded.Map(), reflect.DeepEqual(a.Refunded, domain.Refunds{})
		back := lendRefunded(snap, a)
		if got := a.Refunded.Of("k"); got.Amount != 5 || a.Refunded.Len() != len(was)+1 {
			t.Fatalf("%s: lent %+v, refunded %v", name, got, a.Refunded)
		}
		back()
		if reflect.DeepEqual(a.Refunded, domain.Refunds{}) != none || !reflect.DeepEqual(a.Refunded.Map(), was) {
			t.Errorf("%s: refunded %#v after the loan, %v before", name, a.Refunded, was)
		}
	}
}

// forgetfulAccount is account r as a snapshot that says it forgot refunded
// originals, keeping refunded (JSON: original -> sum, not findable), decodes.
func forgetfulAccount(t *testing.T, refunded string) *domain.Account {
	t.Helper()
	state := json.RawMessage(`{"id":"r","opened":true,"closed":false,"currency":"EUR","overdraft_limit":0,"balance":0,"held":0,"holds":[],"refunded":` +
		refunded + `,"forgot_refunds":true}`)
	sum := sha256.Sum256(state)
	b, err := json.Marshal(map[string]any{"v": domain.SnapshotVersion, "stream": domain.AccountStream("r"), "revision": 1, "chain": "", "hash": hex.EncodeToString(sum[:]), "state": state})
	if err != nil {
		t.Fatal(err)
	}
	a, err := domain.DecodeSnapshot(domain.AccountStream("r"), b)
	if err != nil || !a.ForgotRefunds() {
		t.Fatalf("%v, forgot refunds: %v", err, a != nil && a.ForgotRefunds())
	}
	return a
}
