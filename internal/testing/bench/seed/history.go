package seed

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/ledger"
)

// HistoryOptions shape History.
type HistoryOptions struct {
	// Accounts is the number of accounts the history spreads over (at least 2).
	Accounts int
	// KeyPrefix makes keys and IDs unique (default "h").
	KeyPrefix string
	// Progress, when set, is called now and then with the events written so far.
	Progress func(events, total int64)
}

// HistoryResult describes a seeded history.
type HistoryResult struct {
	Events   int64 // events written, key claims included
	Commands int64 // client commands sent (each decided once)
	Rejected int64 // of them refused and recorded (insufficient funds, ...)
}

// A history's unit of work: a few commands of one account (and a counterparty)
// sent in order by one worker, so that a capture follows its hold and a refund
// its original. Units are a function of their index: nothing is held.
const (
	unitDeposit = iota
	unitWithdraw
	unitTransfer
	unitTransaction
	unitHoldCapture
	unitHoldCaptureTo
	unitHoldRelease
	unitDepositRefund
	unitKinds
)

// unitMix weighs the unit kinds (out of 20): mostly deposits and transfers, as
// a payment ledger sees them.
var unitMix = [20]int{
	unitDeposit, unitDeposit, unitDeposit, unitDeposit, unitDeposit,
	unitWithdraw, unitWithdraw, unitTransfer, unitTransfer, unitTransfer,
	unitTransfer, unitTransaction, unitTransaction, unitHoldCapture, unitHoldCaptureTo,
	unitHoldRelease, unitDepositRefund, unitDepositRefund, unitDeposit, unitTransfer,
}

type command struct {
	typ  domain.CommandType
	body []byte
}

// History writes about n events (key claims included) over opts.Accounts
// accounts to dst through the command handler, as clients would: the accounts
// are opened, then units of a realistic mix (deposits, withdrawals, transfers,
// transactions of two postings, holds captured, captured into another account
// or released, deposits refunded in part) run on random-looking accounts, many
// at once. Rejections (insufficient funds) are recorded as in production. The
// accounts must not exist in dst.
func History(ctx context.Context, dst ledger.Store, n int64, o HistoryOptions) (HistoryResult, error) {
	if o.Accounts < 2 {
		return HistoryResult{}, errors.New("seed: a history needs at least 2 accounts")
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "h"
	}
	svc := ledger.New(dst, ledger.Options{Producer: "bench-history"})
	defer svc.Close()
	h := &history{svc: svc, o: o, total: n}
	stop := h.reportProgress()
	defer stop()
	if err := h.run(ctx, int64(o.Accounts), func(i int64) []command { return []command{h.open(i)} }); err != nil {
		return h.result(), err
	}
	err := h.run(ctx, -1, h.unit)
	return h.result(), err
}

type history struct {
	svc                        *ledger.Service
	o                          HistoryOptions
	total                      int64
	events, commands, rejected atomic.Int64
}

func (h *history) result() HistoryResult {
	return HistoryResult{Events: h.events.Load(), Commands: h.commands.Load(), Rejected: h.rejected.Load()}
}

func (h *history) reportProgress() (stop func()) {
	if h.o.Progress == nil {
		return func() {}
	}
	return everySecond(func() { h.o.Progress(h.events.Load(), h.total) })
}

// run sends units 0..units-1 (units < 0: until the history has its events) on
// Workers workers; it returns the first failure.
func (h *history) run(ctx context.Context, units int64, unit func(i int64) []command) error {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	more := func(i int64) bool {
		if units >= 0 {
			return i < units
		}
		return h.events.Load() < h.total
	}
	for range Workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; more(i) && ctx.Err() == nil; i = next.Add(1) - 1 {
				if err := h.send(ctx, unit(i)); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					next.Store(1 << 62) // the others stop too
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// send sends a unit's commands in order; an applied or recorded outcome counts
// its events and its key's claim.
func (h *history) send(ctx context.Context, cmds []command) error {
	for _, c := range cmds {
		r := h.svc.HandleRaw(ctx, string(c.typ), c.body)
		switch {
		case r.Duplicate:
			return fmt.Errorf("seed: %s %s: answered as a duplicate", c.typ, c.body)
		case r.Status == domain.StatusRejected && len(r.Events) > 0:
			h.rejected.Add(1)
		case r.Status != domain.StatusApplied:
			if r.Status == domain.StatusRejected {
				continue // refused without a record (a hold already gone): nothing written
			}
			return fmt.Errorf("seed: %s %s: %s %s: %s", c.typ, c.body, r.Status, r.Code, r.Message)
		}
		h.commands.Add(1)
		h.events.Add(int64(len(r.Events)) + 1)
	}
	return nil
}

func (h *history) account(i int64) string { return h.o.KeyPrefix + "-acc-" + strconv.FormatInt(i, 10) }

func (h *history) open(i int64) command {
	return command{domain.CmdOpenAccount, fmt.Appendf(nil, `{"idempotency_key":"%s-open-%d","account_id":%q,"currency":"EUR"}`, h.o.KeyPrefix, i, h.account(i))}
}

// mix scrambles a unit index into a well-spread number (splitmix64).
func mix(i int64) uint64 {
	z := uint64(i) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// unit is unit i of the history: its kind, accounts and amounts follow from i.
func (h *history) unit(i int64) []command {
	r := mix(i)
	n := uint64(h.o.Accounts)
	a, b := int64(r%n), int64((r/n)%(n-1))
	if b >= a {
		b++ // another account
	}
	c := int64((r / n / n) % n)
	acc, other, third := h.account(a), h.account(b), h.account(c)
	amount := 1 + int64(r>>40)%500
	key := h.o.KeyPrefix + "-" + strconv.FormatInt(i, 10)
	body := func(typ domain.CommandType, suffix, format string, args ...any) command {
		return command{typ, fmt.Appendf(nil, `{"idempotency_key":"%s%s",`+format+`}`, append([]any{key, suffix}, args...)...)}
	}
	switch unitMix[i%int64(len(unitMix))] {
	case unitWithdraw:
		return []command{body(domain.CmdWithdraw, "", `"account_id":%q,"amount":%d,"currency":"EUR"`, acc, amount)}
	case unitTransfer:
		return []command{body(domain.CmdTransfer, "", `"transfer_id":%q,"from":%q,"to":%q,"amount":%d,"currency":"EUR"`, key, acc, other, amount)}
	case unitTransaction:
		if c == a {
			c = b
			third = other
		}
		return []command{body(domain.CmdPostTransaction, "", `"transaction_id":%q,"postings":[{"from":%q,"to":%q,"amount":%d,"currency":"EUR"},{"from":%q,"to":%q,"amount":%d,"currency":"EUR"}]`,
			key, acc, other, amount, acc, third, amount/2+1)}
	case unitHoldCapture, unitHoldCaptureTo, unitHoldRelease:
		return h.holdUnit(unitMix[i%int64(len(unitMix))], key, acc, other, amount, body)
	case unitDepositRefund:
		return []command{
			body(domain.CmdDeposit, "", `"account_id":%q,"amount":%d,"currency":"EUR"`, acc, amount*2),
			body(domain.CmdRefund, "-refund", `"original_key":%q,"amount":%d`, key, amount),
		}
	}
	return []command{body(domain.CmdDeposit, "", `"account_id":%q,"amount":%d,"currency":"EUR"`, acc, amount*3)}
}

// holdUnit places a hold and captures it (in part, or into other) or releases it.
func (h *history) holdUnit(kind int, key, acc, other string, amount int64, body func(domain.CommandType, string, string, ...any) command) []command {
	place := body(domain.CmdPlaceHold, "", `"account_id":%q,"hold_id":%q,"amount":%d,"currency":"EUR"`, acc, key, amount)
	switch kind {
	case unitHoldCapture:
		return []command{place, body(domain.CmdCaptureHold, "-capture", `"account_id":%q,"hold_id":%q,"amount":%d`, acc, key, amount/2+1)}
	case unitHoldCaptureTo:
		return []command{place, body(domain.CmdCaptureHold, "-capture", `"account_id":%q,"hold_id":%q,"to":%q`, acc, key, other)}
	}
	return []command{place, body(domain.CmdReleaseHold, "-release", `"account_id":%q,"hold_id":%q`, acc, key)}
}
