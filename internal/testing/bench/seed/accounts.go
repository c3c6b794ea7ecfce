package seed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/ledger"
)

// Opening many accounts: batches of OpenBatch open_account commands
// (ledger.v1.cmd.batch, not atomic), openers of them at once.
const (
	OpenBatch = domain.MaxBatchCommands
	openers   = 4
)

// OpenOptions shape OpenAccounts.
type OpenOptions struct {
	// Body is the open_account body of account i (required).
	Body func(i int) []byte
	// Progress, when set, is called every second with the accounts opened so far.
	Progress func(opened, total int)
	// Logger receives what the seeding ledger.Service logs.
	Logger *slog.Logger
	// Chunk is the accounts one bulk load carries (default loadChunk; at
	// most loadChunk).
	Chunk int
}

// OpenAccounts opens n accounts in dst through batches decided by a
// ledger.Service of its own (so that a ledger serving dst has none of them
// cached, as a ledger restarted over them would): every command must be
// answered applied (a duplicate is fine: a data dir reused). A dst that loads
// in bulk (Loader: PostgreSQL) gets the events those batches decided on a
// memory store, loadChunk accounts a load; another gets the batches
// themselves.
func OpenAccounts(ctx context.Context, dst ledger.Store, n int, o OpenOptions) error {
	if o.Body == nil {
		return errors.New("seed: OpenAccounts needs the accounts' bodies")
	}
	unit, open, done := opener(ctx, dst, o)
	defer done()
	var next, opened atomic.Int64
	if o.Progress != nil {
		stop := everySecond(func() { o.Progress(int(opened.Load()), n) })
		defer stop()
	}
	errs := make(chan error, openers)
	var wg sync.WaitGroup
	for range openers {
		wg.Go(func() {
			for ctx.Err() == nil {
				from := int(next.Add(int64(unit))) - unit
				if from >= n {
					return
				}
				if err := open(from, min(from+unit, n)); err != nil {
					errs <- err
					return
				}
				opened.Add(int64(min(from+unit, n) - from))
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// opener is how OpenAccounts opens accounts [from, to) in dst, unit of them
// at a time: loaded when dst loads in bulk, else batches on dst.
func opener(ctx context.Context, dst ledger.Store, o OpenOptions) (unit int, open func(from, to int) error, done func()) {
	if l, ok := dst.(Loader); ok {
		chunk := loadChunk
		if o.Chunk > 0 {
			chunk = min(o.Chunk, loadChunk)
		}
		return chunk, func(from, to int) error { return loadOpened(ctx, l, o, from, to) }, func() {}
	}
	svc := ledger.New(dst, ledger.Options{Producer: "bench-open", CacheSize: OpenBatch * openers, Logger: o.Logger})
	return OpenBatch, func(from, to int) error { return openRange(ctx, svc, o.Body, from, to) }, svc.Close
}

// openRange opens accounts [from, to) in one batch.
func openRange(ctx context.Context, svc *ledger.Service, body func(int) []byte, from, to int) error {
	b := make([]byte, 0, 160*(to-from)+16)
	b = append(b, `{"commands":[`...)
	for i := from; i < to; i++ {
		if i > from {
			b = append(b, ',')
		}
		el := body(i)
		if len(el) < 2 || el[0] != '{' {
			return fmt.Errorf("seed: account %d: the body is not a JSON object", i)
		}
		b = append(b, `{"type":"open_account",`...)
		b = append(b, el[1:]...)
	}
	b = append(b, "]}"...)
	r := svc.HandleBatch(ctx, b, 0)
	if r.Status != domain.StatusApplied || len(r.Replies) != to-from {
		return fmt.Errorf("seed: open accounts %d-%d: %s %s: %s (%d replies)", from, to-1, r.Status, r.Code, r.Message, len(r.Replies))
	}
	for i, e := range r.Replies {
		if e.Status != domain.StatusApplied {
			return fmt.Errorf("seed: open account %d: %s %s: %s", from+i, e.Status, e.Code, e.Message)
		}
	}
	return nil
}
