package ledger

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

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

// batchHeldAtDecided starts b's HandleBatch of body and returns once b has
// decided it and not yet appended it (failpoint "batch/decided"): its reply
// comes on done after release.
func batchHeldAtDecided(t *testing.T, b *Service, body []byte) (done <-chan Reply, release func()) {
	reached, released := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.failpoint = func(step string) error {
		if step == "batch/decided" {
			once.Do(func() { close(reached); <-released })
		}
		return nil
	}
	replies := make(chan Reply, 1)
	go func() { replies <- b.HandleBatch(context.Background(), body, 0) }()
	select {
	case <-reached:
	case r := <-replies:
		t.Fatalf("b answered before its append: %+v", r)
	}
	return replies, func() { close(released) }
}

// keyEvents counts the events of stream written under key.
func keyEvents(t *testing.T, st eventstore.Store, stream, key string) int {
	n := 0
	for _, e := range devtest.StreamEvents(t, st, stream) {
		if m, err := domain.DecodeMetadataNoRequest(e.Metadata); err == nil && m.Key == key {
			n++
		}
	}
	return n
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
		if n := keyEvents(t, st, domain.AccountStream("x"), "w"); n != 0 {
			t.Errorf("x holds %d event of the element's key, want 0 (the batch was refused)", n)
		}
		audit(t, st, true)
	})
}

// TestAtomicBatchElementDecidedAloneMeanwhile: b has decided an atomic batch
// (failpoint "batch/decided", after the elements' keys were read and checked
// under the locks) when a decides one of its elements alone, on the same
// state. The element's claim must be new: b's append is refused, b decides
// the batch again and answers the element as what it is, a key an earlier
// command decided (duplicate, PROTOCOL.md §2.2), with a's events. With the
// element's claim taken as a repeat, b wrote the batch around a's events and
// answered the element as its own (duplicate false).
func TestAtomicBatchElementDecidedAloneMeanwhile(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		a, b := newService(st), newService(st)
		defer a.Close()
		defer b.Close()
		mustApply(t, a, "open_account", `{"idempotency_key":"open-x","account_id":"x","currency":"EUR"}`)
		done, release := batchHeldAtDecided(t, b, atomicBody("B", []batchCmd{{"deposit", map[string]any{"idempotency_key": "d", "account_id": "x", "amount": 10, "currency": "EUR"}}}))
		ra := post(t, a, "deposit", `{"idempotency_key":"d","account_id":"x","amount":10,"currency":"EUR"}`)
		if ra.Status != domain.StatusApplied {
			t.Fatalf("a alone: %+v, want applied", ra)
		}
		release()
		rb := <-done
		if rb.Status != domain.StatusApplied || len(rb.Replies) != 1 {
			t.Fatalf("b's batch: %+v, want applied with one reply", rb)
		}
		if el := rb.Replies[0]; !el.Duplicate || !reflect.DeepEqual(el.Events, ra.Events) {
			t.Errorf("b's element: duplicate %v, events %+v; want a's decision %+v marked duplicate", el.Duplicate, el.Events, ra.Events)
		}
		if n := keyEvents(t, st, domain.AccountStream("x"), "d"); n != 1 {
			t.Errorf("x holds %d events of the element's key, want 1", n)
		}
		audit(t, st, true)
	})
}

// TestAtomicBatchCaptureDecidedAloneOtherwiseMeanwhile: as
// TestAtomicBatchElementDecidedAloneMeanwhile, but a decides the element
// otherwise: its clock finds the hold expired (rejected, a CommandRejected
// under the ID b's HoldCaptured carries), b's finds it live (captured into y).
// The element's claim must be new: b answers a's rejection and y is never
// credited. It holds on the claim rule alone (with eventstore.SameEvent
// comparing IDs only, tried: without the element's claim rule, b answered
// applied and credited y, the legs of a capture that posted nothing).
func TestAtomicBatchCaptureDecidedAloneOtherwiseMeanwhile(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		clkA, clkB := devtest.NewClock(), devtest.NewClock()
		a, b := New(st, Options{Clock: clkA.Now}), New(st, Options{Clock: clkB.Now})
		defer a.Close()
		defer b.Close()
		for _, id := range []string{"x", "y"} {
			mustApply(t, b, "open_account", `{"idempotency_key":"open-`+id+`","account_id":"`+id+`","currency":"EUR"}`)
		}
		mustApply(t, b, "deposit", `{"idempotency_key":"dep-1","account_id":"x","amount":100,"currency":"EUR"}`)
		expires := clkB.Now().Add(10 * time.Minute).UTC().Format(time.RFC3339)
		mustApply(t, b, "place_hold", `{"idempotency_key":"h","account_id":"x","hold_id":"h1","amount":50,"currency":"EUR","expires_at":"`+expires+`"}`)
		clkA.Advance(20 * time.Minute)
		done, release := batchHeldAtDecided(t, b, atomicBody("B", []batchCmd{{"capture_hold", map[string]any{"idempotency_key": "cap", "account_id": "x", "hold_id": "h1", "to": "y"}}}))
		ra := post(t, a, "capture_hold", `{"idempotency_key":"cap","account_id":"x","hold_id":"h1","to":"y"}`)
		if ra.Status != domain.StatusRejected {
			t.Fatalf("a alone: %+v, want the expired hold rejected", ra)
		}
		release()
		rb := <-done
		if rb.Status != domain.StatusRejected || rb.Index == nil || *rb.Index != 0 || rb.Code != ra.Code {
			t.Errorf("b's batch: %+v, want refused at its element with a's %s", rb, ra.Code)
		}
		if evs := devtest.StreamEvents(t, st, domain.AccountStream("y")); len(evs) != 1 {
			t.Errorf("y holds %d events, want its opening only", len(evs))
		}
		audit(t, st, true)
	})
}

// TestSagaModeReclaimAfterCrashBetweenClaimAndHome: where the store appends
// one stream a write, the claim is written alone before the home write. An
// instance that crashed between them left a claim whose home revision is a
// lower bound; once the account has moved on, the resent command is decided
// and claimed again, idempotently, with another revision in the claim's data.
// A store that repeated a part only where its data matched too (a first
// version of f75bf4a) looped it to "too many concurrent writes".
func TestSagaModeReclaimAfterCrashBetweenClaimAndHome(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		a := newService(st)
		defer a.Close()
		mustApply(t, a, "open_account", `{"idempotency_key":"open-x","account_id":"x","currency":"EUR"}`)
		body := `{"idempotency_key":"dep-K","account_id":"x","amount":100,"currency":"EUR"}`
		cmd, ierr := domain.DecodeCommand(domain.CmdDeposit, []byte(body))
		if ierr != nil {
			t.Fatal(ierr)
		}
		cmd = a.stamped(cmd)
		// The claim as the crashed instance wrote it, x's next revision then 1.
		claim, err := a.claimPart(cmd, cmd.Canonical(), domain.AccountStream("x"), 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Append(context.Background(), claim.Stream, claim.Expected, claim.Events); err != nil {
			t.Fatal(err)
		}
		mustApply(t, a, "deposit", `{"idempotency_key":"dep-other","account_id":"x","amount":5,"currency":"EUR"}`)
		b := newService(st)
		defer b.Close()
		if r := post(t, b, "deposit", body); r.Status != domain.StatusApplied {
			t.Errorf("the deposit resent after a crash between its claim and its home write: %+v, want applied", r)
		}
		audit(t, st, true)
	})
}

// TestSagaModeReclaimAfterHomeLosesARace: where the store appends one stream
// a write, b decides a deposit on its cache, writes the claim, and its home
// write loses to a's deposit; b decides again on the store's head and claims
// again, idempotently, with the new revision in the claim's data (see
// TestSagaModeReclaimAfterCrashBetweenClaimAndHome).
func TestSagaModeReclaimAfterHomeLosesARace(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		// Named apart, as two instances are: their events differ in metadata.
		a, b := New(st, Options{Clock: clock, Producer: "a"}), New(st, Options{Clock: clock, Producer: "b"})
		defer a.Close()
		defer b.Close()
		mustApply(t, b, "open_account", `{"idempotency_key":"open-x","account_id":"x","currency":"EUR"}`)
		mustApply(t, b, "deposit", `{"idempotency_key":"dep-0","account_id":"x","amount":5,"currency":"EUR"}`) // b's cache holds x
		mustApply(t, a, "deposit", `{"idempotency_key":"dep-a","account_id":"x","amount":5,"currency":"EUR"}`) // x moves on behind b's back
		body := `{"idempotency_key":"dep-K","account_id":"x","amount":100,"currency":"EUR"}`
		rb := post(t, b, "deposit", body)
		if rb.Status != domain.StatusApplied {
			t.Fatalf("b's deposit after losing a race: %+v, want applied", rb)
		}
		// a decides it on its cache, which misses the key: its append is a
		// repeat of b's (repeats.go), answered as a duplicate of b's.
		if ra := post(t, a, "deposit", body); !ra.Duplicate || !sameReply(ra, rb) {
			t.Errorf("the deposit resent to a: %+v, want b's %+v as a duplicate", ra, rb)
		}
		audit(t, st, true)
	})
}
