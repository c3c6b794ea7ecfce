package ledger

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestFirstReplyIsTheResendsAndTheLookups: capture_hold with `to`, transfers,
// transactions and their refunds on two busy accounts; the first reply must
// be duplicate=false and equal, field by field but the flag, to the resend's
// (duplicate=true) and to Lookup's (query.command). RecentKeys 1 and the
// default; group commit on (pipelined/hot) and off (atomic, no hot leg).
func TestFirstReplyIsTheResendsAndTheLookups(t *testing.T) {
	for _, keys := range []int{1, 0} {
		for _, nogc := range []bool{false, true} {
			t.Run(fmt.Sprintf("keys%d-nogc%v", keys, nogc), func(t *testing.T) {
				devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
					s := New(st, Options{Clock: clock, Logger: quietLog, RecentKeys: keys, DisableGroupCommit: nogc})
					defer s.Close()
					openHeldAndTo(t, s)
					mustApply(t, s, "deposit", `{"idempotency_key":"d","account_id":"held","amount":100000,"currency":"EUR"}`)
					var caps, moves, refunds []batchCmd
					for h := range 20 {
						mustApply(t, s, "place_hold", fmt.Sprintf(`{"idempotency_key":"h%d","account_id":"held","hold_id":"h%d","amount":3,"currency":"EUR"}`, h, h))
						caps = append(caps, batchCmd{"capture_hold", map[string]any{"idempotency_key": fmt.Sprintf("c%d", h), "account_id": "held", "hold_id": fmt.Sprintf("h%d", h), "to": "to", "amount": 2}})
					}
					for i := range 8 {
						tk, xk := fmt.Sprintf("t%d", i), fmt.Sprintf("x%d", i)
						moves = append(moves,
							batchCmd{"transfer", map[string]any{"idempotency_key": tk, "transfer_id": tk, "from": "held", "to": "to", "amount": 2, "currency": "EUR"}},
							batchCmd{"post_transaction", map[string]any{"idempotency_key": xk, "transaction_id": xk, "postings": []map[string]any{{"from": "held", "to": "to", "amount": 2, "currency": "EUR"}}}})
						refunds = append(refunds,
							batchCmd{"refund", map[string]any{"idempotency_key": "r" + tk, "original_key": tk, "amount": 1}},
							batchCmd{"refund", map[string]any{"idempotency_key": "r" + xk, "original_key": xk, "amount": 1}})
					}
					checkFirstReplies(t, s, caps)
					checkFirstReplies(t, s, moves)
					checkFirstReplies(t, s, refunds)
				})
			})
		}
	}
}

func checkFirstReplies(t *testing.T, s *Service, cmds []batchCmd) {
	t.Helper()
	for i, r := range sendOnTwoHotAccounts(s, cmds, 60) {
		if r.Status != domain.StatusApplied || r.Duplicate {
			t.Errorf("%s %v: %+v", cmds[i].typ, cmds[i].body, r)
			continue
		}
		sameAsResentAndLookedUp(t, s, cmds[i].typ, cmds[i].body["idempotency_key"].(string), cmds[i].alone(), r)
	}
}

// sameAsResentAndLookedUp checks that s answers the command body of type typ
// (key) resent, duplicate, and looked up (query.command) as first, the
// duplicate flag aside.
func sameAsResentAndLookedUp(t *testing.T, s *Service, typ, key string, body []byte, first Reply) {
	t.Helper()
	again := s.HandleRaw(context.Background(), typ, body)
	if !again.Duplicate {
		t.Errorf("%s %s: resend not duplicate: %+v", typ, body, again)
	}
	again.Duplicate = false
	if !reflect.DeepEqual(again, first) {
		t.Errorf("%s %s answered %+v, its resend %+v", typ, body, first, again)
	}
	lk, err := s.Lookup(context.Background(), key)
	if err != nil || lk == nil {
		t.Errorf("lookup %s: %v %v", key, lk, err)
		return
	}
	l := *lk
	l.Duplicate = false
	if !reflect.DeepEqual(l, first) {
		t.Errorf("%s %s answered %+v, query.command %+v", typ, body, first, l)
	}
}
