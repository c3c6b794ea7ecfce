package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/ledger"
)

// heldStore is the event store of a second ledger instance, in the suite's own
// process, whose next account append is held open (written, not committed) until
// released: the transaction with the smaller xid commits after later ones.
type heldStore struct {
	s       *postgres.Store
	mu      sync.Mutex
	armed   bool
	held    chan struct{}
	release chan struct{}
}

func (h *heldStore) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	return h.s.ReadStream(ctx, stream, from, dir, max)
}

func (h *heldStore) Append(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.AppendResult, error) {
	h.mu.Lock()
	hold := h.armed && strings.HasPrefix(stream, domain.AccountStreamPrefix)
	if hold {
		h.armed = false
	}
	h.mu.Unlock()
	if !hold {
		return h.s.Append(ctx, stream, expected, events)
	}
	held, err := h.s.AppendHeld(ctx, stream, expected, events)
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	h.held <- struct{}{}
	select {
	case <-h.release:
	case <-time.After(20 * time.Second): // bounded
		held.Rollback()
		return eventstore.AppendResult{}, errors.New("held append never released")
	}
	if err := held.Commit(); err != nil {
		return eventstore.AppendResult{}, err
	}
	// The same append again is idempotent and returns the committed result.
	return h.s.Append(ctx, stream, expected, events)
}

// scenarioCommitOrder holds a ledger transaction open while the other ledger
// commits later events, many times, under a running projector: the projector
// (and every "all" reader) must not skip the late commit (C6, C1).
func scenarioCommitOrder(ctx context.Context, s *suite, res *result) error {
	sys, c, err := upOne(ctx, s, "s8")
	if err != nil {
		return err
	}
	defer sys.down()
	h := c.h
	w := &workload{prefix: "s8", accounts: hotAccounts("s8", 8), producers: 2, commands: 40, retries: 8, seed: s.seed}
	if err := w.open(ctx, c); err != nil {
		return err
	}
	hs := &heldStore{s: sys.store, held: make(chan struct{}, 1), release: make(chan struct{})}
	svc2 := ledger.New(hs, ledger.Options{Producer: "chaos-held", DisableGroupCommit: true, Logger: quietLogger()})
	defer svc2.Close()

	rounds := s.size(20, 6)
	raced := 0
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		acc := w.accounts[i%4]
		key := fmt.Sprintf("s8-held-%03d", i)
		b := body(key, map[string]any{"account_id": acc.id, "amount": 10 + i, "currency": acc.currency})
		hs.mu.Lock()
		hs.armed = true
		hs.mu.Unlock()
		h.noteSent(key, "deposit", b)
		done := make(chan Attempt, 1)
		go func() { done <- depositInProc(ctx, svc2, h, key, b) }()
		select {
		case <-hs.held:
		case <-time.After(20 * time.Second):
			return errors.New("the held append never started")
		}
		// Later transactions commit while the earlier one is open.
		later := commitLater(ctx, c, w, i)
		time.Sleep(150 * time.Millisecond) // the projector polls meanwhile
		close(hs.release)
		a := <-done
		hs.release = make(chan struct{})
		if a.Outcome != OK {
			return fmt.Errorf("held deposit %s: %s %s", key, a.Outcome, a.Err)
		}
		if later > 0 {
			raced++
		}
	}
	res.notes = append(res.notes, fmt.Sprintf("%d transactions held open across %d later commits each (3 planned)", raced, 3))
	if err := sys.quiesce(ctx, 60*time.Second); err != nil {
		return err
	}
	return sys.finish(ctx, h, res, true, func(_ context.Context, _ *system, res *result) { res.ev.Other += raced })
}

// depositInProc sends the deposit b under key to svc in this process, as a
// client would (30 s to answer), and records the attempt in h.
func depositInProc(ctx context.Context, svc *ledger.Service, h *History, key string, b []byte) Attempt {
	a := Attempt{Key: key, Type: "deposit", Body: b, Via: "inproc", Start: time.Now()}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r := svc.HandleRaw(hctx, "deposit", b)
	a.Duration = time.Since(a.Start)
	a.Reply = &r
	switch r.Status {
	case domain.StatusApplied, domain.StatusRejected:
		a.Outcome = OK
	case domain.StatusInvalid:
		a.Outcome = Failed
	default:
		a.Outcome, a.Err = Indefinite, r.Message
	}
	h.add(a)
	return a
}

// commitLater commits round i's 3 later deposits, on other accounts than the
// held one, and counts those whose outcome was OK.
func commitLater(ctx context.Context, c *client, w *workload, i int) int {
	later := 0
	for j := 0; j < 3; j++ {
		acc2 := w.accounts[4+(i+j)%4]
		k2 := fmt.Sprintf("s8-later-%03d-%d", i, j)
		if a := c.settle(ctx, k2, "deposit", body(k2, map[string]any{"account_id": acc2.id, "amount": 1 + j, "currency": acc2.currency}), 8); a.Outcome == OK {
			later++
		}
	}
	return later
}
