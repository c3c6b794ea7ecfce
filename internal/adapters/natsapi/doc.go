// Package natsapi is the ledger's NATS intake: commands by request-reply on
// ledger.v1.cmd.<type> (a queue group shares them among instances) and, durably,
// from the JetStream stream LEDGER_COMMANDS through a pull consumer that acks only
// after the outcome is in the event store; the queries the ledger answers from the
// event store (ledger.v1.query.command, .transaction) and those the read side
// answers from the read models (ServeReadQueries); and the client side of both
// (Request returns the ledger's reply).
package natsapi
