package client_test

import (
	"testing"
	"time"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// The fields of §2.3 the ledger serves, through the client: a write that
// expects the account's revision applies, one that expects another is
// rejected with CodeRevisionMismatch (recorded: the revision moves on, and a
// resend answers it again); a withdrawal and a transfer with UpTo move what is
// available and say how much in Moved, the same on a resend; sent again with
// another ExpectedRevision or without UpTo, a key is a conflict naming the field.
func TestSection23ConditionsAndSweeps(t *testing.T) {
	ns, url := devtest.NATS(t), devtest.DatabaseURL(t)
	ledgerOn(t, ns, devtest.Store(t, url), url) // PostgreSQL, with the read side for query.transfer
	c := client.New(devtest.Connect(t, ns))
	ctx := ctxFor(t, time.Minute)
	open(t, c, "merchant", 500) // revisions 0 and 1
	open(t, c, "payout", 0)
	send := func(cmd client.Command) client.Reply {
		t.Helper()
		r, err := c.Send(ctx, cmd)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	stale, current := int64(0), int64(1)
	r := send(client.Deposit{Key: "d-stale", AccountID: "merchant", Amount: 1, Currency: "EUR", ExpectedRevision: &stale})
	if r.Status != client.StatusRejected || r.Code != client.CodeRevisionMismatch || r.Account == nil || r.Account.Revision != 2 || r.Account.Balance != 500 {
		t.Fatalf("a stale expected revision: %+v %+v", r, r.Account)
	}
	r = send(client.Deposit{Key: "d-current", AccountID: "merchant", Amount: 1, Currency: "EUR", ExpectedRevision: &current})
	if r.Status != client.StatusRejected || r.Code != client.CodeRevisionMismatch {
		t.Fatalf("the recorded mismatch did not move the revision on: %+v", r)
	}
	current = 3
	r = send(client.Withdraw{Key: "w-sweep", AccountID: "merchant", Amount: 300, Currency: "EUR", ExpectedRevision: &current, UpTo: true})
	if r.Status != client.StatusApplied || r.Moved == nil || *r.Moved != 300 || r.Account.Balance != 200 {
		t.Fatalf("a conditional withdrawal up to 300 of 500: %+v", r)
	}
	r = send(client.Transfer{Key: "t-sweep", TransferID: "payout-1", From: "merchant", To: "payout", Amount: 1_000, Currency: "EUR", UpTo: true})
	if r.Status != client.StatusApplied || r.Moved == nil || *r.Moved != 200 || r.Account.Balance != 0 {
		t.Fatalf("a sweep of 200 up to 1000: %+v", r)
	}
	again := send(client.Transfer{Key: "t-sweep", TransferID: "payout-1", From: "merchant", To: "payout", Amount: 1_000, Currency: "EUR", UpTo: true})
	if !again.Duplicate || again.Moved == nil || *again.Moved != 200 {
		t.Fatalf("the sweep resent: %+v", again)
	}
	tr, err := c.Queries().Transfer(ctx, client.TransferQuery{TransferID: "payout-1", MinPosition: r.Position})
	if err != nil || tr.Amount != 200 {
		t.Fatalf("query.transfer of the sweep: %+v %v", tr, err)
	}
	r = send(client.Withdraw{Key: "w-empty", AccountID: "merchant", Amount: 1, Currency: "EUR", UpTo: true})
	if r.Status != client.StatusRejected || r.Code != client.CodeInsufficientFunds || r.Moved != nil {
		t.Fatalf("a sweep of an empty account: %+v", r)
	}
	for _, c := range []struct {
		field string
		cmd   client.Command
	}{
		{"up_to", client.Transfer{Key: "t-sweep", TransferID: "payout-1", From: "merchant", To: "payout", Amount: 1_000, Currency: "EUR"}},
		{"expected_revision", client.Withdraw{Key: "w-sweep", AccountID: "merchant", Amount: 300, Currency: "EUR", ExpectedRevision: &stale, UpTo: true}},
	} {
		if r := send(c.cmd); r.Code != client.CodeIdempotencyKeyConflict || len(r.Fields) != 1 || r.Fields[0] != c.field {
			t.Fatalf("a resend without its %s: %+v", c.field, r)
		}
	}
}
