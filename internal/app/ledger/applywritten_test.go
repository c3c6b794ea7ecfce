package ledger

import (
	"context"
	"fmt"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestCaptureToOnCachesBehindTheStore (applyWritten's reload): applyWritten
// loads an account again when the events written do not follow the aggregate
// they were decided on, and a capture with `to` answers from its step's key
// record as that fold left it (09b2bdf), which a reload would leave nil
// (internal_error). An aggregate is behind the store only when another
// instance wrote meanwhile: here b deposits into both accounts before each
// capture a decides on its cached, stale aggregates (RecentKeys 1, group
// commit on and off). The append expecting the stale revision is refused and
// decided again on the store's head, so the fold always follows the
// aggregate: each first reply is applied and equals its resend's and the
// lookup's, on a and on b.
func TestCaptureToOnCachesBehindTheStore(t *testing.T) {
	for _, nogc := range []bool{false, true} {
		t.Run(fmt.Sprintf("nogc%v", nogc), func(t *testing.T) {
			devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
				a := New(st, Options{Clock: clock, Logger: quietLog, RecentKeys: 1, DisableGroupCommit: nogc})
				b := New(st, Options{Clock: clock, Logger: quietLog, RecentKeys: 1, DisableGroupCommit: nogc})
				defer a.Close()
				defer b.Close()
				openHeldAndTo(t, a)
				mustApply(t, a, "deposit", `{"idempotency_key":"d","account_id":"held","amount":1000,"currency":"EUR"}`)
				for i := range 6 {
					mustApply(t, a, "place_hold", fmt.Sprintf(`{"idempotency_key":"h%d","account_id":"held","hold_id":"h%d","amount":3,"currency":"EUR"}`, i, i))
					mustApply(t, a, "deposit", fmt.Sprintf(`{"idempotency_key":"dt%d","account_id":"to","amount":1,"currency":"EUR"}`, i))
					mustApply(t, b, "deposit", fmt.Sprintf(`{"idempotency_key":"bh%d","account_id":"held","amount":1,"currency":"EUR"}`, i))
					mustApply(t, b, "deposit", fmt.Sprintf(`{"idempotency_key":"bt%d","account_id":"to","amount":1,"currency":"EUR"}`, i))
					for _, id := range []string{"held", "to"} {
						if acc, ok := a.accounts.c.Peek(domain.AccountStream(id)); !ok || acc.Revision >= storeRevision(t, st, id) {
							t.Fatalf("a's %s is not behind the store before capture %d (cached: %v)", id, i, ok)
						}
					}
					key := fmt.Sprintf("c%d", i)
					body := fmt.Sprintf(`{"idempotency_key":%q,"account_id":"held","hold_id":"h%d","to":"to","amount":2}`, key, i)
					r := a.HandleRaw(context.Background(), "capture_hold", []byte(body))
					if r.Status != domain.StatusApplied || r.Duplicate {
						t.Fatalf("capture %s on stale caches: %+v", key, r)
					}
					sameAsResentAndLookedUp(t, a, "capture_hold", key, []byte(body), r)
					sameAsResentAndLookedUp(t, b, "capture_hold", key, []byte(body), r)
				}
				audit(t, st, true)
			})
		})
	}
}

// storeRevision is the revision of account id's last event in st.
func storeRevision(t *testing.T, st eventstore.Store, id string) int64 {
	t.Helper()
	evs, err := st.ReadStream(context.Background(), domain.AccountStream(id), eventstore.EndOfStream, eventstore.Backwards, 1)
	if err != nil || len(evs) != 1 {
		t.Fatalf("the head of %s: %v %v", id, evs, err)
	}
	return int64(evs[0].Revision)
}
