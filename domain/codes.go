package domain

import "fmt"

// Status is the outcome class of a command (PROTOCOL.md §3).
type Status string

const (
	StatusApplied  Status = "applied"  // money moved or state changed
	StatusRejected Status = "rejected" // a business rule said no; recorded
	StatusInvalid  Status = "invalid"  // the request is malformed; nothing recorded
	StatusError    Status = "error"    // infrastructure failure; retry with the same key
)

// Definite reports whether s is a final answer to its key: applied, rejected
// and invalid are; error is not (the client resends, same key, until it gets
// one of the others).
func (s Status) Definite() bool {
	return s == StatusApplied || s == StatusRejected || s == StatusInvalid
}

// Code is a typed outcome code, never matched as free text.
type Code string

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
	CodeTransactionExists      Code = "transaction_exists" // v1.1
	CodeHoldNotFound           Code = "hold_not_found"
	CodeHoldExists             Code = "hold_exists"
	CodeHoldExpired            Code = "hold_expired"
	CodeHoldNotActive          Code = "hold_not_active"
	CodeOriginalNotFound       Code = "original_not_found"
	CodeRefundExceedsOriginal  Code = "refund_exceeds_original"
	CodeNotRefundable          Code = "not_refundable"
	CodeInternalError          Code = "internal_error"
	CodeRevisionMismatch       Code = "revision_mismatch" // v1.2 §2.3
	// CodeLinkedEventFailed answers every other element of an atomic batch
	// that one element refused (v1.2 §2.2): it was not applied because of it.
	CodeLinkedEventFailed Code = "linked_event_failed"
	CodeNotFound          Code = "not_found" // queries only
)

// Rejection is a business refusal: a typed code and a human message.
type Rejection struct {
	Code    Code
	Message string
	// Recorded is false for refusals that concern something that does not exist
	// (an account or an original): those are not written, so a retry re-decides.
	Recorded bool
}

// MissingAccount is the refusal, not recorded, of a command naming an account
// that does not exist.
func MissingAccount(id string) *Rejection {
	return &Rejection{Code: CodeAccountNotFound, Message: fmt.Sprintf("account %s does not exist", id)}
}
