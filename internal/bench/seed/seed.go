// Package seed writes long account streams fast and faithfully: the commands are
// decided by the real command handler (internal/ledger) over an in-memory store,
// and the events it wrote, byte for byte (IDs, data, metadata with request hash
// and chain), are then copied to the target store in bulk appends of many events.
package seed

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/ledger"
)

// Target is what the copy needs of the destination store.
type Target interface {
	eventstore.Appender
	eventstore.MultiAppender
}

// Limits of one bulk append.
const (
	// EventsPerAppend bounds the events of one stream written by one Append call.
	EventsPerAppend = 5000
	// StreamsPerAppend bounds the one-event streams (key claims) written by one
	// AppendMulti call.
	StreamsPerAppend = 1000
)

// Stream describes a seeded account stream.
type Stream struct {
	AccountID string
	Stream    string
	Events    int      // events in the account stream
	Keys      []string // the client keys decided on it, oldest first (open_account first)
	Bodies    [][]byte // the request body of each key, for resending as a duplicate
	Currency  string
	// Claims is the number of key-claim streams written alongside.
	Claims int
}

// Options shape Account.
type Options struct {
	// KeyPrefix makes keys unique (default "seed-<account>").
	KeyPrefix string
	Currency  string // default EUR
	// Progress, when set, is called now and then with the events copied so far.
	Progress func(copied, total int)
}

// Account writes an account stream of n events (open_account, then n-1 deposits,
// each its own client command with its own key) to dst. It returns the stream's
// keys and bodies. The account must not exist in dst.
func Account(ctx context.Context, dst Target, accountID string, n int, o Options) (*Stream, error) {
	if n < 1 {
		return nil, errors.New("seed: a stream needs at least one event")
	}
	if o.Currency == "" {
		o.Currency = "EUR"
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "seed-" + accountID
	}
	mem := memory.New()
	defer mem.Close()
	// The same handler as production; group commit is pointless on one stream.
	svc := ledger.New(mem, ledger.Options{DisableGroupCommit: true, CacheSize: 16, Producer: "bench-seed"})
	defer svc.Close()

	st := &Stream{AccountID: accountID, Stream: domain.AccountStream(accountID), Currency: o.Currency}
	send := func(typ domain.CommandType, key string, body []byte) error {
		r := svc.HandleRaw(ctx, string(typ), body)
		if r.Status != domain.StatusApplied {
			return fmt.Errorf("seed: %s %s: %s %s: %s", typ, key, r.Status, r.Code, r.Message)
		}
		st.Keys = append(st.Keys, key)
		st.Bodies = append(st.Bodies, body)
		return nil
	}
	openKey := o.KeyPrefix + "-open"
	if err := send(domain.CmdOpenAccount, openKey, fmt.Appendf(nil, `{"idempotency_key":%q,"account_id":%q,"currency":%q}`, openKey, accountID, o.Currency)); err != nil {
		return nil, err
	}
	for i := 1; i < n; i++ {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		key := o.KeyPrefix + "-" + strconv.Itoa(i)
		body := fmt.Appendf(nil, `{"idempotency_key":%q,"account_id":%q,"amount":%d,"currency":%q}`, key, accountID, 1+i%1000, o.Currency)
		if err := send(domain.CmdDeposit, key, body); err != nil {
			return nil, err
		}
	}
	claims, err := Copy(ctx, mem, dst, o.Progress)
	if err != nil {
		return nil, err
	}
	st.Events = n
	st.Claims = claims
	return st, nil
}

// Copy writes every event of src to dst, stream by stream in their order, in bulk:
// streams with many events in appends of EventsPerAppend, single-event streams
// (key claims) StreamsPerAppend to an AppendMulti. Streams must not exist in dst.
// It returns the number of single-event streams.
func Copy(ctx context.Context, src eventstore.AllReader, dst Target, progress func(copied, total int)) (singles int, err error) {
	type streamEvents struct {
		name   string
		events []eventstore.EventData
	}
	var order []string
	byStream := map[string]*streamEvents{}
	total := 0
	after := eventstore.Start
	for {
		recs, err := src.ReadAll(ctx, after, 10_000)
		if err != nil {
			return 0, err
		}
		for _, r := range recs {
			s := byStream[r.Stream]
			if s == nil {
				s = &streamEvents{name: r.Stream}
				byStream[r.Stream] = s
				order = append(order, r.Stream)
			}
			s.events = append(s.events, eventstore.EventData{ID: r.ID, Type: r.Type, Data: r.Data, Metadata: r.Metadata})
			total++
		}
		if len(recs) < 10_000 {
			break
		}
		after = recs[len(recs)-1].Position
	}
	copied := 0
	report := func() {
		if progress != nil {
			progress(copied, total)
		}
	}
	var pending []eventstore.StreamAppend
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		if _, err := dst.AppendMulti(ctx, pending); err != nil {
			return fmt.Errorf("seed: append %d streams: %w", len(pending), err)
		}
		copied += len(pending)
		pending = pending[:0]
		report()
		return nil
	}
	for _, name := range order {
		s := byStream[name]
		if len(s.events) == 1 {
			singles++
			pending = append(pending, eventstore.StreamAppend{Stream: name, Expected: eventstore.NoStream, Events: s.events})
			if len(pending) == StreamsPerAppend {
				if err := flush(); err != nil {
					return 0, err
				}
			}
			continue
		}
		last := int64(-1)
		for start := 0; start < len(s.events); start += EventsPerAppend {
			end := min(start+EventsPerAppend, len(s.events))
			res, err := dst.Append(ctx, name, eventstore.ExactOrNoStream(last), s.events[start:end])
			if err != nil {
				return 0, fmt.Errorf("seed: append %s at %d: %w", name, last+1, err)
			}
			last = int64(res.LastRevision)
			copied += end - start
			report()
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}
	return singles, nil
}

// Timed runs f and returns how long it took.
func Timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}
