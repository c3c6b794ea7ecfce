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

// The answers of the read models' queries (PROTOCOL.md §4): the server's and,
// aliased, the Go client's (client/queries.go), one definition for both.

// AccountState is the reply of the account query: the account object of a command
// reply, plus its status and the position the accounts projection has reached.
type AccountState struct {
	domain.AccountView
	Status            string `json:"status"` // open or closed
	ProjectedPosition string `json:"projected_position"`
}

// Entry is one statement line.
type Entry struct {
	EventID        string `json:"event_id"`
	Revision       int64  `json:"revision"`
	Type           string `json:"type"`
	Amount         int64  `json:"amount"` // signed
	BalanceAfter   int64  `json:"balance_after"`
	IdempotencyKey string `json:"idempotency_key"`
	At             string `json:"at"` // RFC 3339, UTC
	// EffectiveAt is when the money moved in the world (v1.2 §2.3), RFC 3339,
	// UTC: the command's effective_at, or At when it gave none.
	EffectiveAt string `json:"effective_at"`
	// TransferID names the transfer of a transfer's or a transfer refund's step (v1.1).
	TransferID string `json:"transfer_id,omitempty"`
	// TransactionID names the transaction of a transaction's leg (v1.1).
	TransactionID string `json:"transaction_id,omitempty"`
	// Metadata is the client's, of the command that moved the money (v1.1).
	Metadata map[string]string `json:"metadata"`
}

// Entries is the reply of the entries query, oldest first.
type Entries struct {
	Entries []Entry `json:"entries"`
	// NextAfterRevision, when the page was cut by its limit, is the
	// after_revision of the next page (v1.1).
	NextAfterRevision *int64 `json:"next_after_revision,omitempty"`
	ProjectedPosition string `json:"projected_position"`
}

// TransferState is the reply of the transfer query.
type TransferState struct {
	TransferID        string `json:"transfer_id"`
	From              string `json:"from"`
	To                string `json:"to"`
	Amount            int64  `json:"amount"`
	Currency          string `json:"currency"`
	Status            string `json:"status"` // pending, completed, rejected, failed
	ProjectedPosition string `json:"projected_position"`
}

// Balances is the reply of the balances query: one row per currency, sorted
// by currency, none when no account matches.
type Balances struct {
	Prefix   string            `json:"prefix"`
	Balances []CurrencyBalance `json:"balances"`
	// AsOf is the time asked (at) to the microsecond, RFC 3339 UTC; "" for
	// the current sums.
	AsOf string `json:"as_of,omitempty"`
	// AsOfEffective is the effective instant asked (effective_at, §2.3) to
	// the microsecond: the instant the sums are of.
	AsOfEffective string `json:"as_of_effective,omitempty"`
	// ProjectedPosition is the position of the read model summed: accounts for
	// the current sums, balances for the sums as of a time.
	ProjectedPosition string `json:"projected_position"`
}

// CurrencyBalance is one currency's sums over a group of accounts (open and
// closed): Accounts is how many were summed.
type CurrencyBalance struct {
	Currency  string `json:"currency"`
	Balance   int64  `json:"balance"`
	Held      int64  `json:"held"`
	Available int64  `json:"available"`
	Accounts  int64  `json:"accounts"`
}
