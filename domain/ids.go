package domain

import (
	"crypto/sha1"
	"strconv"

	"github.com/google/uuid"
)

// Namespace is the UUIDv5 namespace of the ledger's event IDs. It never changes:
// changing it would make every retry after an upgrade look like a new intent.
var Namespace = uuid.MustParse("5b0c6a52-3f1e-4f8e-9a57-2c9f1d7e8a10")

// EventID is the ID of the i-th event that command key writes to stream
// (ARCHITECTURE decision 2): the same intent always produces the same IDs.
// It is uuid.NewSHA1(Namespace, key + "/" + stream + "/" + i), computed in a
// stack buffer.
func EventID(key, stream string, i int) uuid.UUID {
	var buf [256]byte
	b := append(buf[:0], Namespace[:]...)
	b = append(b, key...)
	b = append(b, '/')
	b = append(b, stream...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(i), 10)
	sum := sha1.Sum(b)
	var id uuid.UUID
	copy(id[:], sum[:])
	id[6] = (id[6] & 0x0f) | 0x50 // version 5
	id[8] = (id[8] & 0x3f) | 0x80 // RFC 4122 variant
	return id
}

// Stream names.
const (
	AccountStreamPrefix  = "account-"
	TransferStreamPrefix = "transfer-"
	KeyStreamPrefix      = "key-"
)

// AccountStream is the stream of an account.
func AccountStream(accountID string) string { return AccountStreamPrefix + accountID }

// TransferStream is the stream of a transfer saga.
func TransferStream(transferID string) string { return TransferStreamPrefix + transferID }

// KeyStream is the stream that binds a client's idempotency key to one request,
// forever: its single KeyClaimed event is written with the command's first write.
func KeyStream(key string) string { return KeyStreamPrefix + key }

// StepKey derives the key of a saga step from the key of the command that caused it.
func StepKey(key, step string) string { return key + ":" + step }

// Saga step names.
const (
	StepDebit      = "debit"
	StepCredit     = "credit"
	StepCompensate = "compensate"
	StepExpire     = "expire"
)

// Limits of identifiers (PROTOCOL.md §1).
const (
	MaxIDLen  = 64
	MaxKeyLen = 128
)

// ValidID reports whether s is 1-64 characters of [A-Za-z0-9._:-].
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// ValidKey reports whether s is 1-128 printable ASCII characters.
func ValidKey(s string) bool {
	if len(s) == 0 || len(s) > MaxKeyLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// ValidCurrency reports whether s is three upper-case ASCII letters.
func ValidCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}
