package reply

import (
	"fmt"

	"github.com/ledgerworks/ledger/domain"
)

// QueryError is the reply of a query that found nothing or could not be
// answered (PROTOCOL.md §4): the one shape for the read models' queries and for
// those the ledger answers from the event store (command, transaction).
type QueryError struct {
	Status         domain.Status `json:"status,omitempty"`
	Code           domain.Code   `json:"code"`
	Message        string        `json:"message"`
	IdempotencyKey string        `json:"idempotency_key,omitempty"`
	Fields         []string      `json:"fields,omitempty"`
	// ProjectedPosition is how far the read model asked had come (read-model
	// queries only).
	ProjectedPosition string `json:"projected_position,omitempty"`
}

func (e *QueryError) Error() string { return string(e.Code) + ": " + e.Message }

// CodeProjectionBehind is the code of a query whose min_position the read
// model had not reached in time (answered 503 over HTTP).
const CodeProjectionBehind domain.Code = "projection_behind"

// InvalidQuery answers a malformed query; with a field, the message starts with
// it and Fields names it.
func InvalidQuery(field, format string, args ...any) *QueryError {
	e := &QueryError{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
	if field != "" {
		e.Fields = []string{field}
		e.Message = field + ": " + e.Message
	}
	return e
}
