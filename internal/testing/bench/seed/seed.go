// Package seed writes long account streams and histories faithfully and in
// bounded memory: every command is decided by the real command handler
// (internal/app/ledger), many at once, and snapshots are taken as production
// takes them. Account appends through the handler on the target store, so
// that its commands pipeline and group-commit as a hot account's do in
// production. OpenAccounts and History, on PostgreSQL (a store that loads in
// bulk, Loader), have the handler decide over an in-memory recorder and load
// the decided events by COPY (History in chunks, keeping only the accounts'
// state between them); on another store (KurrentDB) the handler appends to
// the store itself. Nothing is held beyond a chunk: keys and request bodies
// are a function of their index.
package seed

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/ledger"
)

// Workers is the number of commands in flight at once while seeding.
const Workers = 64

// Stream describes a seeded account stream: command 0 opens the account, command
// i > 0 deposits 1+i%1000 under its own key.
type Stream struct {
	AccountID string
	Stream    string
	Events    int // events in the account stream (one per command)
	Currency  string
	// Claims is the number of key-claim streams written alongside.
	Claims    int
	keyPrefix string
}

// Key is the client key of command i.
func (st *Stream) Key(i int) string {
	if i == 0 {
		return st.keyPrefix + "-open"
	}
	return st.keyPrefix + "-" + strconv.Itoa(i)
}

// Body is the request body of command i, as a client sends it.
func (st *Stream) Body(i int) []byte {
	if i == 0 {
		return fmt.Appendf(nil, `{"idempotency_key":%q,"account_id":%q,"currency":%q}`, st.Key(0), st.AccountID, st.Currency)
	}
	return fmt.Appendf(nil, `{"idempotency_key":%q,"account_id":%q,"amount":%d,"currency":%q}`, st.Key(i), st.AccountID, 1+i%1000, st.Currency)
}

// Type is the type of command i.
func (st *Stream) Type(i int) domain.CommandType {
	if i == 0 {
		return domain.CmdOpenAccount
	}
	return domain.CmdDeposit
}

// Command is command i, decoded.
func (st *Stream) Command(i int) (domain.Command, error) {
	cmd, ierr := domain.DecodeCommand(st.Type(i), st.Body(i))
	if ierr != nil {
		return domain.Command{}, ierr
	}
	return cmd, nil
}

// Spread is n of the stream's commands spread over its whole length, from the
// first (the oldest keys); Latest the last n (the keys an aggregate remembers).
func (st *Stream) Spread(n int) ([]domain.Command, error) {
	step := max(1, st.Events/n)
	var out []domain.Command
	for i := 0; i < st.Events && len(out) < n; i += step {
		cmd, err := st.Command(i)
		if err != nil {
			return nil, err
		}
		out = append(out, cmd)
	}
	return out, nil
}

// Between is up to n commands spread over the stream's first end ones, each
// halfway between two of an even spread. With end the whole stream (Events)
// they lie between Spread(n)'s: keys Spread does not return (on a stream long
// enough). With end = Events - k they are keys older than the latest k: keys an
// aggregate that remembers k keys has forgotten.
func (st *Stream) Between(n, end int) ([]domain.Command, error) {
	end = min(end, st.Events)
	step := max(1, end/n)
	var out []domain.Command
	for i := step / 2; i < end && len(out) < n; i += step {
		cmd, err := st.Command(i)
		if err != nil {
			return nil, err
		}
		out = append(out, cmd)
	}
	return out, nil
}

// Latest: see Spread.
func (st *Stream) Latest(n int) ([]domain.Command, error) {
	var out []domain.Command
	for i := max(0, st.Events-n); i < st.Events; i++ {
		cmd, err := st.Command(i)
		if err != nil {
			return nil, err
		}
		out = append(out, cmd)
	}
	return out, nil
}

// Options shape Account.
type Options struct {
	// KeyPrefix makes keys unique (default "seed-<account>").
	KeyPrefix string
	Currency  string // default EUR
	// Progress, when set, is called now and then with the commands done so far.
	Progress func(done, total int)
}

// Account writes an account stream of n events (open_account, then n-1 deposits,
// each its own client command with its own key) to dst, through the command
// handler. The account must not exist in dst.
func Account(ctx context.Context, dst ledger.Store, accountID string, n int, o Options) (*Stream, error) {
	if n < 1 {
		return nil, errors.New("seed: a stream needs at least one event")
	}
	if o.Currency == "" {
		o.Currency = "EUR"
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "seed-" + accountID
	}
	st := &Stream{AccountID: accountID, Stream: domain.AccountStream(accountID), Currency: o.Currency, Events: n, Claims: n, keyPrefix: o.KeyPrefix}
	svc := ledger.New(dst, ledger.Options{Producer: "bench-seed"})
	defer svc.Close()
	send := func(i int) error {
		r := svc.HandleRaw(ctx, string(st.Type(i)), st.Body(i))
		if r.Status != domain.StatusApplied || r.Duplicate {
			return fmt.Errorf("seed: command %d (%s): %s %s duplicate=%v: %s", i, st.Key(i), r.Status, r.Code, r.Duplicate, r.Message)
		}
		return nil
	}
	if err := send(0); err != nil {
		return nil, err
	}
	var (
		next, done atomic.Int64
		wg         sync.WaitGroup
		mu         sync.Mutex
		firstErr   error
	)
	next.Store(1)
	done.Store(1)
	stop := func() {}
	if o.Progress != nil {
		stop = everySecond(func() { o.Progress(int(done.Load()), n) })
	}
	for range Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := send(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					next.Store(int64(n)) // the others stop too
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	stop()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return st, nil
}

// everySecond calls f every second until the returned function is called.
func everySecond(f func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				f()
			}
		}
	}()
	return func() { close(done) }
}

// Timed runs f and returns how long it took.
func Timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}
