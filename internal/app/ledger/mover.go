package ledger

import (
	"context"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// Money over several accounts (ARCHITECTURE decisions 6 and 16): a transfer
// and its refunds, a transaction and its refunds, a capture into another
// account. A store that appends to several streams in one write
// (eventstore.MultiAppender) takes each as one decision over all its accounts
// and one append (atomicMover, atomic.go); any other as a saga of idempotent
// steps under derived keys, run inline and finished by the transfer process
// after a crash (sagaMover, saga.go, txsaga.go, capturesaga.go). New picks
// one from the store's capability (moverFor); command code asks none.
type mover interface {
	// transaction decides a post_transaction.
	transaction(ctx context.Context, cmd domain.Command) (Reply, error)
	// refundTransaction refunds posted, the transaction of origStream, as a
	// transaction of its own in the original's next refund slot; req is the
	// refund's client request.
	refundTransaction(ctx context.Context, cmd domain.Command, req domain.Canonical, origStream string, posted *domain.TransactionPosted) (Reply, error)
	// captureTo decides a capture_hold with `to`.
	captureTo(ctx context.Context, cmd domain.Command) (Reply, error)
	// openSaga takes a saga's request that its transfer stream accepted
	// (o), under the stream's lock: either decided at once and answered, or
	// the events for decideOnTransfer to append before the saga runs.
	openSaga(ctx context.Context, cmd domain.Command, req domain.Canonical, o sagaOpening) (transferStep, error)
	// captureInFlight reports, for Lookup, whether the capture into an account
	// claimed as c under key is still running (its answer is not final).
	captureInFlight(ctx context.Context, key string, c *domain.KeyClaimed) (bool, error)
	// atomicBatch decides an atomic batch (PROTOCOL.md v1.2 §2.2): one
	// decision and one append (atomicbatch.go), or invalid naming `atomic`
	// where the store cannot append to several streams at once.
	atomicBatch(ctx context.Context, b domain.Batch) (Reply, error)
}

// moverCommands are the client commands a mover decides whole, each with the
// mover's method for it; Handle routes them here. A new command over several
// accounts is its method on mover, its two implementations (atomic.go,
// saga.go) and its line here (docs/architecture.md, "Adding a command").
var moverCommands = map[domain.CommandType]func(mover, context.Context, domain.Command) (Reply, error){
	domain.CmdPostTransaction: mover.transaction,
}

// moverFor is the mover a store's capability calls for.
func moverFor(s *Service, store Store) mover {
	if _, ok := store.(eventstore.MultiAppender); ok {
		return atomicMover{s}
	}
	return sagaMover{s}
}

// sagaOpening is a saga's request that its transfer stream accepted, for the
// mover to open.
type sagaOpening struct {
	t         *domain.Transfer  // the transfer the request was decided on
	requested []domain.NewEvent // the request: a transfer, or a refund of one
	// fresh: t was read from the store's head, and so are the accounts a
	// decision at once reads; otherwise they come from the cache, and the
	// append's expected revisions catch a stale one (decide again, fresh).
	fresh bool
}

// transferStep is what a decision on a transfer stream answers
// decideOnTransfer: a reply (next answered), events to append (appendThem),
// or to decide again (again, cached).
type transferStep struct {
	r      Reply
	events []domain.NewEvent
	next   transferNext
}
