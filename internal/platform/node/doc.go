// Package node assembles one ledger instance: a NATS connection, the event store,
// the command service, the NATS intake, the operational HTTP endpoints and any
// background runners (the transfer process, the projector), and takes them down in
// order. `ledger serve`, `ledger dev` and the tests start instances through it.
package node
