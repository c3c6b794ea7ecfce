package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
)

// countingStore counts the transactions group commit opens and the parts they carry.
type countingStore struct {
	testStore
	multi    eventstore.MultiAppender
	txs      atomic.Int64
	maxParts atomic.Int64
}

func (c *countingStore) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	c.txs.Add(1)
	for {
		m := c.maxParts.Load()
		if int64(len(parts)) <= m || c.maxParts.CompareAndSwap(m, int64(len(parts))) {
			break
		}
	}
	return c.multi.AppendMulti(ctx, parts)
}

func TestGroupCommitSharesTransactions(t *testing.T) {
	backends(t, func(t *testing.T, newStore func() testStore) {
		st := newStore()
		multi, ok := st.(eventstore.MultiAppender)
		if !ok {
			t.Skip("group commit needs a store with multi-stream appends; this one has none")
		}
		cs := &countingStore{testStore: st, multi: multi}
		s := New(cs, Options{Clock: clock})
		defer s.Close()
		const accounts = 64
		var wg sync.WaitGroup
		for i := 0; i < accounts; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mustApply(t, s, "open_account", fmt.Sprintf(`{"idempotency_key":"o%d","account_id":"a%d","currency":"EUR"}`, i, i))
				for k := 0; k < 10; k++ {
					mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"d%d-%d","account_id":"a%d","amount":1,"currency":"EUR"}`, i, k, i))
				}
			}()
		}
		wg.Wait()
		commands := int64(accounts * 11)
		if got := cs.txs.Load(); got >= commands || cs.maxParts.Load() < 4 {
			t.Fatalf("%d commands took %d transactions, at most %d parts in one: no group commit", commands, got, cs.maxParts.Load())
		}
		t.Logf("%d commands in %d transactions (largest %d parts)", commands, cs.txs.Load(), cs.maxParts.Load())
		checkInvariants(t, st)
	})
}

// One refused command is handed its error; its batch-mates commit without it.
func TestBatchPeelsOffARefusedCommand(t *testing.T) {
	st := memory.New()
	b := newBatcher(st, BatchOptions{Committers: 1})
	defer b.close()
	ev := func(s string) []eventstore.EventData {
		return []eventstore.EventData{{ID: uuid.NewSHA1(domain.Namespace, []byte(s)), Type: "T", Data: []byte(`{}`), Metadata: []byte(`{}`)}}
	}
	if _, err := st.Append(context.Background(), "taken", eventstore.NoStream, ev("first")); err != nil {
		t.Fatal(err)
	}
	reqs := []*appendReq{
		{ctx: context.Background(), parts: []eventstore.StreamAppend{{Stream: "s1", Expected: eventstore.NoStream, Events: ev("a")}}, done: make(chan appendResp, 1)},
		{ctx: context.Background(), parts: []eventstore.StreamAppend{{Stream: "taken", Expected: eventstore.NoStream, Events: ev("b")}}, done: make(chan appendResp, 1)},
		{ctx: context.Background(), parts: []eventstore.StreamAppend{{Stream: "s2", Expected: eventstore.NoStream, Events: ev("c")}, {Stream: "s3", Expected: eventstore.NoStream, Events: ev("d")}}, done: make(chan appendResp, 1)},
	}
	b.commit(append([]*appendReq(nil), reqs...))
	for i, r := range reqs {
		resp := <-r.done
		if i == 1 {
			if !errors.Is(resp.err, eventstore.ErrWrongExpectedRevision) {
				t.Fatalf("refused command got %v", resp.err)
			}
			continue
		}
		if resp.err != nil || len(resp.res) != len(r.parts) {
			t.Fatalf("batch-mate %d: %v %v", i, resp.res, resp.err)
		}
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		if evs, err := st.ReadStream(context.Background(), s, 0, eventstore.Forwards, 0); err != nil || len(evs) != 1 {
			t.Fatalf("%s: %v %v", s, evs, err)
		}
	}
}

func TestSplitOverlapsDefersTheSecondWriterOfAStream(t *testing.T) {
	mk := func(streams ...string) *appendReq {
		r := &appendReq{}
		for _, s := range streams {
			r.parts = append(r.parts, eventstore.StreamAppend{Stream: s})
		}
		return r
	}
	a, b, c := mk("key-k", "account-a"), mk("key-k", "account-b"), mk("account-c")
	keep, deferred := splitOverlaps([]*appendReq{a, b, c})
	if len(keep) != 2 || keep[0] != a || keep[1] != c || len(deferred) != 1 || deferred[0] != b {
		t.Fatalf("keep %v deferred %v", keep, deferred)
	}
}
