package natsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/adapters/httpapi"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// CommandQuery is the body of ledger.v1.query.command.
type CommandQuery struct {
	IdempotencyKey string `json:"idempotency_key"`
	// MinPosition is accepted for symmetry with the other queries; the outcome of a
	// command is read from the event store, which is never behind.
	MinPosition string `json:"min_position,omitempty"`
}

// decodeQuery decodes a query body strictly into q.
func decodeQuery(body []byte, q any) *reply.QueryError {
	if len(body) > domain.MaxBodyBytes {
		return reply.InvalidQuery("", "body is %d bytes, over the limit of %d", len(body), domain.MaxBodyBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(q); err != nil {
		return reply.InvalidQuery("", "body: %v", err)
	}
	if dec.More() {
		return reply.InvalidQuery("", "body: trailing data after the JSON object")
	}
	return nil
}

// AnswerCommandQuery answers a ledger.v1.query.command body: the original reply of
// the command (PROTOCOL.md §3, duplicate false), code not_found for a key never
// decided, invalid_request for a malformed body, internal_error when the lookup
// fails (retry).
func AnswerCommandQuery(ctx context.Context, l CommandLookup, body []byte) any {
	var q CommandQuery
	if qerr := decodeQuery(body, &q); qerr != nil {
		return *qerr
	}
	if !domain.ValidKey(q.IdempotencyKey) {
		return *reply.InvalidQuery("idempotency_key", "must be 1-%d printable ASCII characters", domain.MaxKeyLen)
	}
	r, err := l.Lookup(ctx, q.IdempotencyKey)
	if err != nil {
		return reply.QueryError{Status: domain.StatusError, Code: domain.CodeInternalError, IdempotencyKey: q.IdempotencyKey, Message: "lookup failed, retry: " + err.Error()}
	}
	if r == nil {
		return reply.QueryError{Code: domain.CodeNotFound, IdempotencyKey: q.IdempotencyKey, Message: "no command was decided with this idempotency key"}
	}
	return *r
}

// TransactionQuery is the body of ledger.v1.query.transaction.
type TransactionQuery struct {
	TransactionID string `json:"transaction_id"`
	// MinPosition is accepted for symmetry with the other queries; a transaction
	// is read from the event store, which is never behind.
	MinPosition string `json:"min_position,omitempty"`
}

// AnswerTransactionQuery answers a ledger.v1.query.transaction body: the
// transaction as its stream records it (reply.TransactionDetail), not_found for
// an ID never posted, invalid_request for a malformed body, internal_error when
// the read fails (retry).
func AnswerTransactionQuery(ctx context.Context, l TransactionLookup, body []byte) any {
	var q TransactionQuery
	if qerr := decodeQuery(body, &q); qerr != nil {
		return *qerr
	}
	if !domain.ValidTransactionName(q.TransactionID) {
		return *reply.InvalidQuery("transaction_id", "must be 1-%d characters of [A-Za-z0-9._:-], or a refund's <id>~refund~<n>", domain.MaxIDLen)
	}
	d, err := l.LookupTransaction(ctx, q.TransactionID)
	if err != nil {
		return reply.QueryError{Status: domain.StatusError, Code: domain.CodeInternalError, Message: "lookup failed, retry: " + err.Error()}
	}
	if d == nil {
		return reply.QueryError{Code: domain.CodeNotFound, Message: fmt.Sprintf("no transaction %s", q.TransactionID)}
	}
	return *d
}

// onQuery answers one query message with answer, bounded like the others.
func (in *Intake) onQuery(msg *nats.Msg, subject string, answer func(context.Context, []byte) any) {
	qr := queryRunner{work: in.work, sem: in.qsem, wg: &in.wg, timeout: in.opts.CommandTimeout, log: in.log}
	qr.respond(msg, func(ctx context.Context) any {
		ans := answer(ctx, msg.Data)
		code := "ok"
		if a, ok := ans.(reply.QueryError); ok {
			code = string(a.Code)
		}
		in.opts.Metrics.query(strings.TrimPrefix(subject, QuerySubjectPrefix), code)
		return ans
	})
}

// queryRunner answers query messages, each in a goroutine of its own, at most
// cap(sem) at once, each within timeout, until work ends.
type queryRunner struct {
	work    context.Context
	sem     chan struct{}
	wg      *sync.WaitGroup
	timeout time.Duration
	log     *slog.Logger
}

// respond answers msg with the JSON of what answer returns, once a slot is
// free (nothing when work ends first, or msg wants no reply).
func (qr queryRunner) respond(msg *nats.Msg, answer func(context.Context) any) {
	if msg.Reply == "" {
		return
	}
	select {
	case qr.sem <- struct{}{}:
	case <-qr.work.Done():
		return
	}
	qr.wg.Add(1)
	go func() {
		defer func() { <-qr.sem; qr.wg.Done() }()
		ctx, cancel := context.WithTimeout(qr.work, qr.timeout)
		defer cancel()
		b, err := json.Marshal(answer(ctx))
		if err != nil {
			qr.log.Error("encode query reply", "subject", msg.Subject, "err", err)
			return
		}
		if err := msg.Respond(b); err != nil {
			qr.log.Warn("query reply", "subject", msg.Subject, "err", err)
		}
	}()
}

// TransactionHTTP serves GET /v1/transactions/{id}: ledger.v1.query.transaction
// over HTTP, the same answer (AnswerTransactionQuery) with the HTTP status of
// its code. It takes no URL parameter (httpapi.CheckParams).
func TransactionHTTP(l TransactionLookup) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var ans any
		if qerr := httpapi.CheckParams(req.URL.Query(), nil); qerr != nil {
			ans = *qerr
		} else {
			body, _ := json.Marshal(TransactionQuery{TransactionID: req.PathValue("id")})
			ans = AnswerTransactionQuery(req.Context(), l, body)
		}
		status := http.StatusOK
		if qe, ok := ans.(reply.QueryError); ok {
			status = httpapi.StatusOf(qe.Code)
		}
		httpapi.WriteJSON(w, status, ans)
	})
}
