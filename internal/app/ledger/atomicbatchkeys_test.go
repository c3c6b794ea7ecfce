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

// TestAtomicBatchOtherElementKeys (PROTOCOL.md §2.2, "a key names exactly one
// request"): an atomic batch resent under its key with one element's key
// changed, the commands otherwise the same, is another batch:
// idempotency_key_conflict naming commands, and nothing is written; the
// exact resend still answers the first reply, duplicate. So for a batch
// applied, one refused by a rejected element and one refused by an invalid
// element. The changed key, sent alone afterwards, is decided afresh and
// once: its deposit applies, not as a duplicate, and a resend of it is one.
func TestAtomicBatchOtherElementKeys(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		defer s.Close()
		for _, c := range []struct {
			name     string
			withdraw int // the last element's amount, of the 5 the batch deposits
			status   domain.Status
		}{
			{"applied", 2, domain.StatusApplied},
			{"rejected", 100, domain.StatusRejected},
			{"invalid", 0, domain.StatusInvalid},
		} {
			t.Run(c.name, func(t *testing.T) { checkOtherElementKeys(t, s, st, c.name, c.withdraw, c.status) })
		}
	})
}

// checkOtherElementKeys: an atomic batch (open an account, deposit 5,
// withdraw), first answered status, is a conflict resent with its deposit
// under another key, a duplicate resent exactly, and the other key is
// decided afresh afterwards.
func checkOtherElementKeys(t *testing.T, s *Service, st eventstore.Store, name string, withdraw int, status domain.Status) {
	ctx := context.Background()
	key, acc := "b-"+name, "a-"+name
	deposit := func(k string) batchCmd {
		return batchCmd{"deposit", map[string]any{"idempotency_key": k, "account_id": acc, "amount": 5, "currency": "EUR"}}
	}
	cmds := []batchCmd{
		{"open_account", map[string]any{"idempotency_key": "o-" + name, "account_id": acc, "currency": "EUR"}},
		deposit("d-" + name),
		{"withdraw", map[string]any{"idempotency_key": "w-" + name, "account_id": acc, "amount": withdraw, "currency": "EUR"}},
	}
	first := positionless(s.HandleBatch(ctx, atomicBody(key, cmds), 0))
	if first.Status != status {
		t.Fatalf("the batch answered %+v", first)
	}
	other := deposit("d2-" + name)
	checkOtherKeysConflict(t, s, st, key, atomicBody(key, []batchCmd{cmds[0], other, cmds[2]}))
	if again := positionless(s.HandleBatch(ctx, atomicBody(key, cmds), 0)); !reflect.DeepEqual(again, asDuplicate(first)) {
		t.Fatalf("resent:\n got %+v\nwant %+v", again, asDuplicate(first))
	}
	want := int64(5) // the deposit alone
	if status == domain.StatusApplied {
		want += 5 - int64(withdraw) // after the batch's deposit and withdraw
	} else { // the batch opened no account: open it alone
		opened := fmt.Appendf(nil, `{"idempotency_key":"alone-%s","account_id":%q,"currency":"EUR"}`, name, acc)
		if r := s.HandleRaw(ctx, "open_account", opened); r.Status != domain.StatusApplied {
			t.Fatalf("%+v", r)
		}
	}
	checkDecidedAfresh(t, s, other, want)
}

// checkOtherKeysConflict: the atomic batch body under key, whose elements'
// keys are not the recorded batch's, is a conflict naming commands and writes
// nothing.
func checkOtherKeysConflict(t *testing.T, s *Service, st eventstore.Store, key string, body []byte) {
	t.Helper()
	before := len(devtest.SettledAll(t, st))
	r := s.HandleBatch(context.Background(), body, 0)
	if r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, []string{"commands"}) || r.Duplicate {
		t.Fatalf("%s with other element keys: %+v", key, r)
	}
	if after := len(devtest.SettledAll(t, st)); after != before {
		t.Fatalf("%s with other element keys wrote %d events", key, after-before)
	}
}

// checkDecidedAfresh: the deposit c, whose key no batch decided, sent alone
// applies as a new command (the account's balance then want), and again as
// its duplicate.
func checkDecidedAfresh(t *testing.T, s *Service, c batchCmd, want int64) {
	t.Helper()
	r := s.HandleRaw(context.Background(), c.typ, c.alone())
	if r.Status != domain.StatusApplied || r.Duplicate || r.Account == nil || r.Account.Balance != want {
		t.Fatalf("%s alone: %+v", c.alone(), r)
	}
	again := s.HandleRaw(context.Background(), c.typ, c.alone())
	if again.Status != domain.StatusApplied || !again.Duplicate || !reflect.DeepEqual(again.Events, r.Events) {
		t.Fatalf("%s again: %+v, first %+v", c.alone(), again, r)
	}
}

// TestAtomicBatchElementUnderTheBatchKey: an atomic batch one of whose
// elements carries the batch's own key is invalid as a whole, naming
// commands, and writes nothing. The batch's record and the element's claim
// would both open the key's stream, so the store refused the append on every
// send and the batch answered error forever (a reviewer's finding); the key,
// sent alone afterwards, is decided once.
func TestAtomicBatchElementUnderTheBatchKey(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		defer s.Close()
		ctx := context.Background()
		open := batchCmd{"open_account", map[string]any{"idempotency_key": "o-sk", "account_id": "sk", "currency": "EUR"}}
		dep := batchCmd{"deposit", map[string]any{"idempotency_key": "SK", "account_id": "sk", "amount": 1, "currency": "EUR"}}
		for range 2 {
			r := s.HandleBatch(ctx, atomicBody("SK", []batchCmd{open, dep}), 0)
			if r.Status != domain.StatusInvalid || r.Code != domain.CodeInvalidRequest || !reflect.DeepEqual(r.Fields, []string{"commands"}) {
				t.Fatalf("the batch: %+v, want invalid naming commands", r)
			}
		}
		if n := len(devtest.StreamEvents(t, st, "account-sk")); n != 0 {
			t.Fatalf("%d events of the account after an invalid batch", n)
		}
		if r := s.HandleRaw(ctx, open.typ, open.alone()); r.Status != domain.StatusApplied || r.Duplicate {
			t.Fatalf("the opening alone: %+v", r)
		}
		if r := s.HandleRaw(ctx, dep.typ, dep.alone()); r.Status != domain.StatusApplied || r.Duplicate {
			t.Fatalf("the deposit alone: %+v", r)
		}
	})
}
