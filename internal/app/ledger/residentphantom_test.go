package ledger

import (
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestAPhantomResidentIsCaughtByTheAudit: the ledger serving an account
// from a resident its stream never held (planted here: r0's resident, at
// the same revision, put under r1's stream) decides against that state: a
// withdrawal of r1's whole balance by r0's reckoning (15, where r1's stream
// holds 17) is applied at balance 0. The expected revision is the stream's,
// so the append is accepted; the audit's fold of r1's stream refuses the
// stated balance_after (invariant 3), as in TestAWrongResidentIsCaughtByTheAudit.
// (A phantom for an account with no stream never decides: the append's
// expected revision is refused and the command is decided again on the
// store's head, account_not_found.) The test fails when the phantom does
// not reach the decision (the withdrawal applied at 2) and when the audit
// passes such a history.
func TestAPhantomResidentIsCaughtByTheAudit(t *testing.T) {
	s, st := residentService(t, 4, 1, Options{})
	mustApply(t, s, "deposit", `{"idempotency_key":"p0","account_id":"r0","amount":5,"currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"p1","account_id":"r1","amount":7,"currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"p2","account_id":"r2","amount":1,"currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"p3","account_id":"r3","amount":1,"currency":"EUR"}`)
	r0, r1 := domain.AccountStream("r0"), domain.AccountStream("r1")
	phantom, own := s.residents.take(r0), s.residents.take(r1)
	if !phantom.ok || !own.ok || phantom.Revision() != own.Revision() {
		t.Fatalf("r0 and r1 resident at one revision: %v %v, revisions %d and %d", phantom.ok, own.ok, phantom.Revision(), own.Revision())
	}
	if !s.residents.put(r1, phantom) {
		t.Fatal("the phantom was not kept")
	}

	r := post(t, s, "withdraw", `{"idempotency_key":"w-phantom","account_id":"r1","amount":15,"currency":"EUR"}`)
	if r.Status != domain.StatusApplied || r.Account == nil || r.Account.Balance != 0 {
		t.Fatalf("withdrawal on the phantom: %+v, want applied at balance 0 (the phantom did not reach the decision)", r)
	}
	got := devtest.Failure(t, func(tb testing.TB) { audit(tb, st, true) })
	if !strings.Contains(got, "balance_after 0") {
		t.Fatalf("the audit failed with %q, want it to name the stated balance_after 0", got)
	}
	t.Log(got)
}
