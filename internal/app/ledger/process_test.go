package ledger

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// recoverPass is one pass of p once every write made before it shows in
// "all" (devtest.Settle): a pass reads only up to the store's gap-safe
// horizon, and the passes here are asserted on as having seen those writes.
func recoverPass(t *testing.T, p *Process) SweepStats {
	t.Helper()
	devtest.Settle(t, p.store)
	st, err := p.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Errors != 0 {
		t.Fatalf("recovery pass: %+v", st)
	}
	return st
}

func holdBody(key, account, hold string, amount int64, kv ...any) []any {
	return append([]any{"idempotency_key", key, "account_id", account, "hold_id", hold, "amount", amount, "currency", "EUR"}, kv...)
}

func TestHolds(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)

		// Partial capture: the rest is released.
		r := must(t, s, "place_hold", holdBody("h1", "alice", "h1", 50)...)
		if a := r.Account; a.Balance != 100 || a.Held != 50 || a.Available != 50 {
			t.Fatalf("placed: %+v", a)
		}
		r = must(t, s, "capture_hold", "idempotency_key", "c1", "account_id", "alice", "hold_id", "h1", "amount", 20)
		if a := r.Account; a.Balance != 80 || a.Held != 0 || a.Available != 80 {
			t.Fatalf("captured: %+v", a)
		}
		// Capture after release.
		must(t, s, "place_hold", holdBody("h2", "alice", "h2", 10)...)
		must(t, s, "release_hold", "idempotency_key", "rel2", "account_id", "alice", "hold_id", "h2")
		r = send(s, "capture_hold", "idempotency_key", "c2", "account_id", "alice", "hold_id", "h2")
		if r.Status != domain.StatusRejected || r.Code != domain.CodeHoldNotActive {
			t.Fatalf("capture after release: %+v", r)
		}
		// A withdrawal may not use held money.
		must(t, s, "place_hold", holdBody("h3", "alice", "h3", 70)...)
		r = send(s, "withdraw", "idempotency_key", "w1", "account_id", "alice", "amount", 11, "currency", "EUR")
		if r.Code != domain.CodeInsufficientFunds || r.Account.Available != 10 {
			t.Fatalf("withdraw beyond available: %+v", r)
		}
		must(t, s, "withdraw", "idempotency_key", "w2", "account_id", "alice", "amount", 10, "currency", "EUR")
		must(t, s, "release_hold", "idempotency_key", "rel3", "account_id", "alice", "hold_id", "h3")

		// Expiry, driven by the controlled clock.
		expiry := clk.Now().Add(time.Hour)
		must(t, s, "place_hold", holdBody("h4", "alice", "h4", 5, "expires_at", expiry.Format(time.RFC3339))...)
		must(t, s, "place_hold", holdBody("h5", "alice", "h5", 6, "expires_at", expiry.Format(time.RFC3339))...)
		p := NewProcess(newSagaService(st, clk), st, ProcessOptions{})
		if got := recoverPass(t, p); got.Expired != 0 || got.Holds != 2 {
			t.Fatalf("before expiry: %+v", got)
		}
		clk.Advance(59 * time.Minute)
		if got := recoverPass(t, p); got.Expired != 0 {
			t.Fatalf("a minute before expiry: %+v", got)
		}
		// h5 is captured in time; h4 is left to expire.
		must(t, s, "capture_hold", "idempotency_key", "c5", "account_id", "alice", "hold_id", "h5")
		clk.Advance(time.Minute) // exactly at the expiry: expired
		// Before the process runs, a capture at the ledger's time is already late.
		r = send(s, "capture_hold", "idempotency_key", "c4-late", "account_id", "alice", "hold_id", "h4")
		if r.Code != domain.CodeHoldExpired {
			t.Fatalf("capture at expiry: %+v", r)
		}
		if got := recoverPass(t, p); got.Expired != 1 || got.Holds != 0 {
			t.Fatalf("at expiry: %+v", got)
		}
		evs := devtest.StreamEvents(t, st, "account-alice")
		last := evs[len(evs)-1]
		var rel domain.HoldReleased
		m, _ := domain.DecodeMetadata(last.Metadata)
		if last.Type != domain.EvHoldReleased || json.Unmarshal(last.Data, &rel) != nil || rel.Reason != domain.ReasonHoldExpired || rel.HoldID != "h4" || m.Key != "h4:expire" {
			t.Fatalf("last event %s %s key %q", last.Type, last.Data, m.Key)
		}
		r = send(s, "capture_hold", "idempotency_key", "c4", "account_id", "alice", "hold_id", "h4")
		if r.Code != domain.CodeHoldExpired {
			t.Fatalf("capture after expiry: %+v", r)
		}
		// Again, and by other instances with their own views at once: nothing more.
		recoverPass(t, p)
		n := len(devtest.SettledAll(t, st))
		var wg sync.WaitGroup
		for i := 0; i < 2; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q := NewProcess(newSagaService(st, clk), st, ProcessOptions{CheckpointStream: "cp-" + string(rune('a'+i))})
				if _, err := q.Recover(context.Background()); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if got := countType(devtest.SettledAll(t, st), domain.EvHoldReleased); got != 3 { // h2 released, h3 released, h4 expired
			t.Fatalf("%d releases", got)
		}
		if got := len(devtest.SettledAll(t, st)); got != n+2 { // the two new checkpoint streams
			t.Fatalf("%d events written after the expiry", got-n)
		}
		a := audit(t, st, true)
		if acc := a.accounts["alice"]; acc.Balance != 64 || acc.Held != 0 {
			t.Fatalf("alice %d held %d", acc.Balance, acc.Held)
		}
	})
}

// Two processes racing to expire the same hold (each from its own view): one release.
func TestHoldExpiryRace(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		for i := 0; i < 5; i++ {
			must(t, s, "place_hold", holdBody("h"+string(rune('0'+i)), "alice", "h"+string(rune('0'+i)), 10, "expires_at", clk.Now().Add(time.Minute).Format(time.RFC3339))...)
		}
		clk.Advance(time.Hour)
		devtest.Settle(t, st) // each pass below must see the holds (recoverPass)
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q := NewProcess(newSagaService(st, clk), st, ProcessOptions{CheckpointStream: "cp-" + string(rune('a'+i))})
				if _, err := q.Recover(context.Background()); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if got := countType(devtest.StreamEvents(t, st, "account-alice"), domain.EvHoldReleased); got != 5 {
			t.Fatalf("%d releases of 5 holds", got)
		}
		audit(t, st, true)
	})
}

// Run, fed by the subscription, finishes a crashed transfer and expires a hold;
// a restarted process resumes from its checkpoint in the store.
func TestProcessRun(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		opts := ProcessOptions{Grace: 10 * time.Second, SweepInterval: 5 * time.Millisecond, CheckpointInterval: time.Nanosecond}
		ctx := context.Background()
		p := NewProcess(newSagaService(st, clk), st, opts)
		run := devtest.Go(t, p.Run)

		crashAt(s, "transfer/debit")
		if r := send(s, "transfer", transferBody("t-1", "t1", "alice", "bob", 30)...); r.Status != domain.StatusError {
			t.Fatalf("no crash: %+v", r)
		}
		must(t, s, "place_hold", holdBody("h1", "alice", "h1", 10, "expires_at", clk.Now().Add(time.Hour).Format(time.RFC3339))...)
		// Within the grace period nothing happens: the handler may still be at work.
		devtest.Eventually(t, 20*time.Second, "the process to see the transfer", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.view.Transfers["t1"] != nil && p.view.Holds["alice/h1"] != nil
		})
		if r, _ := s.Lookup(ctx, "t-1"); r != nil {
			t.Fatal("transfer decided within the grace period")
		}
		clk.Advance(2 * time.Hour)
		devtest.Eventually(t, 20*time.Second, "the transfer to be decided", func() bool {
			r, err := s.Lookup(ctx, "t-1")
			return err == nil && r != nil && r.Transfer.Status == "completed"
		})
		devtest.Eventually(t, 20*time.Second, "the hold to expire", func() bool {
			evs := devtest.StreamEvents(t, st, "account-alice")
			return evs[len(evs)-1].Type == domain.EvHoldReleased
		})
		devtest.Eventually(t, 20*time.Second, "a checkpoint past the hold's expiry", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.view.Holds) == 0 && len(p.view.Transfers) == 0 && p.cpPos.Compare(p.view.Position) == 0
		})
		if err := run.Stop(); err != nil {
			t.Fatal(err)
		}

		// Restart: the new process starts from the checkpoint, not from the start.
		q := NewProcess(newSagaService(st, clk), st, opts)
		q.mu.Lock()
		if err := q.loadLocked(context.Background()); err != nil {
			t.Fatal(err)
		}
		if q.view.Position.Compare(p.cpPos) != 0 || q.view.Position == eventstore.Start {
			t.Fatalf("restored at %s, checkpointed at %s", q.view.Position, p.cpPos)
		}
		q.mu.Unlock()
		audit(t, st, true)
	})
}

// A transfer pending when the checkpoint was taken is in the checkpoint: a new
// process that reads only what follows still finishes it.
func TestProcessCheckpointKeepsPendingWork(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		crashAt(s, "transfer/credit")
		if r := send(s, "transfer", transferBody("t-1", "t1", "alice", "bob", 30)...); r.Status != domain.StatusError {
			t.Fatalf("no crash: %+v", r)
		}
		must(t, s, "place_hold", holdBody("h1", "alice", "h1", 10, "expires_at", clk.Now().Add(time.Hour).Format(time.RFC3339))...)
		p := NewProcess(newSagaService(st, clk), st, ProcessOptions{Grace: time.Minute})
		if got := recoverPass(t, p); got.Pending != 1 || got.Holds != 1 || got.Resumed != 0 {
			t.Fatalf("first pass: %+v", got)
		}
		// Later events, past the checkpoint.
		crashAt(s, "transfer/requested")
		if r := send(s, "transfer", transferBody("t-2", "t2", "alice", "bob", 5)...); r.Status != domain.StatusError {
			t.Fatalf("no crash: %+v", r)
		}
		clk.Advance(2 * time.Hour)
		q := NewProcess(newSagaService(st, clk), st, ProcessOptions{Grace: time.Minute})
		if got := recoverPass(t, q); got.Resumed != 2 || got.Expired != 1 || got.Pending != 0 || got.Holds != 0 {
			t.Fatalf("second pass: %+v", got)
		}
		a := audit(t, st, true)
		if a.balance("alice") != 65 || a.balance("bob") != 35 || a.accounts["alice"].Held != 0 {
			t.Fatalf("balances %d %d", a.balance("alice"), a.balance("bob"))
		}
	})
}

// An unreadable checkpoint (another version, damage) costs a full scan, nothing more.
func TestProcessUnreadableCheckpoint(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		crashAt(s, "transfer/debit")
		if r := send(s, "transfer", transferBody("t-1", "t1", "alice", "bob", 30)...); r.Status != domain.StatusError {
			t.Fatalf("no crash: %+v", r)
		}
		junk := eventstore.EventData{ID: domain.EventID("junk", "ledger-process-checkpoint", 0), Type: "ProcessCheckpointV9", Data: []byte(`{"version":9}`), Metadata: []byte(`{"key":"junk","i":0,"n":1}`)}
		if _, err := st.Append(context.Background(), "ledger-process-checkpoint", eventstore.NoStream, []eventstore.EventData{junk}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Hour)
		p := NewProcess(newSagaService(st, clk), st, ProcessOptions{})
		if got := recoverPass(t, p); got.Resumed != 1 || got.Pending != 0 {
			t.Fatalf("pass: %+v", got)
		}
		if evs := devtest.StreamEvents(t, st, "ledger-process-checkpoint"); len(evs) != 2 || evs[1].Type != EvProcessCheckpoint {
			t.Fatalf("checkpoint stream: %d events", len(evs))
		}
		audit(t, st, true)
	})
}
