package natsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/reply"
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

// AnswerCommandQuery answers a ledger.v1.query.command body: the original reply of
// the command (PROTOCOL.md §3, duplicate false), code not_found for a key never
// decided, invalid_request for a malformed body, internal_error when the lookup
// fails (retry).
func AnswerCommandQuery(ctx context.Context, l CommandLookup, body []byte) any {
	var q CommandQuery
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if len(body) > domain.MaxBodyBytes {
		return QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: fmt.Sprintf("body is %d bytes, over the limit of %d", len(body), domain.MaxBodyBytes)}
	}
	if err := dec.Decode(&q); err != nil {
		return QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: "body: " + err.Error()}
	}
	if dec.More() {
		return QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: "body: trailing data after the JSON object"}
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

func (in *Intake) onCommandQuery(msg *nats.Msg) {
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
		ans := AnswerCommandQuery(ctx, in.opts.Lookup, msg.Data)
		code := "ok"
		switch a := ans.(type) {
		case QueryError:
			code = string(a.Code)
		case reply.Reply:
			code = "ok"
		}
		in.opts.Metrics.query("command", code)
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
