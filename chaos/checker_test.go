package main

import (
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// TestSameBatchReply: what C1 compares of an atomic batch's reply beyond its
// status, code and index: each element's key, and of a refused batch each
// element's status and code.
func TestSameBatchReply(t *testing.T) {
	elem := reply.Reply{Status: domain.StatusRejected, Code: domain.CodeInsufficientFunds, IdempotencyKey: "b-1"}
	refused := func(keys ...string) *reply.Reply {
		r := reply.AtomicRefused("b", keys, 1, elem, false)
		return &r
	}
	if d := sameBatchReply(refused("b-0", "b-1"), refused("b-0", "b-1")); d != "" {
		t.Errorf("the same refusal: %s", d)
	}
	if d := sameBatchReply(refused("b-0", "b-1"), refused("forged", "b-1")); !strings.Contains(d, `(key "forged")`) {
		t.Errorf("a refusal with element 0's key forged: %q, want it named", d)
	}
	other := refused("b-0", "b-1")
	other.Replies[0].Code = domain.CodeAccountNotFound
	if d := sameBatchReply(refused("b-0", "b-1"), other); !strings.Contains(d, "element 0 answered") {
		t.Errorf("a refusal with element 0's code changed: %q, want it named", d)
	}
	applied := func(keys ...string) *reply.Reply {
		rs := make([]reply.Reply, len(keys))
		for i, k := range keys {
			rs[i] = reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: k}
		}
		r := reply.AtomicApplied("a", rs, false)
		return &r
	}
	stubs := applied("a-0", "a-1") // BatchDecided's stubs carry keys alone
	stubs.Replies[1].Status, stubs.Replies[1].Code = "", ""
	if d := sameBatchReply(applied("a-0", "a-1"), stubs); d != "" {
		t.Errorf("an applied batch against its decision's stubs: %s", d)
	}
	if d := sameBatchReply(applied("a-0", "a-1"), applied("a-0", "forged")); !strings.Contains(d, `(key "forged")`) {
		t.Errorf("an applied batch with element 1's key forged: %q, want it named", d)
	}
}
