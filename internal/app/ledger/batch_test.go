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
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// countingStore counts the transactions group commit opens and the parts they carry.
type countingStore struct {
	eventstore.Store
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
	// Group commit needs a store with multi-stream appends.
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		cs := &countingStore{Store: st, multi: st.(eventstore.MultiAppender)}
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
		audit(t, st, true)
	})
}

// One refused command is handed its error; its batch-mates commit without it.
func TestBatchPeelsOffARefusedCommand(t *testing.T) {
	st := memory.New()
	b := newBatcher(st, BatchOptions{Committers: 1}, newMetrics(nil).batchSize)
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
	b.newCommitter().commit(append([]*appendReq(nil), reqs...))
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

// Pipelined commands of one account share a transaction when each part expects
// the revision the one before leaves; one that does not follow waits for the next
// batch, and so does every later request of its stream.
func TestSplitOverlapsKeepsAChainOfOneStream(t *testing.T) {
	mk := func(parts ...eventstore.StreamAppend) *appendReq { return &appendReq{parts: parts} }
	part := func(s string, exp eventstore.ExpectedRevision, n int) eventstore.StreamAppend {
		return eventstore.StreamAppend{Stream: s, Expected: exp, Events: make([]eventstore.EventData, n)}
	}
	r1 := mk(part("key-1", eventstore.NoStream, 1), part("account-a", eventstore.Exact(4), 1))
	r2 := mk(part("key-2", eventstore.NoStream, 1), part("account-a", eventstore.Exact(5), 2))
	r3 := mk(part("account-a", eventstore.Exact(9), 1)) // does not follow r2 (which leaves 7)
	r4 := mk(part("account-a", eventstore.Exact(7), 1)) // follows r2, but behind the deferred r3
	r5 := mk(part("key-3", eventstore.NoStream, 1), part("account-b", eventstore.Exact(0), 1))
	r6 := mk(part("account-b", eventstore.Any, 1)) // after b's chain: an Any part follows nothing exactly
	keep, deferred := splitOverlaps([]*appendReq{r1, r2, r3, r4, r5, r6})
	if len(keep) != 3 || keep[0] != r1 || keep[1] != r2 || keep[2] != r5 {
		t.Fatalf("keep %v", keep)
	}
	if len(deferred) != 3 || deferred[0] != r3 || deferred[1] != r4 || deferred[2] != r6 {
		t.Fatalf("deferred %v", deferred)
	}
}

// A refused command takes down with it the later commands decided on top of it
// (same stream), answered so that their callers decide again; the others commit.
func TestBatchPeelsTheCommandsDecidedOnARefusedOne(t *testing.T) {
	st := memory.New()
	b := newBatcher(st, BatchOptions{Committers: 1}, newMetrics(nil).batchSize)
	defer b.close()
	ev := func(s string) []eventstore.EventData {
		return []eventstore.EventData{{ID: uuid.NewSHA1(domain.Namespace, []byte(s)), Type: "T", Data: []byte(`{}`), Metadata: []byte(`{}`)}}
	}
	if _, err := st.Append(context.Background(), "hot", eventstore.NoStream, ev("other instance")); err != nil {
		t.Fatal(err)
	}
	req := func(parts ...eventstore.StreamAppend) *appendReq {
		return &appendReq{ctx: context.Background(), parts: parts, done: make(chan appendResp, 1)}
	}
	reqs := []*appendReq{
		req(eventstore.StreamAppend{Stream: "cold", Expected: eventstore.NoStream, Events: ev("c")}),
		req(eventstore.StreamAppend{Stream: "k1", Expected: eventstore.NoStream, Events: ev("k1")}, eventstore.StreamAppend{Stream: "hot", Expected: eventstore.NoStream, Events: ev("h0")}),
		req(eventstore.StreamAppend{Stream: "k2", Expected: eventstore.NoStream, Events: ev("k2")}, eventstore.StreamAppend{Stream: "hot", Expected: eventstore.Exact(0), Events: ev("h1")}),
		req(eventstore.StreamAppend{Stream: "cold2", Expected: eventstore.NoStream, Events: ev("c2")}),
	}
	b.newCommitter().commit(append([]*appendReq(nil), reqs...))
	for i, r := range reqs {
		resp := <-r.done
		switch i {
		case 1:
			var wrong *eventstore.WrongExpectedRevisionError
			if !errors.As(resp.err, &wrong) || wrong.Stream != "hot" {
				t.Fatalf("refused command got %v", resp.err)
			}
		case 2:
			if !errors.Is(resp.err, errDecidedOnFailed) || !errors.Is(resp.err, eventstore.ErrWrongExpectedRevision) {
				t.Fatalf("command decided on the refused one got %v", resp.err)
			}
		default:
			if resp.err != nil {
				t.Fatalf("batch-mate %d: %v", i, resp.err)
			}
		}
	}
	for s, n := range map[string]int{"cold": 1, "cold2": 1, "hot": 1, "k1": 0, "k2": 0} {
		evs, err := st.ReadStream(context.Background(), s, 0, eventstore.Forwards, 0)
		if len(evs) != n || (n > 0 && err != nil) {
			t.Fatalf("%s: %d events (%v), want %d", s, len(evs), err, n)
		}
	}
}
