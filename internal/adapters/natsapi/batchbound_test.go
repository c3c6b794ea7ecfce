package natsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestBatchReplyBound: the largest replies of the commands, on the wire (IDs
// and keys of their longest, a transaction of 64 postings over 65 accounts,
// a transfer, a refusal with its message, a conflict naming its fields, a
// capture into another account), are within what reply.MaxBatchReplyBytes
// allows a command and its postings: the bound by which a batch whose reply
// might not fit is refused before anything is decided.
func TestBatchReplyBound(t *testing.T) {
	s := ledger.New(devtest.Memory(t), ledger.Options{})
	defer s.Close()
	id := func(p string, i int) string { return p + strings.Repeat("x", 64-len(p)-3) + fmt.Sprintf("%03d", i) }
	key := func(p string) string { return p + strings.Repeat("k", domain.MaxKeyLen-len(p)) }
	send := func(typ string, fields map[string]any) reply.Reply {
		b, err := json.Marshal(fields)
		if err != nil {
			t.Fatal(err)
		}
		return s.HandleRaw(context.Background(), typ, b)
	}
	for i := range 65 {
		if r := send("open_account", map[string]any{"idempotency_key": key(fmt.Sprintf("o%d-", i)), "account_id": id("a", i), "currency": "EUR", "overdraft_limit": domain.MaxAmount}); r.Status != domain.StatusApplied {
			t.Fatalf("%+v", r)
		}
	}
	postings := make([]map[string]any, domain.MaxPostings)
	for i := range postings {
		postings[i] = map[string]any{"from": id("a", i), "to": id("a", i+1), "amount": domain.MaxAmount, "currency": "EUR"}
	}
	type sent struct {
		r        reply.Reply
		postings int
	}
	var replies []sent
	add := func(r reply.Reply, postings int) {
		if r.Status == domain.StatusError {
			t.Fatalf("%+v", r)
		}
		replies = append(replies, sent{r, postings})
	}
	add(send("post_transaction", map[string]any{"idempotency_key": key("tx-"), "transaction_id": id("t", 0), "postings": postings}), len(postings))
	add(send("deposit", map[string]any{"idempotency_key": key("d-"), "account_id": id("a", 0), "amount": domain.MaxAmount, "currency": "EUR"}), 0)
	add(send("transfer", map[string]any{"idempotency_key": key("tr-"), "transfer_id": id("t", 1), "from": id("a", 0), "to": id("a", 1), "amount": domain.MaxAmount, "currency": "EUR"}), 0)
	add(send("withdraw", map[string]any{"idempotency_key": key("w-"), "account_id": id("a", 2), "amount": domain.MaxAmount, "currency": "EUR"}), 0)
	add(send("withdraw", map[string]any{"idempotency_key": key("w-"), "account_id": id("a", 3), "amount": 1, "currency": "USD", "metadata": map[string]string{"m": "v"}}), 0)
	add(send("place_hold", map[string]any{"idempotency_key": key("h-"), "account_id": id("a", 4), "hold_id": id("h", 0), "amount": 5, "currency": "EUR"}), 0)
	add(send("capture_hold", map[string]any{"idempotency_key": key("c-"), "account_id": id("a", 4), "hold_id": id("h", 0), "to": id("a", 5)}), 0)
	add(send("refund", map[string]any{"idempotency_key": key("rf-"), "original_key": key("tr-")}), 0)
	add(send("deposit", map[string]any{"idempotency_key": key("bad-"), "account_id": id("a", 0), "amount": 0, "currency": "EUR"}), 0)
	for _, x := range replies {
		b, err := encodeReply(x.r)
		if err != nil {
			t.Fatal(err)
		}
		if bound := reply.MaxBatchReplyBytes(1, x.postings) - reply.MaxBatchReplyBytes(0, 0); len(b) > bound {
			t.Errorf("a reply of %d bytes (%d postings) is over its bound %d: %s", len(b), x.postings, bound, b)
		}
	}
}
