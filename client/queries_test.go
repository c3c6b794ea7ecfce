package client_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// Every query against a ledger on PostgreSQL with its read side: results
// decoded, a write read back with its position, not_found and invalid as
// QueryErrors.
func TestQueries(t *testing.T) {
	ns, dbURL := devtest.NATS(t), devtest.DatabaseURL(t)
	ledgerOn(t, ns, devtest.Store(t, dbURL), dbURL)
	c := client.New(devtest.Connect(t, ns))
	q := c.Queries()
	ctx := ctxFor(t, 2*time.Minute)
	open(t, c, "alice", 1_000)
	open(t, c, "bob", 0)
	tr, err := c.Transfer(ctx, client.Transfer{Key: "t-1", TransferID: "tr-1", From: "alice", To: "bob", Amount: 300, Currency: "EUR", Metadata: map[string]string{"invoice": "42"}})
	if err != nil || tr.Status != client.StatusApplied {
		t.Fatalf("transfer: %+v %v", tr, err)
	}
	tx, err := c.PostTransaction(ctx, client.PostTransaction{Key: "tx-1", TransactionID: "txn-1", Postings: []client.Posting{{From: "bob", To: "alice", Amount: 50, Currency: "EUR"}}})
	if err != nil || tx.Status != client.StatusApplied {
		t.Fatalf("transaction: %+v %v", tx, err)
	}

	acc, err := q.Account(ctx, client.AccountQuery{AccountID: "bob", MinPosition: tx.Position})
	if err != nil || acc.Balance != 250 || acc.Status != "open" || acc.Currency != "EUR" {
		t.Fatalf("account bob: %+v %v; want balance 250, open", acc, err)
	}
	ents, err := q.Entries(ctx, client.EntriesQuery{AccountID: "alice", MinPosition: tx.Position})
	if err != nil || len(ents.Entries) != 3 || ents.Entries[1].Amount != -300 || ents.Entries[1].TransferID != "tr-1" || ents.Entries[1].Metadata["invoice"] != "42" {
		t.Fatalf("entries of alice: %+v %v", ents, err)
	}
	limit := 1
	page, err := q.Entries(ctx, client.EntriesQuery{AccountID: "alice", Limit: limit})
	if err != nil || len(page.Entries) != 1 || page.NextAfterRevision == nil {
		t.Fatalf("a page of one: %+v %v", page, err)
	}
	st, err := q.Transfer(ctx, client.TransferQuery{TransferID: "tr-1", MinPosition: tx.Position})
	if err != nil || st.Status != "completed" || st.Amount != 300 || st.From != "alice" {
		t.Fatalf("transfer: %+v %v", st, err)
	}
	det, err := q.Transaction(ctx, "txn-1")
	if err != nil || det.Status != "posted" || len(det.Postings) != 1 || det.Key != "tx-1" {
		t.Fatalf("transaction: %+v %v", det, err)
	}
	rev := int64(1)
	bal, err := q.Balance(ctx, client.BalanceQuery{AccountID: "alice", Revision: &rev, MinPosition: tx.Position})
	if err != nil || bal.Balance != 1_000 || bal.AsOfRevision != 1 {
		t.Fatalf("balance of alice at revision 1: %+v %v; want 1000", bal, err)
	}
	// By effective time (§2.3): nothing was booked late, so every entry is
	// effective when recorded, and the balance effective now is the balance.
	soon, hourAgo := time.Now().Add(time.Minute), time.Now().Add(-time.Hour)
	eff, err := q.Entries(ctx, client.EntriesQuery{AccountID: "alice", From: &hourAgo, To: &soon, By: "effective"})
	if err != nil || len(eff.Entries) != 3 || eff.Entries[1].EffectiveAt != eff.Entries[1].At {
		t.Fatalf("entries of alice by effective time: %+v %v", eff, err)
	}
	byEff, err := q.Balance(ctx, client.BalanceQuery{AccountID: "alice", EffectiveAt: &soon})
	if err != nil || byEff.Balance != 750 || byEff.AsOfEffective == "" || byEff.AsOfRevision != 0 || byEff.AsOf != "" {
		t.Fatalf("balance of alice effective now: %+v %v; want 750", byEff, err)
	}
	orig, err := q.Command(ctx, "t-1")
	if err != nil || orig.Status != client.StatusApplied || orig.Transfer == nil || orig.Duplicate {
		t.Fatalf("command t-1: %+v %v", orig, err)
	}

	_, err = q.Command(ctx, "never-sent")
	var qe *client.QueryError
	if !errors.Is(err, client.ErrNotFound) || !errors.As(err, &qe) || qe.Code != client.CodeNotFound {
		t.Fatalf("an unknown key: %v, want a QueryError not_found", err)
	}
	_, err = q.Account(ctx, client.AccountQuery{AccountID: "not valid!"})
	if !errors.As(err, &qe) || qe.Code != client.CodeInvalidRequest || errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a malformed query: %v, want a QueryError invalid_request", err)
	}
	_, err = q.Transfer(ctx, client.TransferQuery{TransferID: "no-such"})
	if !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("an unknown transfer: %v, want not_found", err)
	}

	// ledger.v1.query.balances (v1.2): a group's sums now and as of a time.
	sums, err := q.Balances(ctx, client.BalancesQuery{Prefix: "al", MinPosition: tx.Position})
	want := []client.CurrencyBalance{{Currency: "EUR", Balance: 750, Available: 750, Accounts: 1}}
	if err != nil || sums.Prefix != "al" || !reflect.DeepEqual(sums.Balances, want) || sums.ProjectedPosition == "" {
		t.Fatalf("balances of al: %+v %v; want %+v", sums, err, want)
	}
	at, err := time.Parse(time.RFC3339Nano, bal.AsOf)
	if err != nil {
		t.Fatal(err)
	}
	sums, err = q.Balances(ctx, client.BalancesQuery{Prefix: "al", At: &at, MinPosition: tx.Position})
	want[0].Balance, want[0].Available = 1_000, 1_000
	if err != nil || !reflect.DeepEqual(sums.Balances, want) || sums.AsOf != at.UTC().Format(time.RFC3339Nano) {
		t.Fatalf("balances of al as of %s: %+v %v; want %+v", bal.AsOf, sums, err, want)
	}
	now := time.Now()
	sums, err = q.Balances(ctx, client.BalancesQuery{Prefix: "al", EffectiveAt: &now, MinPosition: tx.Position})
	want[0].Balance, want[0].Available = 750, 750
	if err != nil || !reflect.DeepEqual(sums.Balances, want) || sums.AsOfEffective != now.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano) || sums.AsOf != "" {
		t.Fatalf("balances of al by effective time now: %+v %v; want %+v", sums, err, want)
	}
	_, err = q.Balances(ctx, client.BalancesQuery{Prefix: "al%"})
	if !errors.As(err, &qe) || qe.Code != client.CodeInvalidRequest || !reflect.DeepEqual(qe.Fields, []string{"prefix"}) {
		t.Fatalf("a prefix with %%: %v, want invalid_request naming prefix", err)
	}
}
