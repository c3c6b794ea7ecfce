package seed

import (
	"cmp"
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
	// KeyPrefix makes keys and IDs unique (default defaultHistoryPrefix).
	KeyPrefix string
	// Progress, when set, is called now and then with the events written so far.
	Progress func(events, total int64)
	// Chunk is the events one bulk load carries, on a store that loads in
	// bulk (default historyChunk; at most maxHistoryChunk).
	Chunk int
	// SnapshotEvery is the seeding ledger's ledger.Options.SnapshotEvery (0:
	// the ledger's default): the history has the snapshots a ledger so
	// configured takes.
	SnapshotEvery int
	// Loaded, when set, is called after each bulk load with the events loaded
	// so far, while the seeder's state is live (a test reads the heap there).
	Loaded func(events int64)
}

// The events one bulk load of a history carries: the default, and the most,
// which leaves room within eventstore/postgres.MaxLoadEvents for the units in
// flight when a chunk fills (Workers of them, a dozen events at most each).
const (
	historyChunk    = 50_000
	maxHistoryChunk = 90_000
)

// historyRecent is the key records, closed holds and refunded originals a
// seeding ledger's aggregates keep (ledger.Options.RecentKeys, RecentHolds,
// RecentRefunds): what they remember is never written, the seeder sends no
// key twice and a unit's capture or refund shares its chunk with its hold or
// original (found there by ID or subject when forgotten), so one each keeps
// an account's state from growing with its history.
const historyRecent = 1

// defaultHistoryPrefix is HistoryOptions.KeyPrefix's default.
const defaultHistoryPrefix = "h"

// HistoryResult describes a seeded history.
type HistoryResult struct {
	Events   int64 // events written, key claims included
	Commands int64 // client commands sent (each decided once)
	Rejected int64 // of them refused and recorded (insufficient funds, ...)
	// Snapshots is, on a store that loads in bulk, the snapshots the seeding
	// service took (each loaded after its chunk; the store keeps a stream's
	// latest); 0 on another store, which the service writes them to itself.
	Snapshots int64
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
// accounts to dst, decided by the command handler as clients' commands would
// be: the accounts are opened, then units of a realistic mix (deposits,
// withdrawals, transfers, transactions of two postings, holds captured,
// captured into another account or released, deposits refunded in part) run
// on random-looking accounts, many at once. Rejections (insufficient funds)
// are recorded as in production, snapshots taken as the ledger takes them.
// A dst that loads in bulk (Loader: PostgreSQL) gets the events in chunks of
// o.Chunk, decided by a ledger.Service over a recorder that keeps the
// accounts' state between chunks, each chunk loaded in the order it was
// decided; another gets the commands themselves. The accounts must not exist
// in dst.
func History(ctx context.Context, dst ledger.Store, n int64, o HistoryOptions) (HistoryResult, error) {
	if o.Accounts < 2 {
		return HistoryResult{}, errors.New("seed: a history needs at least 2 accounts")
	}
	o.KeyPrefix = cmp.Or(o.KeyPrefix, defaultHistoryPrefix)
	o.Chunk = min(cmp.Or(o.Chunk, historyChunk), maxHistoryChunk)
	h := &history{o: o, total: n}
	target := dst
	if l, ok := dst.(Loader); ok {
		h.rec, h.dst = newRecorder(), l
		target = h.rec
		defer h.rec.close()
	}
	h.svc = ledger.New(target, h.serviceOptions())
	stop := h.reportProgress()
	defer stop()
	err := h.run(ctx, int64(o.Accounts), func(i int64) []command { return []command{h.open(i)} })
	if err == nil {
		err = h.run(ctx, -1, h.unit)
	}
	h.svc.Close() // its snapshots taken
	if err == nil && h.rec != nil {
		err = h.flush(ctx)
	}
	err = errors.Join(err, h.loaded())
	return h.result(), err
}

// serviceOptions are the seeding ledger's: the ledger's defaults, but that
// over a recorder it keeps every account cached (the recorder holds none of
// their events once loaded) with one key record, closed hold and refunded
// original each (historyRecent).
func (h *history) serviceOptions() ledger.Options {
	o := ledger.Options{Producer: "bench-history", SnapshotEvery: h.o.SnapshotEvery}
	if h.rec != nil {
		o.CacheSize, o.CacheBytes = h.o.Accounts+OpenBatch, -1
		o.RecentKeys, o.RecentHolds, o.RecentRefunds = historyRecent, historyRecent, historyRecent
	}
	return o
}

type history struct {
	svc                        *ledger.Service
	o                          HistoryOptions
	total                      int64
	events, commands, rejected atomic.Int64
	// rec and dst, on a store that loads in bulk: the recorder the service
	// decides on, and the store its chunks are loaded into.
	rec *recorder
	dst Loader
	// loading is the load of the last chunk cut, under way while the next
	// is decided (nil: none); loadedEvents the events of those done.
	loading      chan error
	loadedEvents int64
}

func (h *history) result() HistoryResult {
	r := HistoryResult{Events: h.events.Load(), Commands: h.commands.Load(), Rejected: h.rejected.Load()}
	if h.rec != nil {
		r.Events, r.Snapshots = h.loadedEvents, h.rec.snapshotsTaken()
	}
	return r
}

// written is the events written so far: those the recorder took, or counted
// from the replies.
func (h *history) written() int64 {
	if h.rec != nil {
		return h.rec.taken()
	}
	return h.events.Load()
}

// full reports whether the recorder's chunk is due to be loaded.
func (h *history) full() bool {
	return h.rec != nil && h.rec.chunkEvents() >= h.o.Chunk
}

// flush cuts the recorder's chunk and starts its load once the chunk before
// it is loaded: a chunk's load is under way while the next one is decided,
// and the chunks are loaded one after another, in order (their positions
// increase).
func (h *history) flush(ctx context.Context) error {
	c := h.rec.cut()
	if err := h.loaded(); err != nil {
		return err
	}
	h.loading = make(chan error, 1)
	go func(done chan<- error) {
		if err := c.load(ctx, h.dst); err != nil {
			done <- fmt.Errorf("seed: loading a chunk of the history: %w", err)
			return
		}
		h.loadedEvents += int64(c.events) // read once done is closed (loaded)
		close(done)
	}(h.loading)
	return nil
}

// loaded waits for the chunk under load, if any, and reports it (Loaded).
func (h *history) loaded() error {
	if h.loading == nil {
		return nil
	}
	err := <-h.loading
	h.loading = nil
	if err == nil && h.o.Loaded != nil {
		h.o.Loaded(h.loadedEvents)
	}
	return err
}

func (h *history) reportProgress() (stop func()) {
	if h.o.Progress == nil {
		return func() {}
	}
	return everySecond(func() { h.o.Progress(h.written(), h.total) })
}

// run sends units 0..units-1 (units < 0: until the history has its events) on
// Workers workers, in rounds: a round ends once the recorder's chunk is full
// (no unit in flight, so that a unit's commands share a chunk), and the chunk
// is loaded. It returns the first failure.
func (h *history) run(ctx context.Context, units int64, unit func(i int64) []command) error {
	var next atomic.Int64
	for {
		if err := h.round(ctx, &next, units, unit); err != nil {
			return err
		}
		if !h.full() {
			return ctx.Err()
		}
		if err := h.flush(ctx); err != nil {
			return err
		}
	}
}

// round sends units from next on until they run out or the chunk is full.
func (h *history) round(ctx context.Context, next *atomic.Int64, units int64, unit func(i int64) []command) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		failed   atomic.Bool
	)
	more := func(i int64) bool {
		if units >= 0 {
			return i < units
		}
		return h.written() < h.total
	}
	for range Workers {
		wg.Go(func() {
			for ctx.Err() == nil && !failed.Load() && !h.full() {
				i := next.Add(1) - 1
				if !more(i) {
					return
				}
				if err := h.send(ctx, unit(i)); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					failed.Store(true) // the others stop too
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

func (h *history) account(i int64) string { return HistoryAccount(h.o.KeyPrefix, i) }

// HistoryAccount is the ID of account i of a history seeded with KeyPrefix
// prefix (History opens accounts 0 to Accounts-1).
func HistoryAccount(prefix string, i int64) string {
	return cmp.Or(prefix, defaultHistoryPrefix) + "-acc-" + strconv.FormatInt(i, 10)
}

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
