package ledger

import (
	"context"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// The saga mover (mover.go), for a store that appends to one stream at a
// time (KurrentDB through the v4 client): money over several accounts moves
// by a saga of idempotent steps under derived keys, run inline and finished
// by the transfer process after a crash (process.go). A transfer and its
// refunds run in their transfer stream (openSaga, then transfers.go's
// driveSaga), a transaction and its refunds as reservation sagas
// (txsaga.go), a capture into an account as a capture saga (capturesaga.go).

// sagaMover moves money over several accounts by sagas.
type sagaMover struct{ s *Service }

// openSaga writes the request first and runs the saga after it
// (decideOnTransfer). A transfer that names an account that does not exist
// is refused without a record (PROTOCOL.md §3), and no money moves for it;
// one whose effective_at an account refuses is invalid, before any step.
func (m sagaMover) openSaga(ctx context.Context, cmd domain.Command, _ domain.Canonical, o sagaOpening) (transferStep, error) {
	ids := []string{o.t.To, o.t.From} // a refund's accounts are its transfer's
	if cmd.Type == domain.CmdTransfer {
		ids = []string{cmd.From, cmd.To}
		for _, id := range ids {
			open, err := m.s.accountOpened(ctx, id)
			if err != nil || !open {
				return transferStep{r: reply.NotRecorded(cmd.IdempotencyKey, domain.MissingAccount(id))}, err
			}
		}
	}
	if ierr, err := m.s.effectiveRefused(ctx, cmd, ids...); ierr != nil || err != nil {
		return transferStep{r: reply.Invalid(cmd.IdempotencyKey, ierr)}, err
	}
	return transferStep{events: o.requested, next: appendThem}, nil
}

// atomicBatch: a store that appends to one stream at a time cannot write a
// batch in one append, so an atomic batch is invalid, naming `atomic`, and
// nothing is decided (PROTOCOL.md v1.2 §2.2).
func (sagaMover) atomicBatch(_ context.Context, b domain.Batch) (Reply, error) {
	return reply.Invalid(b.Key, &domain.InvalidError{Field: "atomic", Message: "this ledger's event store cannot append to several streams at once: send the batch without atomic"}), nil
}
