package ledger

import (
	"github.com/ledgerworks/ledger/domain"
)

// TransferView is the transfer as a reply shows it.
type TransferView struct {
	TransferID string `json:"transfer_id"`
	Status     string `json:"status"`
}

// Reply is the answer to a command (PROTOCOL.md §3).
type Reply struct {
	Status         domain.Status       `json:"status"`
	Code           domain.Code         `json:"code"`
	Message        string              `json:"message"`
	IdempotencyKey string              `json:"idempotency_key"`
	Duplicate      bool                `json:"duplicate"`
	Fields         []string            `json:"fields,omitempty"`
	Events         []domain.EventRef   `json:"events"`
	Account        *domain.AccountView `json:"account,omitempty"`
	Transfer       *TransferView       `json:"transfer,omitempty"`
	// Position is the global position of the command's last event (an extension):
	// pass it as min_position to a query to read your own write.
	Position string `json:"position,omitempty"`
}

func invalidReply(key string, err *domain.InvalidError) Reply {
	r := Reply{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: err.Error(), IdempotencyKey: key, Events: []domain.EventRef{}}
	if err.Field != "" {
		r.Fields = []string{err.Field}
	}
	return r
}

func errorReply(key string, err error) Reply {
	return Reply{Status: domain.StatusError, Code: domain.CodeInternalError, Message: "infrastructure failure, retry with the same key: " + err.Error(), IdempotencyKey: key, Events: []domain.EventRef{}}
}

func conflictReply(key string, fields []string) Reply {
	return Reply{
		Status: domain.StatusInvalid, Code: domain.CodeIdempotencyKeyConflict, IdempotencyKey: key, Fields: fields,
		Message: "idempotency key was used with a different request; differing fields: " + joinFields(fields),
		Events:  []domain.EventRef{},
	}
}

func joinFields(f []string) string {
	out := ""
	for i, s := range f {
		if i > 0 {
			out += ", "
		}
		out += s
	}
	return out
}

// notRecordedReply answers a refusal that was not written (nothing exists to record it in).
func notRecordedReply(key string, r *domain.Rejection) Reply {
	return Reply{Status: domain.StatusRejected, Code: r.Code, Message: r.Message, IdempotencyKey: key, Events: []domain.EventRef{}}
}

// recordReply is the reply of a decided key, the same for the first answer and every
// duplicate but for the duplicate flag. It copies what it takes from rec.
func recordReply(rec *domain.KeyRecord, duplicate bool) Reply {
	return ownedRecordReply(copyRecord(rec), duplicate)
}

// ownedRecordReply is recordReply for a record the caller owns (a copyRecord, out of
// any cache): the reply shares its events and its account view, copying nothing.
func ownedRecordReply(rec *ownedRecord, duplicate bool) Reply {
	events := rec.Events
	if events == nil {
		events = []domain.EventRef{}
	}
	return Reply{
		Status: rec.Status, Code: rec.Code, Message: rec.Message, IdempotencyKey: rec.Key,
		Duplicate: duplicate, Events: events, Account: &rec.after, Position: rec.Position,
	}
}
