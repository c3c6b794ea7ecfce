package reply

import (
	"encoding/hex"
	"strconv"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
)

// AppendJSON appends r as json.Marshal(r) encodes it, byte for byte (field
// order, omitempty, escaping: TestAppendJSONMatchesMarshal), written without
// reflection: the intake answers every command with it (AppendMembers) and
// the audit renders every command's expected reply with it.
func AppendJSON(b []byte, r Reply) []byte {
	return append(AppendMembers(b, r), '}')
}

// appendNested is AppendJSON for a batch's replies, called through a
// variable with a buffer of its own: AppendJSON calling itself would be
// recursion, whose buffer escape analysis sends to the heap, and so every
// caller's buffer (replyRow's, on its stack) with it.
var appendNested func([]byte, Reply) []byte

func init() { appendNested = AppendJSON }

// AppendMembers appends r's members, from the object's opening brace on,
// without the closing one (the wire reply adds its own members), in the
// wire's order.
func AppendMembers(b []byte, r Reply) []byte {
	b = appendOutcome(b, r)
	b = appendEvents(b, r.Events)
	b = appendSubjects(b, r)
	return appendRest(b, r)
}

// appendOutcome appends the opening brace and the members every reply has:
// status, code, message, key, duplicate, and the fields when there are some.
func appendOutcome(b []byte, r Reply) []byte {
	b = append(b, `{"status":`...)
	b = domain.AppendJSONString(b, string(r.Status))
	b = append(b, `,"code":`...)
	b = domain.AppendJSONString(b, string(r.Code))
	b = append(b, `,"message":`...)
	b = domain.AppendJSONString(b, r.Message)
	b = append(b, `,"idempotency_key":`...)
	b = domain.AppendJSONString(b, r.IdempotencyKey)
	b = append(b, `,"duplicate":`...)
	b = strconv.AppendBool(b, r.Duplicate)
	if len(r.Fields) > 0 {
		b = append(b, `,"fields":[`...)
		for i, f := range r.Fields {
			if i > 0 {
				b = append(b, ',')
			}
			b = domain.AppendJSONString(b, f)
		}
		b = append(b, ']')
	}
	return b
}

// appendEvents appends the events member: null when there are none.
func appendEvents(b []byte, events []domain.EventRef) []byte {
	b = append(b, `,"events":`...)
	if events == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, e := range events {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":"`...)
		b = AppendUUID(b, e.ID)
		b = append(b, `","stream":`...)
		b = domain.AppendJSONString(b, e.Stream)
		b = append(b, `,"revision":`...)
		b = strconv.AppendUint(b, e.Revision, 10)
		b = append(b, `,"type":`...)
		b = domain.AppendJSONString(b, e.Type)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendSubjects appends what the command left, when it names it: the
// account, the transfer, the transaction, the accounts.
func appendSubjects(b []byte, r Reply) []byte {
	if a := r.Account; a != nil {
		b = append(b, `,"account":`...)
		b = appendAccount(b, a)
	}
	if t := r.Transfer; t != nil {
		b = append(b, `,"transfer":{"transfer_id":`...)
		b = domain.AppendJSONString(b, t.TransferID)
		b = append(b, `,"status":`...)
		b = domain.AppendJSONString(b, t.Status)
		b = append(b, '}')
	}
	if t := r.Transaction; t != nil {
		b = append(b, `,"transaction":{"transaction_id":`...)
		b = domain.AppendJSONString(b, t.TransactionID)
		b = append(b, `,"status":`...)
		b = domain.AppendJSONString(b, t.Status)
		b = append(b, '}')
	}
	if len(r.Accounts) > 0 {
		b = append(b, `,"accounts":[`...)
		for i := range r.Accounts {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendAccount(b, &r.Accounts[i])
		}
		b = append(b, ']')
	}
	return b
}

// appendRest appends the members that only some replies have: the posting,
// moved, the position, a batch's replies (each an object of its own) and
// the refused element's index.
func appendRest(b []byte, r Reply) []byte {
	if r.Posting != nil {
		b = append(b, `,"posting":`...)
		b = strconv.AppendInt(b, int64(*r.Posting), 10)
	}
	if r.Moved != nil {
		b = append(b, `,"moved":`...)
		b = strconv.AppendInt(b, *r.Moved, 10)
	}
	if r.Position != "" {
		b = append(b, `,"position":`...)
		b = domain.AppendJSONString(b, r.Position)
	}
	if len(r.Replies) > 0 {
		b = append(b, `,"replies":[`...)
		for i := range r.Replies {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, appendNested(nil, r.Replies[i])...)
		}
		b = append(b, ']')
	}
	if r.Index != nil {
		b = append(b, `,"index":`...)
		b = strconv.AppendInt(b, int64(*r.Index), 10)
	}
	return b
}

// appendAccount appends an account object.
func appendAccount(b []byte, a *domain.AccountView) []byte {
	b = append(b, `{"account_id":`...)
	b = domain.AppendJSONString(b, a.AccountID)
	b = append(b, `,"currency":`...)
	b = domain.AppendJSONString(b, a.Currency)
	b = append(b, `,"balance":`...)
	b = strconv.AppendInt(b, a.Balance, 10)
	b = append(b, `,"held":`...)
	b = strconv.AppendInt(b, a.Held, 10)
	b = append(b, `,"available":`...)
	b = strconv.AppendInt(b, a.Available, 10)
	b = append(b, `,"revision":`...)
	b = strconv.AppendUint(b, a.Revision, 10)
	return append(b, '}')
}

// AppendUUID appends id as its canonical text (what uuid.UUID.MarshalText and
// String write), without a string of it.
func AppendUUID(b []byte, id uuid.UUID) []byte {
	var buf [36]byte
	hex.Encode(buf[0:8], id[0:4])
	buf[8] = '-'
	hex.Encode(buf[9:13], id[4:6])
	buf[13] = '-'
	hex.Encode(buf[14:18], id[6:8])
	buf[18] = '-'
	hex.Encode(buf[19:23], id[8:10])
	buf[23] = '-'
	hex.Encode(buf[24:], id[10:])
	return append(b, buf[:]...)
}
