package ledger

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// failingKeyMulti fails every multi-stream append that writes key's claim,
// having written nothing, until healed is set; the first one it holds until
// release is closed. The others pass.
type failingKeyMulti struct {
	eventstore.MultiAppender
	key     string
	release chan struct{}
	once    sync.Once
	healed  atomic.Bool
}

func (f *failingKeyMulti) open() { f.once.Do(func() { close(f.release) }) }

func (f *failingKeyMulti) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	for _, p := range parts {
		if p.Stream == domain.KeyStream(f.key) && !f.healed.Load() {
			<-f.release
			return nil, errInjected
		}
	}
	return f.MultiAppender.AppendMulti(ctx, parts)
}

// TestBatchOnAFailedCommit: a batch of one hot account's deposits is decided
// and queued, every command on the pending state of the one before, while
// the first command's commit is held; it then fails, writing nothing (and so
// does every later one that carries the first command: group commit tries a
// failed transaction's commands again one by one). Every
// command decided on it is answered an error or decided again, never
// acknowledged on the failed state: each one answered applied stands in the
// store, once, with the balance it was answered. The first is answered an
// error, and so is every other (each comes after it: ErrEarlierUndecided),
// nothing written for them; until that rule, they were decided again on the
// store's head (balance i for element i). The batch resent applies them
// all, element i leaving i+1.
func TestBatchOnAFailedCommit(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"hot","currency":"EUR"}`)
		s.Close()
		failing := &failingKeyMulti{MultiAppender: st.(eventstore.MultiAppender), key: "d0", release: make(chan struct{})}
		s = New(struct {
			eventstore.Store
			eventstore.MultiAppender
		}{st, failing}, Options{Clock: clock, Logger: quietLog})
		defer s.Close()
		defer failing.open() // when the test fails before it opens it
		const n = 40
		var cmds []batchCmd
		for i := range n {
			cmds = append(cmds, batchCmd{"deposit", map[string]any{"idempotency_key": fmt.Sprintf("d%d", i), "account_id": "hot", "amount": 1, "currency": "EUR"}})
		}
		done := make(chan Reply, 1)
		go func() { done <- s.HandleBatch(context.Background(), batchBody(cmds), 0) }()
		devtest.Eventually(t, time.Minute, "every command decided and queued behind the held commit", func() bool {
			return s.pipes.inflightCount("account-hot") == n
		})
		failing.open()
		r := <-done
		stored := map[string]int64{} // key -> the balance its deposit left
		var balance int64
		for _, ev := range devtest.ReadAll(t, st.(eventstore.AllReader)) {
			if ev.Stream != "account-hot" || ev.Type != domain.EvCredited {
				continue
			}
			m, err := domain.DecodeMetadata(ev.Metadata)
			if err != nil {
				t.Fatal(err)
			}
			if _, twice := stored[m.Key]; twice {
				t.Fatalf("key %s deposited twice", m.Key)
			}
			balance++
			stored[m.Key] = balance
		}
		for i, el := range r.Replies {
			if _, ok := stored[el.IdempotencyKey]; el.Status != domain.StatusError || ok {
				t.Fatalf("element %d after element 0's failed commit: %+v; the store has it: %v", i, el, ok)
			}
		}
		failing.healed.Store(true)
		r = s.HandleBatch(context.Background(), batchBody(cmds), 0)
		for i, el := range r.Replies {
			if el.Status != domain.StatusApplied || el.Duplicate || el.Account.Balance != int64(i+1) {
				t.Fatalf("element %d resent: %+v, want applied leaving %d", i, el, i+1)
			}
		}
	})
}
