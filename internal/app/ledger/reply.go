package ledger

import (
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Reply is the answer to a command; its one home is package reply.
type Reply = reply.Reply

// recordReply is the reply of a decided key, the same for the first answer and every
// duplicate but for the duplicate flag. It copies what it takes from rec.
func recordReply(rec *domain.KeyRecord, duplicate bool) Reply {
	return ownedRecordReply(copyRecord(rec), duplicate)
}

// ownedRecordReply is recordReply for a record the caller owns (a copyRecord, out of
// any cache): the reply shares its events and its account view, copying nothing.
func ownedRecordReply(rec *ownedRecord, duplicate bool) Reply {
	return reply.Account(&rec.KeyRecord, rec.Events, &rec.after, duplicate)
}
