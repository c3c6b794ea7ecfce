package ledger

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// holdKeyMulti holds the append of the command with key until release closes.
type holdKeyMulti struct {
	eventstore.MultiAppender
	key     string
	release chan struct{}
}

func (h *holdKeyMulti) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	for _, p := range parts {
		if p.Stream == domain.KeyStream(h.key) {
			<-h.release
			break
		}
	}
	return h.MultiAppender.AppendMulti(ctx, parts)
}

// pollFor polls cond until it holds or d has passed (a hook's wait for a
// state, not an order by time); whether it held.
func pollFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// A third party's command (a single deposit y on a, not of the batch), taking
// a's lock after d0 and w1 were refused (another instance wrote a first:
// conflictOnceMulti) and a drained, starts a new chain on a; k, queued
// behind y, loads y's pending state, which does not hold w1. It must still
// wait for w1 to be decided again (refusedBefore on every load): when only a
// durable load asked the marks, k was applied and w1 rejected. (Until the
// rule of the element after an error, d0's commit failed here instead:
// ErrEarlierUndecided now answers w1 and k error.)
func TestBatchRefusalBeforeAThirdPartysChain(t *testing.T) {
	st := devtest.Memory(t)
	var hold *holdKeyMulti
	s, c := conflictService(t, st, st, 1, func(m eventstore.MultiAppender) eventstore.MultiAppender {
		hold = &holdKeyMulti{MultiAppender: m, key: "y", release: make(chan struct{})}
		return hold
	})
	c.let() // d0 decided again goes at once
	var relOnce sync.Once
	rel := func() { relOnce.Do(func() { close(hold.release) }) }
	defer rel()

	a := domain.AccountStream("a")
	yDone := make(chan Reply, 1)
	var w1Once, yOnce sync.Once
	var yQueued, kQueued, drained atomic.Bool // the interleaving the hooks set up was reached
	yHooked := make(chan struct{})
	s.loadHook = func(ctx context.Context, stream string) {
		if stream != a {
			return
		}
		e := batchElementOf(ctx)
		switch {
		case e != nil && e.index == 1:
			w1Once.Do(func() {
				go func() {
					yDone <- post(t, s, "deposit", `{"idempotency_key":"y","account_id":"a","amount":1,"currency":"EUR"}`)
				}()
				yQueued.Store(pollFor(10*time.Second, func() bool { return s.locks.waiting(a) >= 2 })) // y queued on a's lock behind w1
			})
		case e == nil:
			yOnce.Do(func() {
				kQueued.Store(pollFor(10*time.Second, func() bool { return s.locks.waiting(a) >= 2 })) // k queued behind y
				c.open()
				drained.Store(pollFor(10*time.Second, func() bool { return s.pipes.inflightCount(a) == 0 })) // d0, w1 refused, drained
				close(yHooked)
			})
		}
	}
	cmds, done := startD0W1K(s)
	select {
	case <-yHooked:
	case <-time.After(30 * time.Second):
		t.Fatal("y never loaded a")
	}
	// time for k, queued on y's pending state, to be decided before w1 had
	// it been let (two appends in flight), or to wait for w1
	pollFor(5*time.Second, func() bool { return s.pipes.inflightCount(a) == 2 })
	rel()
	r := awaitBatch(t, done)
	<-yDone
	if !yQueued.Load() || !kQueued.Load() || !drained.Load() {
		t.Fatalf("the interleaving was not reached: y queued behind w1 %v, k behind y %v, a drained %v", yQueued.Load(), kQueued.Load(), drained.Load())
	}
	checkReplies(t, r, cmds, []wantReply{
		{domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusRejected, domain.CodeInsufficientFunds}})
}

// conflictOnceMulti: d0's first append waits for open, then lets another
// instance write a first (other: d0's expected revision is then wrong, and
// d0 and the commands decided on it are refused and decided again); its
// second (d0 decided again) waits for let.
type conflictOnceMulti struct {
	eventstore.MultiAppender
	other   func()
	release chan struct{}
	hold2   chan struct{}
	n       atomic.Int32
	o1, o2  sync.Once
}

// open lets d0's first append go (and be refused).
func (c *conflictOnceMulti) open() { c.o1.Do(func() { close(c.release) }) }

// let lets d0's second append go.
func (c *conflictOnceMulti) let() { c.o2.Do(func() { close(c.hold2) }) }

func (c *conflictOnceMulti) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	for _, p := range parts {
		if p.Stream == domain.KeyStream("d0") {
			if c.n.Add(1) == 1 {
				<-c.release
				c.other()
			} else {
				<-c.hold2
			}
			break
		}
	}
	return c.MultiAppender.AppendMulti(ctx, parts)
}

// conflictService is a service over st (reads: st's reads, or a wrapper of
// them) with that many committers (a's appends all go to one, b's to the
// other when two), on a book of a (150 EUR) and b
// (open), whose appends go through c (conflictOnceMulti: another instance
// deposits 1 to a, key "other", as d0's first append is let go; its
// cleanups open c). wrap, when not nil, wraps c.
func conflictService(t *testing.T, st interface {
	eventstore.Store
	eventstore.MultiAppender
}, reads eventstore.Store, committers int, wrap func(eventstore.MultiAppender) eventstore.MultiAppender) (*Service, *conflictOnceMulti) {
	s := newService(st)
	mustApply(t, s, "open_account", `{"idempotency_key":"oa","account_id":"a","currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"da","account_id":"a","amount":150,"currency":"EUR"}`)
	mustApply(t, s, "open_account", `{"idempotency_key":"ob","account_id":"b","currency":"EUR"}`)
	s.Close()
	other := New(st, Options{Clock: clock, Logger: quietLog, DisableGroupCommit: true})
	t.Cleanup(other.Close)
	c := &conflictOnceMulti{MultiAppender: st, release: make(chan struct{}), hold2: make(chan struct{})}
	c.other = func() { // on a committer goroutine: t.Errorf, as t.Fatalf there would stop it and hang the batch
		if r := post(t, other, "deposit", `{"idempotency_key":"other","account_id":"a","amount":1,"currency":"EUR"}`); r.Status != domain.StatusApplied {
			t.Errorf("another instance's deposit to a: %+v", r)
		}
	}
	var multi eventstore.MultiAppender = c
	if wrap != nil {
		multi = wrap(c)
	}
	s = New(struct {
		eventstore.Store
		eventstore.MultiAppender
	}{reads, multi}, Options{Clock: clock, Logger: quietLog, Batch: BatchOptions{Committers: committers}})
	t.Cleanup(s.Close)
	t.Cleanup(c.let) // when the test fails before it lets them (cleanups run last first)
	t.Cleanup(c.open)
	return s, c
}

// No third party: d0 and w1 refused (another instance wrote a), k waits on
// one of the two marks (earlierRefused returns any); when it is d0's, d0
// decided again (a new chain, its commit in flight) wakes k, and k loads
// d0's pending state, which does not hold w1: it must wait again. When only
// a durable load asked the marks, k was applied and w1 rejected (5 runs of 6).
func TestBatchRefusalAfterAnEarlierRedecided(t *testing.T) {
	st := devtest.Memory(t)
	s, c := conflictService(t, st, st, 1, nil)
	a := domain.AccountStream("a")
	var kOnce sync.Once
	var drained atomic.Bool // d0 and w1 refused and a drained before k went on
	hooked := make(chan struct{})
	s.loadHook = func(ctx context.Context, stream string) {
		e := batchElementOf(ctx)
		if stream != a || e == nil || e.index != 2 {
			return
		}
		kOnce.Do(func() {
			c.open()
			drained.Store(pollFor(10*time.Second, func() bool { return s.pipes.inflightCount(a) == 0 }))
			close(hooked)
		})
	}
	cmds, done := startD0W1K(s)
	<-hooked
	// time for k, woken by d0 decided again, to be decided on d0's new chain
	// before w1 had it been let (two appends in flight), or to wait again
	pollFor(3*time.Second, func() bool { return s.pipes.inflightCount(a) == 2 })
	c.let()
	r := awaitBatch(t, done)
	if !drained.Load() {
		t.Fatal("the interleaving was not reached: d0 and w1 were not refused with a drained before k went on")
	}
	checkReplies(t, r, cmds, []wantReply{
		{domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusRejected, domain.CodeInsufficientFunds}})
}

// startD0W1K sends the batch [d0 deposit 1 to a, w1 withdraw 100 from a, k
// withdraw 100 from a] to s; its reply comes on done.
func startD0W1K(s *Service) (cmds []batchCmd, done chan Reply) {
	cmds = []batchCmd{
		{"deposit", map[string]any{"idempotency_key": "d0", "account_id": "a", "amount": 1, "currency": "EUR"}},
		{"withdraw", map[string]any{"idempotency_key": "w1", "account_id": "a", "amount": 100, "currency": "EUR"}},
		{"withdraw", map[string]any{"idempotency_key": "k", "account_id": "a", "amount": 100, "currency": "EUR"}},
	}
	done = make(chan Reply, 1)
	go func() { done <- s.HandleBatch(context.Background(), batchBody(cmds), 0) }()
	return cmds, done
}
