package query

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/internal/adapters/httpapi"
)

// SubjectPrefix + query name is a query's subject.
const SubjectPrefix = "ledger.v1.query."

// DefaultQueueGroup shares the queries among the read side's instances.
const DefaultQueueGroup = "ledger-query"

// NATSOptions configure Subscribe.
type NATSOptions struct {
	// Queries to answer (default: all of Queries). Leave out "command" where the
	// ledger's own intake answers it from the event store.
	Queries    []string
	QueueGroup string // default DefaultQueueGroup
	// MaxInFlight bounds the queries answered at once (default 256): a query may
	// wait for its min_position, so each runs in its own goroutine.
	MaxInFlight int
	// Timeout bounds one answer (default: the Service's MaxWait + 5s).
	Timeout time.Duration
}

// Responder answers queries over NATS until Stop.
type Responder struct {
	subs   []*nats.Subscription
	sem    chan struct{}
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// Subscribe answers ledger.v1.query.<name> requests on nc.
func (s *Service) Subscribe(nc *nats.Conn, o NATSOptions) (*Responder, error) {
	if len(o.Queries) == 0 {
		o.Queries = Queries
	}
	if o.QueueGroup == "" {
		o.QueueGroup = DefaultQueueGroup
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.Timeout <= 0 {
		o.Timeout = s.opts.MaxWait + 5*time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Responder{sem: make(chan struct{}, o.MaxInFlight), ctx: ctx, cancel: cancel}
	for _, q := range o.Queries {
		sub, err := nc.QueueSubscribe(SubjectPrefix+q, o.QueueGroup, func(msg *nats.Msg) {
			if msg.Reply == "" {
				return
			}
			select {
			case r.sem <- struct{}{}:
			case <-r.ctx.Done():
				return
			}
			r.wg.Add(1)
			go func() {
				defer func() { <-r.sem; r.wg.Done() }()
				actx, cancel := context.WithTimeout(r.ctx, o.Timeout)
				defer cancel()
				reply, qerr := s.Answer(actx, q, msg.Data)
				var b []byte
				var err error
				if qerr != nil {
					b, err = json.Marshal(qerr)
				} else {
					b, err = json.Marshal(reply)
				}
				if err != nil {
					s.log.Error("query: encode reply", "query", q, "err", err)
					return
				}
				if err := msg.Respond(b); err != nil {
					s.log.Warn("query: reply", "query", q, "err", err)
				}
			}()
		})
		if err != nil {
			r.Stop()
			return nil, fmt.Errorf("query: subscribe %s: %w", SubjectPrefix+q, err)
		}
		r.subs = append(r.subs, sub)
	}
	return r, nil
}

// Stop unsubscribes, cancels the queries in flight and waits for them.
func (r *Responder) Stop() {
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
	r.cancel()
	r.wg.Wait()
}

// Router is where Routes registers its handlers (an *http.ServeMux, or the
// ledger's HTTP server).
type Router interface {
	Handle(pattern string, h http.Handler)
}

// Routes registers the HTTP queries:
//
//	GET /v1/accounts/{id}                ?min_position=c/p
//	GET /v1/accounts/{id}/entries        ?after_revision=N&limit=N&from=T&to=T&min_position=c/p
//	GET /v1/accounts/{id}/balance        ?at=T&revision=N&min_position=c/p
//	GET /v1/transfers/{id}               ?min_position=c/p
//	GET /v1/commands/{key}               ?min_position=c/p
//
// Replies are the NATS replies; errors are answered 400 (invalid_request), 404
// (not_found), 503 with Retry-After (projection_behind) or 500.
func (s *Service) Routes(r Router) {
	r.Handle("GET /v1/accounts/{id}", s.handle(QueryAccount, func(req *http.Request) (any, *Error) {
		return s.Account(req.Context(), AccountRequest{AccountID: req.PathValue("id"), MinPosition: req.URL.Query().Get("min_position")})
	}))
	r.Handle("GET /v1/accounts/{id}/entries", s.handle(QueryEntries, func(req *http.Request) (any, *Error) {
		q := EntriesRequest{AccountID: req.PathValue("id"), MinPosition: req.URL.Query().Get("min_position"),
			From: req.URL.Query().Get("from"), To: req.URL.Query().Get("to")}
		if v := req.URL.Query().Get("after_revision"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, invalid("after_revision", "%q is not an integer", v)
			}
			q.AfterRevision = &n
		}
		if v := req.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, invalid("limit", "%q is not an integer", v)
			}
			q.Limit = &n
		}
		return s.Entries(req.Context(), q)
	}))
	r.Handle("GET /v1/accounts/{id}/balance", s.handle(QueryBalance, func(req *http.Request) (any, *Error) {
		q := BalanceRequest{AccountID: req.PathValue("id"), At: req.URL.Query().Get("at"), MinPosition: req.URL.Query().Get("min_position")}
		if v := req.URL.Query().Get("revision"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, invalid("revision", "%q is not an integer", v)
			}
			q.Revision = &n
		}
		return s.Balance(req.Context(), q)
	}))
	r.Handle("GET /v1/transfers/{id}", s.handle(QueryTransfer, func(req *http.Request) (any, *Error) {
		return s.Transfer(req.Context(), TransferRequest{TransferID: req.PathValue("id"), MinPosition: req.URL.Query().Get("min_position")})
	}))
	r.Handle("GET /v1/commands/{key...}", s.handle(QueryCommand, func(req *http.Request) (any, *Error) {
		return s.Command(req.Context(), CommandRequest{IdempotencyKey: req.PathValue("key"), MinPosition: req.URL.Query().Get("min_position")})
	}))
}

func (s *Service) handle(query string, answer func(*http.Request) (any, *Error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		reply, qerr := answer(req)
		code, status := "ok", http.StatusOK
		var body any = reply
		if qerr != nil {
			code, body, status = string(qerr.Code), qerr, httpapi.StatusOf(qerr.Code)
			if qerr.Code == CodeProjectionBehind {
				w.Header().Set("Retry-After", "1")
			}
		}
		s.opts.Metrics.observe(query, code, time.Since(start))
		httpapi.WriteJSON(w, status, body)
	})
}

// Metrics are the query side's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	queries *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

// NewMetrics registers the query metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_read_queries_total", Help: "Read-model queries answered, by query and code.",
		}, []string{"query", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ledger_read_query_seconds", Help: "Time to answer a read-model query (min_position waits included).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
		}, []string{"query"}),
	}
	reg.MustRegister(m.queries, m.seconds)
	return m
}

func (m *Metrics) observe(query, code string, d time.Duration) {
	if m == nil {
		return
	}
	m.queries.WithLabelValues(query, code).Inc()
	m.seconds.WithLabelValues(query).Observe(d.Seconds())
}
