package ledger

import (
	"reflect"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestKeyDecidedOnTwoClocks: two instances over one store decide one key on
// one account at the same revision, on clocks two hours apart: a decides it
// first on a fresh state, b on the state it cached before a's write. b's
// events carry the key's event IDs, which a's already hold at that revision:
// a store may take b's append for a repeat (KurrentDB's server does so on the
// IDs alone, whatever the types and data; PostgreSQL and memory where the
// types match). b must then answer what the store holds, a's decision, as a
// duplicate, and keep a's decision in its cache (its next answer to the key).
func TestKeyDecidedOnTwoClocks(t *testing.T) {
	cases := []struct {
		name, typ, body string
		want            domain.Status // a's decision, on the later clock
	}{
		// Expired on a's clock, active on b's: a refuses, b would capture.
		{"a hold expired on one clock", "capture_hold", `{"idempotency_key":"k","account_id":"x","hold_id":"h"}`, domain.StatusRejected},
		// Alike on both clocks but for their time (same types, other metadata).
		{"a deposit decided alike", "deposit", `{"idempotency_key":"k","account_id":"x","amount":5,"currency":"EUR"}`, domain.StatusApplied},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
				late, early := devtest.NewClock(), devtest.NewClock()
				late.Advance(2 * time.Hour)
				a, b := New(st, Options{Clock: late.Now}), New(st, Options{Clock: early.Now})
				defer a.Close()
				defer b.Close()
				mustApply(t, a, "open_account", `{"idempotency_key":"open-x","account_id":"x","currency":"EUR"}`)
				mustApply(t, b, "deposit", `{"idempotency_key":"dep","account_id":"x","amount":100,"currency":"EUR"}`)
				mustApply(t, b, "place_hold", `{"idempotency_key":"hold","account_id":"x","hold_id":"h","amount":50,"currency":"EUR","expires_at":"`+devtest.Epoch.Add(time.Hour).Format(time.RFC3339)+`"}`)
				ra := post(t, a, c.typ, c.body) // a's cache is behind b's writes: a decides on the store's head
				if ra.Status != c.want || ra.Duplicate {
					t.Fatalf("a: %+v, want %s, not a duplicate", ra, c.want)
				}
				for i, rb := range []Reply{post(t, b, c.typ, c.body), post(t, b, c.typ, c.body)} {
					if !rb.Duplicate {
						t.Errorf("b's answer %d: not a duplicate: %+v", i+1, rb)
					}
					rb.Duplicate = false
					if !reflect.DeepEqual(rb, ra) {
						t.Errorf("b's answer %d: %+v, want a's decision %+v", i+1, rb, ra)
					}
				}
				if n := keyEvents(t, st, domain.AccountStream("x"), "k"); n != 1 {
					t.Errorf("x holds %d events of the key, want 1 (a's)", n)
				}
				audit(t, st, true)
			})
		})
	}
}
