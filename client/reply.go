package client

// Status is the outcome class of a command (PROTOCOL.md §3).
type Status string

// The statuses. Applied, Rejected and Invalid are definite; Error is not (the
// client resends, same key, until it gets one of the others).
const (
	StatusApplied  Status = "applied"
	StatusRejected Status = "rejected"
	StatusInvalid  Status = "invalid"
	StatusError    Status = "error"
)

// Definite reports whether s is a final answer to its key.
func (s Status) Definite() bool {
	return s == StatusApplied || s == StatusRejected || s == StatusInvalid
}

// Code is a reply's code (PROTOCOL.md §3; queries also answer CodeNotFound and
// CodeProjectionBehind).
type Code string

// The codes of PROTOCOL.md §3 and §4.
const (
	CodeOK                     Code = "ok"
	CodeInvalidRequest         Code = "invalid_request"
	CodeIdempotencyKeyConflict Code = "idempotency_key_conflict"
	CodeAccountNotFound        Code = "account_not_found"
	CodeAccountExists          Code = "account_exists"
	CodeAccountClosed          Code = "account_closed"
	CodeAccountNotEmpty        Code = "account_not_empty"
	CodeCurrencyMismatch       Code = "currency_mismatch"
	CodeInsufficientFunds      Code = "insufficient_funds"
	CodeAmountOverflow         Code = "amount_overflow"
	CodeSameAccount            Code = "same_account"
	CodeTransferExists         Code = "transfer_exists"
	CodeTransferNotFound       Code = "transfer_not_found"
	CodeTransactionExists      Code = "transaction_exists"
	CodeHoldNotFound           Code = "hold_not_found"
	CodeHoldExists             Code = "hold_exists"
	CodeHoldExpired            Code = "hold_expired"
	CodeHoldNotActive          Code = "hold_not_active"
	CodeOriginalNotFound       Code = "original_not_found"
	CodeRefundExceedsOriginal  Code = "refund_exceeds_original"
	CodeNotRefundable          Code = "not_refundable"
	CodeRevisionMismatch       Code = "revision_mismatch"
	CodeLinkedEventFailed      Code = "linked_event_failed"
	CodeInternalError          Code = "internal_error"
	CodeNotFound               Code = "not_found"
	CodeProjectionBehind       Code = "projection_behind"
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

// Account is an account as a reply shows it.
type Account struct {
	AccountID string `json:"account_id"`
	Currency  string `json:"currency"`
	Balance   int64  `json:"balance"`
	Held      int64  `json:"held"`
	Available int64  `json:"available"`
	Revision  uint64 `json:"revision"`
}

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
