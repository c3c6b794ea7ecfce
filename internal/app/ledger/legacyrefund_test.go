package ledger

import (
	"fmt"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestRefundsWithoutSubjectCountOnceForgotten: an original refunded without
// a subject (by a build before refunds had one, as a rolling upgrade leaves
// after refunds with subjects) that a new instance's aggregate meets after it
// forgot some refunded originals is not kept by it (domain.Account's
// noteRefund), so its next refund recalls the original by its subject
// (domain.RecallRefunded): the store must find that refund too, or the
// original is refunded beyond its amount. Migration 00027 gives every
// refund stored without a subject its subject (the test applies it again
// after writing the old build's refund, as an upgrade from that build does).
// Shown failing on eb5ab02 on PostgreSQL and memory alike (the refund of 50
// accepted: 110 refunded of 100); after 00027 it runs on PostgreSQL only: a
// memory store holds no history an earlier build wrote.
func TestRefundsWithoutSubjectCountOnceForgotten(t *testing.T) {
	st := devtest.Postgres(t)
	opts := Options{Clock: devtest.NewClock().Now, RecentRefunds: 1}
	const acc = "legacy-refund"
	svc := New(st, opts)
	postAs(t, svc, acc, "open_account", `{'idempotency_key':'ACC-o','account_id':'ACC','currency':'EUR'}`)
	for i := 1; i <= 3; i++ {
		postAs(t, svc, acc, "deposit", fmt.Sprintf(`{'idempotency_key':'ACC-d%d','account_id':'ACC','amount':100,'currency':'EUR'}`, i))
	}
	for i := 1; i <= 2; i++ {
		if r := postAs(t, svc, acc, "refund", fmt.Sprintf(`{'idempotency_key':'ACC-f%d','original_key':'ACC-d%d','amount':10}`, i, i)); r.Code != domain.CodeOK {
			t.Fatalf("refund of d%d: %+v", i, r)
		}
	}
	svc.Close()
	devtest.AppendLegacyRefund(t, st, acc, acc+"-f3", acc+"-d3", 60)
	devtest.MigrateAgain(t, st.Pool(), 26)

	fresh := New(st, opts) // a new instance: its aggregate forgets d1 before it meets d3's refund
	defer fresh.Close()
	if r := postAs(t, fresh, acc, "refund", `{'idempotency_key':'ACC-g3','original_key':'ACC-d3','amount':50}`); r.Code != domain.CodeRefundExceedsOriginal {
		t.Fatalf("a refund of 50 of d3, 60 of its 100 refunded without a subject: %+v", r)
	}
	if r := postAs(t, fresh, acc, "refund", `{'idempotency_key':'ACC-h3','original_key':'ACC-d3','amount':40}`); r.Code != domain.CodeOK {
		t.Fatalf("a refund of the 40 left of d3: %+v", r)
	}
	a, err := fresh.loadAccount(t.Context(), domain.AccountStream(acc), acc, true)
	if err != nil {
		t.Fatal(err)
	}
	if !a.ForgotRefunds() {
		t.Fatal("the aggregate forgot no refunded original: d3 was kept, not recalled")
	}
}
