package natsapi

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// The read side's queries over NATS (PROTOCOL.md §4): ledger.v1.query.<name>,
// answered by a query.Service from the read models.

// ReadQueryOptions configure ServeReadQueries.
type ReadQueryOptions struct {
	// Queries to answer (default: all of query.Queries). Leave out "command"
	// where the ledger's own intake answers it from the event store.
	Queries    []string
	QueueGroup string // default DefaultQueryQueueGroup
	// MaxInFlight bounds the queries answered at once (default 256): a query may
	// wait for its min_position, so each runs in its own goroutine.
	MaxInFlight int
	// Timeout bounds one answer (default: the Service's MaxWait + 5s).
	Timeout time.Duration
	Logger  *slog.Logger
}

// ReadQueryResponder answers read-model queries over NATS until Stop.
type ReadQueryResponder struct {
	svc    *query.Service
	subs   []*nats.Subscription
	wg     sync.WaitGroup
	run    queryRunner
	cancel context.CancelFunc
}

// ServeReadQueries answers ledger.v1.query.<name> requests on nc with svc.
func ServeReadQueries(nc *nats.Conn, svc *query.Service, o ReadQueryOptions) (*ReadQueryResponder, error) {
	if len(o.Queries) == 0 {
		o.Queries = query.Queries
	}
	if o.QueueGroup == "" {
		o.QueueGroup = DefaultQueryQueueGroup
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.Timeout <= 0 {
		o.Timeout = svc.MaxWait() + 5*time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	work, cancel := context.WithCancel(context.Background())
	r := &ReadQueryResponder{svc: svc, cancel: cancel}
	r.run = queryRunner{work: work, sem: make(chan struct{}, o.MaxInFlight), wg: &r.wg, timeout: o.Timeout, log: o.Logger}
	for _, q := range o.Queries {
		sub, err := nc.QueueSubscribe(QuerySubjectPrefix+q, o.QueueGroup, func(msg *nats.Msg) {
			r.run.respond(msg, func(ctx context.Context) any { return r.answer(ctx, q, msg.Data) })
		})
		if err != nil {
			r.Stop()
			return nil, fmt.Errorf("natsapi: subscribe %s: %w", QuerySubjectPrefix+q, err)
		}
		r.subs = append(r.subs, sub)
	}
	return r, nil
}

// answer answers one query body, recorded in the service's metrics: the
// reply, or the error.
func (r *ReadQueryResponder) answer(ctx context.Context, q string, body []byte) any {
	out, qerr := r.svc.Observe(q, func() (any, *reply.QueryError) { return answerReadQuery(ctx, r.svc, q, body) })
	if qerr != nil {
		return qerr
	}
	return out
}

// Stop unsubscribes, cancels the queries in flight and waits for them.
func (r *ReadQueryResponder) Stop() {
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
	r.cancel()
	r.wg.Wait()
}

// answerReadQuery decodes a query body strictly and answers it.
func answerReadQuery(ctx context.Context, svc *query.Service, name string, body []byte) (any, *reply.QueryError) {
	switch name {
	case query.QueryAccount:
		return answerDecoded(ctx, body, svc.Account)
	case query.QueryEntries:
		return answerDecoded(ctx, body, svc.Entries)
	case query.QueryTransfer:
		return answerDecoded(ctx, body, svc.Transfer)
	case query.QueryCommand:
		return answerDecoded(ctx, body, svc.Command)
	case query.QueryBalance:
		return answerDecoded(ctx, body, svc.Balance)
	case query.QueryBalances:
		return answerDecoded(ctx, body, svc.Balances)
	}
	return nil, reply.InvalidQuery("", "unknown query %q", name)
}

// answerDecoded decodes body into a Q and answers it.
func answerDecoded[Q, R any](ctx context.Context, body []byte, answer func(context.Context, Q) (R, *reply.QueryError)) (any, *reply.QueryError) {
	var q Q
	if qerr := decodeQuery(body, &q); qerr != nil {
		return nil, qerr
	}
	return answer(ctx, q)
}
