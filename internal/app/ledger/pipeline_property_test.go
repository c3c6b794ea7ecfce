package ledger

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
)

// faultyStore fails some multi-stream appends: before anything is written, or
// after the transaction committed (the caller learns an error, the events stand).
type faultyStore struct {
	ProcessStore
	multi         eventstore.MultiAppender
	mu            sync.Mutex
	rng           *rand.Rand
	before, after atomic.Int64
}

var errInjected = errors.New("test: injected append failure")

func (f *faultyStore) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	f.mu.Lock()
	roll := f.rng.Intn(100)
	f.mu.Unlock()
	if roll < 3 {
		f.before.Add(1)
		return nil, errInjected
	}
	res, err := f.multi.AppendMulti(ctx, parts)
	if err == nil && roll < 5 {
		f.after.Add(1)
		return nil, fmt.Errorf("%w after commit", errInjected)
	}
	return res, err
}

// TestPropertyPipelinedHotAccounts sends random deposits and withdrawals, most of
// them to three hot accounts, 20% of them resends of an earlier request, from
// workers spread over two instances (whose pipelines race each other's writes:
// wrong expected revisions in the middle of pipelined batches), over a store that
// fails some appends before or after they commit. Every key must be decided once
// and answer its first definite reply forever; and replaying every decided key,
// in the order the store holds them, one at a time through a fresh ledger must
// give the same replies: the same events, the same balances. PROTOCOL.md §6
// invariants hold at the end.
func TestPropertyPipelinedHotAccounts(t *testing.T) {
	sagaStores(t, func(t *testing.T, st ProcessStore) {
		multi, ok := st.(eventstore.MultiAppender)
		if !ok {
			t.Skip("pipelining rides on group commit, which needs multi-stream appends; this store has none")
		}
		const seed, workers = 20261124, 8
		ops := 150
		if testing.Short() {
			ops = 50
		}
		fs := &faultyStore{ProcessStore: st, multi: multi, rng: rand.New(rand.NewSource(seed))}
		clk := newFakeClock()
		svcs := []*Service{newSagaService(fs, clk), newSagaService(fs, clk)}
		defer func() {
			for _, s := range svcs {
				s.Close()
			}
		}()
		accounts := []string{"h0", "h1", "h2", "c0", "c1", "c2", "c3", "c4"}
		type sent struct {
			typ string
			kv  []any
		}
		var (
			mu       sync.Mutex
			requests = map[string]sent{}
			definite = map[string]Reply{}
			history  []string
		)
		record := func(key string, r Reply) {
			mu.Lock()
			defer mu.Unlock()
			if r.Status == domain.StatusError || (r.Status == domain.StatusRejected && len(r.Events) == 0) {
				return // not decided (yet): a resend decides
			}
			if first, ok := definite[key]; ok {
				if !sameReply(first, r) {
					t.Errorf("key %s answered differently:\n got %+v %+v\nwant %+v %+v", key, r, r.Account, first, first.Account)
				}
				return
			}
			definite[key] = r
		}
		for i, a := range accounts {
			kv := []any{"idempotency_key", "open-" + a, "account_id", a, "currency", "EUR"}
			requests["open-"+a] = sent{"open_account", kv}
			record("open-"+a, must(t, svcs[i%2], "open_account", kv...))
		}
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed + int64(w)))
				for i := range ops {
					s := svcs[rng.Intn(2)]
					mu.Lock()
					if len(history) > 0 && rng.Intn(5) == 0 {
						key := history[rng.Intn(len(history))]
						p := requests[key]
						mu.Unlock()
						record(key, send(s, p.typ, p.kv...))
						continue
					}
					key := fmt.Sprintf("w%d-%d", w, i)
					acct := accounts[rng.Intn(3)]
					if rng.Intn(5) == 0 {
						acct = accounts[3+rng.Intn(len(accounts)-3)]
					}
					typ := "deposit"
					if rng.Intn(3) == 0 {
						typ = "withdraw"
					}
					kv := []any{"idempotency_key", key, "account_id", acct, "amount", rng.Intn(100) + 1, "currency", "EUR"}
					requests[key] = sent{typ, kv}
					history = append(history, key)
					mu.Unlock()
					record(key, send(s, typ, kv...))
				}
			}()
		}
		wg.Wait()
		// Every key that got no definite reply is decided by a resend now.
		for _, key := range history {
			if _, ok := definite[key]; !ok {
				p := requests[key]
				for range 3 {
					r := send(svcs[0], p.typ, p.kv...)
					if r.Status != domain.StatusError {
						record(key, r)
						break
					}
				}
			}
		}
		t.Logf("%d keys decided; %d appends failed before and %d after commit", len(definite), fs.before.Load(), fs.after.Load())
		if fs.before.Load() == 0 || fs.after.Load() == 0 {
			t.Fatal("no injected failure: the run did not reach the recovery paths")
		}
		checkInvariants(t, st)

		// The same keys one at a time, in the store's order, through a fresh ledger.
		order := keysInStoreOrder(t, st)
		one := New(memory.New(), Options{Clock: clk.Now, Logger: quietLog, DisableGroupCommit: true})
		for _, key := range order {
			p, ok := requests[key]
			if !ok {
				t.Fatalf("the store holds key %q that was never sent", key)
			}
			r := send(one, p.typ, p.kv...)
			want, ok := definite[key]
			if !ok {
				t.Fatalf("key %q is in the store but never answered definitely", key)
			}
			r.Position, want.Position = "", ""
			if !sameReply(r, want) {
				t.Fatalf("key %q one at a time:\n got %+v %+v\nwant %+v %+v", key, r, r.Account, want, want.Account)
			}
		}
		if len(order) != len(definite) {
			t.Fatalf("%d keys in the store, %d decided", len(order), len(definite))
		}
	})
}

// keysInStoreOrder lists the client keys of the account streams in the order of
// their first event in "all".
func keysInStoreOrder(t *testing.T, st eventstore.AllReader) []string {
	t.Helper()
	type first struct {
		key string
		pos eventstore.Position
	}
	var keys []first
	for _, e := range devtest.ReadAll(t, st) {
		ev, err := toStored(e)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Metadata.Index == 0 && strings.HasPrefix(e.Stream, domain.AccountStreamPrefix) {
			keys = append(keys, first{ev.Metadata.Key, e.Position})
		}
	}
	sort.SliceStable(keys, func(i, j int) bool { return keys[i].pos.Compare(keys[j].pos) < 0 })
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.key
	}
	return out
}
