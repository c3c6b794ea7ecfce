package natsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/adapters/httpapi"
)

// CommandQuery is the body of ledger.v1.query.command.
type CommandQuery struct {
	IdempotencyKey string `json:"idempotency_key"`
	// MinPosition is accepted for symmetry with the other queries; the outcome of a
	// command is read from the event store, which is never behind.
	MinPosition string `json:"min_position,omitempty"`
}

// QueryError is the reply of a query that found nothing or could not be answered.
type QueryError struct {
	Status         domain.Status `json:"status,omitempty"`
	Code           domain.Code   `json:"code"`
	Message        string        `json:"message"`
	IdempotencyKey string        `json:"idempotency_key,omitempty"`
	Fields         []string      `json:"fields,omitempty"`
}

// decodeQuery decodes a query body strictly into q.
func decodeQuery(body []byte, q any) *QueryError {
	if len(body) > domain.MaxBodyBytes {
		return &QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: fmt.Sprintf("body is %d bytes, over the limit of %d", len(body), domain.MaxBodyBytes)}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(q); err != nil {
		return &QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: "body: " + err.Error()}
	}
	if dec.More() {
		return &QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: "body: trailing data after the JSON object"}
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
		return QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Fields: []string{"idempotency_key"},
			Message: fmt.Sprintf("idempotency_key: must be 1-%d printable ASCII characters", domain.MaxKeyLen)}
	}
	r, found, err := l.Lookup(ctx, q.IdempotencyKey)
	if err != nil {
		return QueryError{Status: domain.StatusError, Code: domain.CodeInternalError, IdempotencyKey: q.IdempotencyKey, Message: "lookup failed, retry: " + err.Error()}
	}
	if !found {
		return QueryError{Code: domain.CodeNotFound, IdempotencyKey: q.IdempotencyKey, Message: "no command was decided with this idempotency key"}
	}
	return r
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
		return QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Fields: []string{"transaction_id"},
			Message: fmt.Sprintf("transaction_id: must be 1-%d characters of [A-Za-z0-9._:-], or a refund's <id>~refund~<n>", domain.MaxIDLen)}
	}
	d, found, err := l.LookupTransaction(ctx, q.TransactionID)
	if err != nil {
		return QueryError{Status: domain.StatusError, Code: domain.CodeInternalError, Message: "lookup failed, retry: " + err.Error()}
	}
	if !found {
		return QueryError{Code: domain.CodeNotFound, Message: fmt.Sprintf("no transaction %s", q.TransactionID)}
	}
	return d
}

// onQuery answers one query message with answer, bounded like the others.
func (in *Intake) onQuery(msg *nats.Msg, subject string, answer func(context.Context, []byte) any) {
	if msg.Reply == "" {
		return
	}
	select {
	case in.qsem <- struct{}{}:
	case <-in.work.Done():
		return
	}
	in.wg.Add(1)
	go func() {
		defer func() { <-in.qsem; in.wg.Done() }()
		ctx, cancel := context.WithTimeout(in.work, in.opts.CommandTimeout)
		defer cancel()
		ans := answer(ctx, msg.Data)
		code := "ok"
		if a, ok := ans.(QueryError); ok {
			code = string(a.Code)
		}
		in.opts.Metrics.query(strings.TrimPrefix(subject, QuerySubjectPrefix), code)
		b, err := json.Marshal(ans)
		if err != nil {
			in.log.Error("encode query reply", "err", err)
			return
		}
		if err := msg.Respond(b); err != nil {
			in.log.Warn("query reply", "err", err)
		}
	}()
}

// queryTimeout is the default bound of a query from the client helpers.
const queryTimeout = 10 * time.Second

// TransactionHTTP serves GET /v1/transactions/{id}: ledger.v1.query.transaction
// over HTTP, the same answer (AnswerTransactionQuery) with the HTTP status of
// its code.
func TransactionHTTP(l TransactionLookup) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := json.Marshal(TransactionQuery{TransactionID: req.PathValue("id")})
		ans := AnswerTransactionQuery(req.Context(), l, body)
		status := http.StatusOK
		if qe, ok := ans.(QueryError); ok {
			status = httpapi.StatusOf(qe.Code)
		}
		httpapi.WriteJSON(w, status, ans)
	})
}
