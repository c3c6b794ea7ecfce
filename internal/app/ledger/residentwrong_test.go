package ledger

import (
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestAWrongResidentIsCaughtByTheAudit: a resident whose balance is not its
// stream's fold (planted here: 1,000 more than the store's 10) makes the
// ledger decide against it: a withdrawal of 500 the store's state refuses is
// applied, and its Debited states a balance_after the stream's fold does not
// give. Nothing in the write path sees it (the revision is the store's); the
// audit does: its fold of the stream (domain.EvolveAccount, invariant 3)
// refuses the stated balance_after, as `ledger audit` (internal/app/audit's
// fold) and the chaos checker's C4 (that fold) and C5 (its replay decides a
// refusal where the store has a Debited) do over a real store; the money's
// conservation (invariant 2) catches it too, second. The test fails when the
// planted resident does not reach the decision (the withdrawal refused), when
// the fold's balance_after check is off (the audit then names the
// conservation) and when the audit passes such a history.
func TestAWrongResidentIsCaughtByTheAudit(t *testing.T) {
	s, st := residentService(t, 3, 1, Options{})
	stream := domain.AccountStream("r0")
	res := s.residents.take(stream)
	if !res.ok {
		t.Fatal("r0 not resident")
	}
	acc := s.newAccount("r0")
	if err := res.Into(acc, res.tail); err != nil {
		t.Fatal(err)
	}
	if acc.Balance != 10 {
		t.Fatalf("r0's resident holds balance %d, want the store's 10", acc.Balance)
	}
	acc.Balance += 1000
	wrong, tail, ok := domain.Compact(acc, s.residents.print)
	if !ok || !s.residents.put(stream, resident{wrong, tail, res.origin, true}) {
		t.Fatal("the wrong resident was not kept")
	}

	r := post(t, s, "withdraw", `{"idempotency_key":"w-wrong","account_id":"r0","amount":500,"currency":"EUR"}`)
	if r.Status != domain.StatusApplied || r.Account == nil || r.Account.Balance != 510 {
		t.Fatalf("withdrawal on the wrong resident: %+v, want applied at balance 510 (the plant did not reach the decision)", r)
	}
	got := devtest.Failure(t, func(tb testing.TB) { audit(tb, st, true) })
	if !strings.Contains(got, "balance_after 510") {
		t.Fatalf("the audit failed with %q, want it to name the stated balance_after 510", got)
	}
	t.Log(got)
}
