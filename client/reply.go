package client

import (
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Status is the outcome class of a command (PROTOCOL.md §3): the server's own
// type, so that the two cannot drift (the client imports the server's
// definitions, never the reverse). Status.Definite reports whether it is a
// final answer to its key.
type Status = domain.Status

// The statuses. Applied, Rejected and Invalid are definite; Error is not (the
// client resends, same key, until it gets one of the others).
const (
	StatusApplied  = domain.StatusApplied
	StatusRejected = domain.StatusRejected
	StatusInvalid  = domain.StatusInvalid
	StatusError    = domain.StatusError
)

// Code is a reply's code (PROTOCOL.md §3; queries also answer CodeNotFound and
// CodeProjectionBehind): the server's own type, as Status is.
type Code = domain.Code

// The codes of PROTOCOL.md §3 and §4.
const (
	CodeOK                     = domain.CodeOK
	CodeInvalidRequest         = domain.CodeInvalidRequest
	CodeIdempotencyKeyConflict = domain.CodeIdempotencyKeyConflict
	CodeAccountNotFound        = domain.CodeAccountNotFound
	CodeAccountExists          = domain.CodeAccountExists
	CodeAccountClosed          = domain.CodeAccountClosed
	CodeAccountNotEmpty        = domain.CodeAccountNotEmpty
	CodeCurrencyMismatch       = domain.CodeCurrencyMismatch
	CodeInsufficientFunds      = domain.CodeInsufficientFunds
	CodeAmountOverflow         = domain.CodeAmountOverflow
	CodeSameAccount            = domain.CodeSameAccount
	CodeTransferExists         = domain.CodeTransferExists
	CodeTransferNotFound       = domain.CodeTransferNotFound
	CodeTransactionExists      = domain.CodeTransactionExists
	CodeHoldNotFound           = domain.CodeHoldNotFound
	CodeHoldExists             = domain.CodeHoldExists
	CodeHoldExpired            = domain.CodeHoldExpired
	CodeHoldNotActive          = domain.CodeHoldNotActive
	CodeOriginalNotFound       = domain.CodeOriginalNotFound
	CodeRefundExceedsOriginal  = domain.CodeRefundExceedsOriginal
	CodeNotRefundable          = domain.CodeNotRefundable
	CodeRevisionMismatch       = domain.CodeRevisionMismatch
	CodeLinkedEventFailed      = domain.CodeLinkedEventFailed
	CodeInternalError          = domain.CodeInternalError
	CodeNotFound               = domain.CodeNotFound
	CodeProjectionBehind       = reply.CodeProjectionBehind
)

// Reply is the ledger's answer to a command (PROTOCOL.md §3).
type Reply struct {
	Status    Status `json:"status"`
	Code      Code   `json:"code"`
	Message   string `json:"message"`
	Key       string `json:"idempotency_key"`
	Duplicate bool   `json:"duplicate"`
	// Fields names the offending fields of an invalid request, or the fields
	// that differ on idempotency_key_conflict.
	Fields   []string     `json:"fields,omitempty"`
	Events   []EventRef   `json:"events"`
	Account  *Account     `json:"account,omitempty"`
	Transfer *TransferRef `json:"transfer,omitempty"`
	// Transaction, Accounts and Posting answer PostTransaction: its status, every
	// account it touched as it left them (ordered by ID), and for a refusal the
	// index of the refusing posting.
	Transaction *TransactionRef `json:"transaction,omitempty"`
	Accounts    []Account       `json:"accounts,omitempty"`
	Posting     *int            `json:"posting,omitempty"`
	// Moved is the amount a Withdraw or Transfer with UpTo moved (§2.3), set
	// when it applied.
	Moved *int64 `json:"moved,omitempty"`
	// Position is the global position of the command's last event (an
	// extension): pass it as MinPosition to a query to read your own write.
	Position string `json:"position,omitempty"`
}

// EventRef names one event a command wrote.
type EventRef struct {
	ID       string `json:"id"`
	Stream   string `json:"stream"`
	Revision uint64 `json:"revision"`
	Type     string `json:"type"`
}

// Account is an account as a reply shows it (the server's domain.AccountView).
type Account = domain.AccountView

// TransferRef is a transfer as a reply shows it.
type TransferRef struct {
	TransferID string `json:"transfer_id"`
	Status     string `json:"status"`
}

// TransactionRef is a transaction as a reply shows it.
type TransactionRef struct {
	TransactionID string `json:"transaction_id"`
	Status        string `json:"status"`
}

// BatchReply is the answer to a ledger.v1.cmd.batch request (PROTOCOL.md §2.2):
// for a batch that is not atomic, status applied and one reply per command in
// order; for an atomic one, the batch's outcome, the refusing element's Index
// and every element's reply.
type BatchReply struct {
	Status    Status   `json:"status"`
	Code      Code     `json:"code"`
	Message   string   `json:"message"`
	Key       string   `json:"idempotency_key,omitempty"`
	Duplicate bool     `json:"duplicate"`
	Fields    []string `json:"fields,omitempty"`
	// Index is the refusing element of an atomic batch.
	Index   *int    `json:"index,omitempty"`
	Replies []Reply `json:"replies"`
}
