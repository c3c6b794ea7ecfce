package ledger

import (
	"context"
	"errors"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Refunds in an atomic batch (PROTOCOL.md v1.2 §2.2: every command of §2 is an
// element). A refund's home is its original's: an account for a deposit or a
// withdrawal, the transfer's stream for a transfer, a refund slot of the
// transaction for a transaction (refunds.go). The batch must know it before it
// takes its locks, so each round first resolves every refund's original
// (refundOrigins): from its key's claim in the store, which never changes once
// written, or from the earlier element of the batch that carries that key
// (sent one after another, a refund of a command sent just before it finds
// it). A transfer's accounts are read from the transfer (they never change);
// a transfer still in flight is driven to its decision first, as a refund sent
// alone waits for it. Under the locks each refund is decided as alone, on the
// state the elements before it left: an account's by DecideAccount, a
// transfer's by DecideTransferRefund and the transfer decided at once, a
// transaction's by RefundOfTransaction in its first free slot, the slots the
// batch posted counted. A refund refused because no command has its original
// key asserts in the refusal's append that the key is still unclaimed, so that
// an original decided meanwhile makes the batch decided again.

// originKind is the kind of stream a refund's original lives in.
type originKind int

const (
	originMissing     originKind = iota // no command has the original key
	originAccount                       // a deposit, a withdrawal, or another account command
	originTransfer                      // a transfer or a refund of one
	originTransaction                   // a transaction, or a refund of one (stream "": one this batch posts)
	originOther                         // anything else (a batch's key): not refundable
)

// refundOrigin is where an atomic batch's refund finds its original.
type refundOrigin struct {
	kind     originKind
	stream   string   // the original's home stream
	accounts []string // the accounts the refund may move
	command  string   // the original's command type
}

// errOriginInFlight: a refund's original transfer is still in flight (its saga
// undecided); the next round's refundOrigins drives it to its decision.
var errOriginInFlight = errors.New("ledger: the original of a refund of the atomic batch is in flight")

// refundOrigins resolves the original of every refund of an atomic batch (nil
// at the other elements), outside the batch's locks.
func (s *Service) refundOrigins(ctx context.Context, cmds []domain.BatchCommand) ([]*refundOrigin, error) {
	var origins []*refundOrigin
	first := map[string]int{} // an element's key -> the first element with it
	for i, c := range cmds {
		if c.Invalid != nil {
			continue
		}
		if c.Type == domain.CmdRefund {
			if origins == nil {
				origins = make([]*refundOrigin, len(cmds))
			}
			o, err := s.refundOrigin(ctx, cmds, first, origins, c.OriginalKey)
			if err != nil {
				return nil, err
			}
			origins[i] = o
		}
		if _, ok := first[c.IdempotencyKey]; !ok {
			first[c.IdempotencyKey] = i
		}
	}
	return origins, nil
}

// refundOrigin is the origin of a refund of key: its claim's home, or that of
// the earlier element with that key (first), origins those of the refunds
// before it.
func (s *Service) refundOrigin(ctx context.Context, cmds []domain.BatchCommand, first map[string]int, origins []*refundOrigin, key string) (*refundOrigin, error) {
	claim, err := s.readClaim(ctx, key)
	if err != nil {
		return nil, err
	}
	if claim != nil {
		return s.claimOrigin(ctx, claim)
	}
	j, ok := first[key]
	if !ok {
		return &refundOrigin{kind: originMissing}, nil
	}
	c := cmds[j]
	switch c.Type {
	case domain.CmdTransfer:
		return &refundOrigin{kind: originTransfer, stream: domain.TransferStream(c.TransferID), accounts: []string{c.From, c.To}, command: string(c.Type)}, nil
	case domain.CmdPostTransaction:
		return &refundOrigin{kind: originTransaction, stream: domain.TransactionStream(c.TransactionID), accounts: domain.TransactionAccounts(c.Postings), command: string(c.Type)}, nil
	case domain.CmdRefund:
		o := *origins[j]
		if o.kind == originTransaction {
			o.stream = "" // its own slot, found as it is decided: a refund is not refunded
		}
		o.command = string(c.Type)
		return &o, nil
	}
	return &refundOrigin{kind: originAccount, stream: domain.AccountStream(c.AccountID), accounts: []string{c.AccountID}, command: string(c.Type)}, nil
}

// claimOrigin is the origin of a refund whose original's key is claimed in the
// store.
func (s *Service) claimOrigin(ctx context.Context, claim *domain.KeyClaimed) (*refundOrigin, error) {
	o := &refundOrigin{stream: claim.Stream, command: claim.Command}
	switch {
	case strings.HasPrefix(claim.Stream, domain.AccountStreamPrefix):
		o.kind, o.accounts = originAccount, []string{strings.TrimPrefix(claim.Stream, domain.AccountStreamPrefix)}
	case strings.HasPrefix(claim.Stream, domain.TransferStreamPrefix):
		o.kind = originTransfer
		accounts, err := s.transferAccounts(ctx, claim.Stream, claim.Key)
		if err != nil {
			return nil, err
		}
		o.accounts = accounts
	case domain.IsTransactionStream(claim.Stream):
		o.kind = originTransaction
		tx, err := s.readTransaction(ctx, claim.Stream)
		if err != nil {
			return nil, err
		}
		if posted, _ := postedOriginal(domain.Command{}, tx); posted != nil {
			o.accounts = domain.TransactionAccounts(posted.Postings)
		}
	default:
		o.kind = originOther
	}
	return o, nil
}

// transferAccounts are the accounts of a transfer (of stream) that a refund of
// key reverses (from, to; none when the stream holds no transfer), under the
// stream's lock; the transfer's saga of key, when it is still in flight, is
// driven to its decision first (refundTransfer).
func (s *Service) transferAccounts(ctx context.Context, stream, key string) ([]string, error) {
	unlock, err := s.locks.lock(ctx, stream)
	if err != nil {
		return nil, err
	}
	defer unlock()
	id := strings.TrimPrefix(stream, domain.TransferStreamPrefix)
	t, err := s.loadTransfer(ctx, stream, id, true)
	if err != nil {
		return nil, err
	}
	if t.Saga != nil && t.Saga.Key == key && !t.Saga.Stage.Decided() {
		if t, err = s.driveSaga(ctx, stream, id, key); err != nil {
			return nil, err
		}
	}
	if t.From == "" {
		return nil, nil
	}
	return []string{t.From, t.To}, nil
}

// refundStreams are the streams the refunds of origins write besides their
// accounts (own) and those accounts.
func refundStreams(origins []*refundOrigin) (own, accounts []string) {
	for _, o := range origins {
		if o == nil {
			continue
		}
		if o.kind == originTransfer || (o.kind == originTransaction && o.stream != "") {
			own = append(own, o.stream)
		}
		accounts = append(accounts, o.accounts...)
	}
	return own, accounts
}

// refund decides a refund element, whose original is o.
func (bd *batchDecision) refund(ctx context.Context, cmd domain.Command, o *refundOrigin) (*Reply, error) {
	var r Reply
	switch o.kind {
	case originMissing:
		bd.unclaimed = append(bd.unclaimed, domain.KeyStream(cmd.OriginalKey))
		r = originNotFound(cmd)
	case originAccount:
		return bd.onAccount(ctx, cmd, o.accounts[0])
	case originTransfer:
		return bd.refundTransfer(ctx, cmd, o.stream)
	case originTransaction:
		return bd.refundTransaction(ctx, cmd, o.stream)
	default:
		r = notRefundable(cmd, o.command)
	}
	return &r, nil
}

// refundTransfer decides a refund of a transfer (Service.refundTransfer's
// decision): the refund's request and the reversed transfer, decided at once.
func (bd *batchDecision) refundTransfer(ctx context.Context, cmd domain.Command, stream string) (*Reply, error) {
	t, err := bd.transferState(ctx, stream, strings.TrimPrefix(stream, domain.TransferStreamPrefix))
	if err != nil {
		return nil, err
	}
	if _, ok := t.SagaOf(cmd.IdempotencyKey); ok {
		return nil, errDecidedMeanwhile
	}
	if t.Saga != nil && t.Saga.Key == cmd.OriginalKey && !t.Saga.Stage.Decided() {
		return nil, errOriginInFlight
	}
	d := domain.DecideTransferRefund(t, cmd)
	if len(d.Events) == 0 || d.Rejection != nil {
		r := reply.NotRecorded(cmd.IdempotencyKey, d.Rejection)
		return &r, nil
	}
	return bd.atOnce(ctx, cmd, t, stream, d.Events)
}

// refundTransaction decides a refund of a transaction (of origStream; "" for
// a refund this batch posts) as Service.refundTransaction does: the reversed
// transaction in the first slot free in the store and in the batch.
func (bd *batchDecision) refundTransaction(ctx context.Context, cmd domain.Command, origStream string) (*Reply, error) {
	o, err := bd.readTransaction(ctx, origStream)
	if err != nil {
		return nil, err
	}
	posted, refused := postedOriginal(cmd, o)
	if refused != nil {
		return refused, nil
	}
	req := cmd.Canonical()
	slot, err := refundSlot(ctx, bd.readTransaction, posted.TransactionID, cmd, req)
	switch {
	case err != nil:
		return nil, err
	case slot.answer != nil: // a slot holds the key: decided meanwhile (a conflict is priorDecisions')
		return nil, errDecidedMeanwhile
	}
	tx, rej := domain.RefundOfTransaction(posted, cmd, slot.refunded)
	if rej != nil {
		r := reply.NotRecorded(cmd.IdempotencyKey, rej)
		return &r, nil
	}
	tx.TransactionID = domain.RefundTransactionID(posted.TransactionID, slot.slot)
	return bd.post(tx, req, domain.TransactionStream(tx.TransactionID))
}
