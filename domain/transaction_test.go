package domain

import (
	"fmt"
	"strings"
	"testing"
)

// TestPostTransactionBadInput: every malformed transaction is invalid_request
// naming its field (issue 13's list), and a well-formed one decodes.
func TestPostTransactionBadInput(t *testing.T) {
	p := func(from, to, amount, cur string) string {
		return fmt.Sprintf(`{"from":%s,"to":%s,"amount":%s,"currency":%s}`, from, to, amount, cur)
	}
	ok := p(`"a"`, `"b"`, `5`, `"EUR"`)
	body := func(postings string, extra ...string) string {
		b := `{"idempotency_key":"k","transaction_id":"t","postings":` + postings
		for _, e := range extra {
			b += "," + e
		}
		return b + "}"
	}
	many := func(n int) string {
		ps := make([]string, n)
		for i := range ps {
			ps[i] = ok
		}
		return "[" + strings.Join(ps, ",") + "]"
	}
	meta := func(n, klen, vlen int) string {
		var es []string
		for i := range n {
			es = append(es, fmt.Sprintf(`"%s%d":"%s"`, strings.Repeat("k", klen), i, strings.Repeat("v", vlen)))
		}
		return `"metadata":{` + strings.Join(es, ",") + `}`
	}
	if cmd, ierr := DecodeCommand(CmdPostTransaction, []byte(body(many(64), meta(32, 10, 256)))); ierr != nil || len(cmd.Postings) != 64 || len(cmd.Metadata) != 32 {
		t.Fatalf("64 postings, 32 metadata entries: %v", ierr)
	}
	for _, c := range []struct{ name, body, field string }{
		{"no postings", body(`[]`), "postings"},
		{"postings missing", `{"idempotency_key":"k","transaction_id":"t"}`, "postings"},
		{"65 postings", body(many(65)), "postings"},
		{"postings not an array", body(`{"from":"a"}`), "postings"},
		{"from == to", body("[" + p(`"a"`, `"a"`, `5`, `"EUR"`) + "]"), "postings[0].to"},
		{"amount 0", body("[" + ok + "," + p(`"a"`, `"b"`, `0`, `"EUR"`) + "]"), "postings[1].amount"},
		{"amount negative", body("[" + p(`"a"`, `"b"`, `-5`, `"EUR"`) + "]"), "postings[0].amount"},
		{"amount float", body("[" + p(`"a"`, `"b"`, `1.5`, `"EUR"`) + "]"), "postings[0].amount"},
		{"amount string", body("[" + p(`"a"`, `"b"`, `"5"`, `"EUR"`) + "]"), "postings[0].amount"},
		{"amount over 2^53-1", body("[" + p(`"a"`, `"b"`, `9007199254740992`, `"EUR"`) + "]"), "postings[0].amount"},
		{"currency missing", body(`[{"from":"a","to":"b","amount":5}]`), "postings[0].currency"},
		{"currency lower-case", body("[" + p(`"a"`, `"b"`, `5`, `"eur"`) + "]"), "postings[0].currency"},
		{"unknown field in a posting", body(`[{"from":"a","to":"b","amount":5,"currency":"EUR","memo":"x"}]`), "postings[0].memo"},
		{"posting not an object", body(`["a"]`), "postings[0]"},
		{"bad account id", body("[" + p(`"a b"`, `"b"`, `5`, `"EUR"`) + "]"), "postings[0].from"},
		{"transaction_id missing", `{"idempotency_key":"k","postings":[` + ok + `]}`, "transaction_id"},
		{"metadata 33 entries", body("["+ok+"]", meta(33, 1, 1)), "metadata"},
		{"metadata 65-byte key", body("["+ok+"]", `"metadata":{"`+strings.Repeat("k", 65)+`":"v"}`), "metadata"},
		{"metadata 257-byte value", body("["+ok+"]", meta(1, 1, 257)), "metadata"},
		{"metadata value not a string", body("["+ok+"]", `"metadata":{"k":5}`), "metadata"},
		{"unknown field", body("["+ok+"]", `"memo":"x"`), "memo"},
	} {
		_, ierr := DecodeCommand(CmdPostTransaction, []byte(c.body))
		if ierr == nil || ierr.Field != c.field {
			t.Errorf("%s: %v, want an error on %s", c.name, ierr, c.field)
		}
	}
}

func TestValidTransactionName(t *testing.T) {
	for id, want := range map[string]bool{
		"t-1": true, RefundTransactionID("t-1", 0): true, RefundTransactionID(RefundTransactionID("t-1", 3), 12): true,
		"": false, "t 1": false, "t-1~refund~": false, "t-1~refund~x": false, "t-1~refund~01": false, "~refund~0": false, "t-1~other~0": false,
	} {
		if got := ValidTransactionName(id); got != want {
			t.Errorf("%q: %v, want %v", id, got, want)
		}
	}
}

func TestRefundSlotOf(t *testing.T) {
	nested := RefundTransactionID(RefundTransactionID("t-1", 3), 12)
	if orig, n, ok := RefundSlotOf(nested); !ok || n != 12 || orig != RefundTransactionID("t-1", 3) {
		t.Errorf("%q: %q %d %v", nested, orig, n, ok)
	}
	for _, id := range []string{"t-1", "t-1~refund~", "t-1~refund~x", "t-1~refund~01", "t-1~refund~-1"} {
		if orig, n, ok := RefundSlotOf(id); ok {
			t.Errorf("%q: a refund of %q in slot %d", id, orig, n)
		}
	}
}

func TestNextRefundSlot(t *testing.T) {
	if next, ok := NextRefundSlot(TransactionStream(RefundTransactionID("t-1", 9))); !ok || next != TransactionStream(RefundTransactionID("t-1", 10)) {
		t.Errorf("after slot 9: %q %v", next, ok)
	}
	for _, stream := range []string{TransactionStream("t-1"), TransactionStream("t-1~refund~x"), AccountStream("t-1~refund~0"), RefundTransactionID("t-1", 0)} {
		if next, ok := NextRefundSlot(stream); ok {
			t.Errorf("%q: a refund slot before %q", stream, next)
		}
	}
}

// TestTransactionRefundable: what is left to refund of a transaction of
// 300+700, and RefundOfTransaction refusing past it (in full: nothing
// left once refunded; in part: more than is left) and reversing what is left.
func TestTransactionRefundable(t *testing.T) {
	two := &TransactionPosted{TransactionID: "t", Postings: []Posting{{"a", "b", 300, "EUR"}, {"b", "c", 700, "EUR"}}}
	one := &TransactionPosted{TransactionID: "u", Postings: []Posting{{"a", "b", 1000, "EUR"}}}
	if got := TransactionRefundable(two, 0); got != 1000 || two.Total() != 1000 {
		t.Fatalf("refundable %d, total %d", got, two.Total())
	}
	if _, rej := RefundOfTransaction(two, Command{}, 1000); rej == nil || rej.Code != CodeRefundExceedsOriginal {
		t.Errorf("a second refund in full: %v", rej)
	}
	if _, rej := RefundOfTransaction(one, Command{HasAmount: true, Amount: 401}, 600); rej == nil || rej.Code != CodeRefundExceedsOriginal {
		t.Errorf("401 of the 400 left: %v", rej)
	}
	tx, rej := RefundOfTransaction(one, Command{}, 600)
	if rej != nil || len(tx.Postings) != 1 || tx.Postings[0] != (Posting{"b", "a", 400, "EUR"}) {
		t.Errorf("the rest of one refunded 600: %v %+v", rej, tx.Postings)
	}
}

// TestSlotRefunded: a posted refund slot refunded its postings' sum; a
// refusal recorded in a slot, or no outcome, refunded nothing.
func TestSlotRefunded(t *testing.T) {
	posted := &TransactionPosted{Postings: []Posting{{"b", "c", 700, "EUR"}, {"a", "b", 300, "EUR"}}}
	rejected := &TransactionRejected{Postings: []Posting{{"b", "a", 400, "EUR"}}, Code: CodeInsufficientFunds}
	for _, c := range []struct {
		outcome any
		want    int64
	}{{posted, 1000}, {rejected, 0}, {nil, 0}} {
		if got := SlotRefunded(c.outcome); got != c.want {
			t.Errorf("SlotRefunded(%T) = %d, want %d", c.outcome, got, c.want)
		}
	}
}

// TestRefundReversal: what the ledger writes in a slot of a given sum, the
// audit's reference: a part of a one-posting transaction reversed; a
// transaction of two postings reversed in full, the last first, whatever the
// sum; a slot past what is left refused.
func TestRefundReversal(t *testing.T) {
	two := &TransactionPosted{TransactionID: "t", Postings: []Posting{{"a", "b", 300, "EUR"}, {"b", "c", 700, "USD"}}}
	one := &TransactionPosted{TransactionID: "u", Postings: []Posting{{"a", "b", 1000, "EUR"}}}
	if ps, rej := RefundReversal(one, 250, 600); rej != nil || len(ps) != 1 || ps[0] != (Posting{"b", "a", 250, "EUR"}) {
		t.Errorf("250 of one refunded 600: %v %+v", rej, ps)
	}
	if ps, rej := RefundReversal(two, 10, 0); rej != nil || len(ps) != 2 || ps[0] != (Posting{"c", "b", 700, "USD"}) || ps[1] != (Posting{"b", "a", 300, "EUR"}) {
		t.Errorf("two in full: %v %+v", rej, ps)
	}
	if _, rej := RefundReversal(one, 401, 600); rej == nil || rej.Code != CodeRefundExceedsOriginal {
		t.Errorf("401 of the 400 left: %v", rej)
	}
}
