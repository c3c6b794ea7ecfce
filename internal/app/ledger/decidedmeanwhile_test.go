package ledger

import (
	"context"
	"reflect"
	"sync"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// holdLoad makes s's first load of stream wait, once it has signalled
// reached, until release is closed (or the load's context ends).
func holdLoad(s *Service, stream string) (reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.loadHook = func(ctx context.Context, st string) {
		if st != stream {
			return
		}
		once.Do(func() {
			close(reached)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
	}
	return reached, release
}

// TestAtomicBatchDecidedByAnotherInstanceMeanwhile: two instances decide one
// atomic batch. b has found its key undecided and starts to load the account
// (loadHook); meanwhile a refuses the batch (its withdrawal finds too little,
// the refusal recorded by the batch's BatchDecided) and the account is funded;
// then b loads it and decides the batch applied. Both decisions write a
// BatchDecided under the same ID and type, with other data: a store that
// repeats a part on its ID and type took b's as a repeat of a's and wrote the
// withdrawal beside it (memory and postgres on f75bf4a: "x holds 1 event of
// the element's key, want 0"). The batch's decision must be new: b's append
// is refused and b answers a's refusal.
func TestAtomicBatchDecidedByAnotherInstanceMeanwhile(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		a, b := newService(st), newService(st)
		defer a.Close()
		defer b.Close()
		mustApply(t, a, "open_account", `{"idempotency_key":"open-x","account_id":"x","currency":"EUR"}`)
		mustApply(t, a, "deposit", `{"idempotency_key":"dep-1","account_id":"x","amount":100,"currency":"EUR"}`)
		reached, release := holdLoad(b, domain.AccountStream("x"))
		body := atomicBody("B", []batchCmd{{"withdraw", map[string]any{"idempotency_key": "w", "account_id": "x", "amount": 150, "currency": "EUR"}}})
		done := make(chan Reply, 1)
		go func() { done <- b.HandleBatch(context.Background(), body, 0) }()
		select {
		case <-reached:
		case r := <-done:
			t.Fatalf("b answered before loading x: %+v", r)
		}
		ra := a.HandleBatch(context.Background(), body, 0)
		if ra.Status != domain.StatusRejected {
			t.Fatalf("a: %+v, want the batch refused", ra)
		}
		mustApply(t, a, "deposit", `{"idempotency_key":"dep-2","account_id":"x","amount":100,"currency":"EUR"}`)
		close(release)
		rb := <-done
		ra.Duplicate, rb.Duplicate = false, false
		if !reflect.DeepEqual(rb.Status, ra.Status) || rb.Code != ra.Code || rb.Index == nil || ra.Index == nil || *rb.Index != *ra.Index {
			t.Errorf("b: %+v, want a's refusal %+v", rb, ra)
		}
		n := 0
		for _, e := range devtest.StreamEvents(t, st, domain.AccountStream("x")) {
			if m, err := domain.DecodeMetadataNoRequest(e.Metadata); err == nil && m.Key == "w" {
				n++
			}
		}
		if n != 0 {
			t.Errorf("x holds %d event of the element's key, want 0 (the batch was refused)", n)
		}
		audit(t, st, true)
	})
}

