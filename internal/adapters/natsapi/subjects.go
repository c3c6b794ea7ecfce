package natsapi

import (
	"strings"
	"time"
)

// Subjects, stream and group names (PROTOCOL.md §2, §4).
const (
	// CommandSubjectPrefix + type is the subject of a command.
	CommandSubjectPrefix = "ledger.v1.cmd."
	// CommandSubjects is every command subject (and what the stream captures).
	CommandSubjects = "ledger.v1.cmd.>"
	// QuerySubjectPrefix + name is the subject of a query.
	QuerySubjectPrefix = "ledger.v1.query."
	// CommandQuerySubject answers the outcome of a command by its key.
	CommandQuerySubject = QuerySubjectPrefix + "command"
	// TransactionQuerySubject answers a transaction by its ID (v1.1), from the event store.
	TransactionQuerySubject = QuerySubjectPrefix + "transaction"
	// DLQSubject receives copies of JetStream commands that can never succeed.
	DLQSubject = "ledger.v1.dlq"

	// StreamName is the JetStream stream that captures CommandSubjects.
	StreamName = "LEDGER_COMMANDS"
	// DLQStreamName keeps the dead letters.
	DLQStreamName = "LEDGER_DLQ"
	// DefaultQueueGroup shares request-reply commands among instances.
	DefaultQueueGroup = "ledger"
	// DefaultQueryQueueGroup shares the read-model queries among the read
	// side's instances.
	DefaultQueryQueueGroup = "ledger-query"
	// DefaultDurable is the durable pull consumer shared by every instance.
	DefaultDurable = "ledger"
	// DuplicateWindow is the stream's Nats-Msg-Id dedupe window: a courtesy that
	// saves a redundant stored copy, never the guarantee (the key is).
	DuplicateWindow = 2 * time.Minute
)

// Headers on dead letters (besides the original message's own headers).
const (
	HeaderDLQReason     = "Ledger-Dlq-Reason"     // the reply code, or "max_deliveries"
	HeaderDLQMessage    = "Ledger-Dlq-Message"    // the reply message
	HeaderDLQSubject    = "Ledger-Dlq-Subject"    // the subject the command came on
	HeaderDLQStreamSeq  = "Ledger-Dlq-Stream-Seq" // its sequence in LEDGER_COMMANDS
	HeaderDLQDeliveries = "Ledger-Dlq-Deliveries" // how often it was delivered
)

// CommandSubject is the subject of a command type.
func CommandSubject(typ string) string { return CommandSubjectPrefix + typ }

// commandType is the type a command subject names ("" when it is not one).
func commandType(subject string) string {
	t, ok := strings.CutPrefix(subject, CommandSubjectPrefix)
	if !ok {
		return ""
	}
	return t
}
