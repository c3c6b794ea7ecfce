package ledger

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// TestBatchFinishedIsCounted: a batch element's finished closes exactly
// when it and every command it comes after (transitively) have their
// answers, whatever order the answers come in, on a chain of a batch's full
// length too (countFinished, which replaced a goroutine per element).
func TestBatchFinishedIsCounted(t *testing.T) {
	dep := unitDeposit
	mixed := []batchCmd{
		dep("k0", "a"), dep("k1", "a"), dep("k2", "b"),
		{"transfer", map[string]any{"idempotency_key": "k3", "transfer_id": "t", "from": "a", "to": "b", "amount": 1, "currency": "EUR"}}, // after 1 and 2
		{"transfer", map[string]any{"idempotency_key": "k4", "transfer_id": "u", "from": "a", "to": "b", "amount": 1, "currency": "EUR"}}, // after 3, named twice
		{"deposit", map[string]any{"idempotency_key": "k5"}},                                                                              // invalid: finished at once
		{"refund", map[string]any{"idempotency_key": "k6", "original_key": "k0", "amount": 1}},                                            // after everything before
		dep("k7", "c"), dep("k6", "c"), // after the refund
	}
	var chain []batchCmd
	for i := range domain.MaxBatchCommands {
		chain = append(chain, dep(fmt.Sprintf("c%d", i), "hot"))
	}
	rng := rand.New(rand.NewPCG(24, 24))
	for name, cmds := range map[string][]batchCmd{"mixed": mixed, "chain": chain} {
		b, ierr := domain.DecodeBatch(batchBody(cmds))
		if ierr != nil {
			t.Fatal(ierr)
		}
		for round := range 20 {
			elems := scheduleBatch(b.Commands)
			answered := make([]bool, len(elems))
			for i, c := range b.Commands {
				answered[i] = c.Invalid != nil
			}
			order := rng.Perm(len(elems))
			if round == 0 { // the last first: each waits for all before it
				for i := range order {
					order[i] = len(elems) - 1 - i
				}
			}
			for _, i := range order {
				if answered[i] {
					continue
				}
				elems[i].finish()
				answered[i] = true
				checkFinished(t, name, elems, answered)
			}
		}
	}
}

// checkFinished fails t unless each element's finished is closed exactly
// when it and everything it comes after are answered.
func checkFinished(t *testing.T, name string, elems []*batchElement, answered []bool) {
	t.Helper()
	index := map[*batchElement]int{}
	for i, e := range elems {
		index[e] = i
	}
	var want func(i int) bool
	want = func(i int) bool {
		if !answered[i] {
			return false
		}
		for _, a := range elems[i].after {
			if !want(index[a]) {
				return false
			}
		}
		return true
	}
	for i, e := range elems {
		select {
		case <-e.finished:
			if !want(i) {
				t.Fatalf("%s: element %d finished before an earlier one it comes after", name, i)
			}
		default:
			if want(i) {
				t.Fatalf("%s: element %d not finished, though it and every earlier one it comes after are", name, i)
			}
		}
	}
}

// TestAppendReqAnswerMeetsOnAnswer: a request's outcome reaches the function
// given to onAnswer exactly once whether the committer answered before or
// after it was given (a batch element's commit has no goroutine waiting for
// it: lost, its batch would wait forever, and this test with it).
func TestAppendReqAnswerMeetsOnAnswer(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 2000 {
		r := &appendReq{done: make(chan appendResp, 1)}
		var calls sync.WaitGroup
		calls.Add(1)
		var got []int
		var mu sync.Mutex
		f := func(resp appendResp) {
			mu.Lock()
			got = append(got, len(resp.res))
			mu.Unlock()
			calls.Done()
		}
		wg.Add(2)
		answer := func() {
			defer wg.Done()
			r.answer(appendResp{res: make([]eventstore.AppendResult, i%3+1)})
		}
		register := func() { defer wg.Done(); r.onAnswer(f) }
		if i%2 == 0 {
			go answer()
			go register()
		} else {
			go register()
			go answer()
		}
		calls.Wait()
		wg.Wait()
		if len(got) != 1 || got[0] != i%3+1 {
			t.Fatalf("request %d: onAnswer's function got %v, want one outcome of %d results", i, got, i%3+1)
		}
	}
	r := &appendReq{done: make(chan appendResp, 1)}
	r.answer(appendResp{res: make([]eventstore.AppendResult, 2)})
	if resp := <-r.done; len(resp.res) != 2 { // nobody gave a function: on done, as before
		t.Fatalf("done got %d results, want 2", len(resp.res))
	}
}
