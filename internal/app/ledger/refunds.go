package ledger

import (
	"context"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// handleRefund finds the original by its key's claim and refunds it in the
// original's home stream: an account for deposits and withdrawals, the transfer's
// stream for transfers; a transaction's refund is a transaction of its own.
func (s *Service) handleRefund(ctx context.Context, cmd domain.Command) (Reply, error) {
	orig, err := s.readClaim(ctx, cmd.OriginalKey)
	if err != nil {
		return Reply{}, err
	}
	if orig == nil {
		return originNotFound(cmd), nil
	}
	switch {
	case strings.HasPrefix(orig.Stream, domain.AccountStreamPrefix):
		return s.handleAccountCommand(ctx, cmd, orig.Stream, strings.TrimPrefix(orig.Stream, domain.AccountStreamPrefix))
	case strings.HasPrefix(orig.Stream, domain.TransferStreamPrefix):
		return s.refundTransfer(ctx, cmd, orig)
	case domain.IsTransactionStream(orig.Stream):
		return s.refundTransaction(ctx, cmd, orig)
	}
	return notRefundable(cmd, orig.Command), nil
}

// originNotFound is a refund's reply when no command has its original key.
func originNotFound(cmd domain.Command) Reply {
	return reply.NotRecorded(cmd.IdempotencyKey, &domain.Rejection{Code: domain.CodeOriginalNotFound, Message: "no command with key " + quote(cmd.OriginalKey)})
}

// notRefundable is a refund's reply when its original (a command) has no
// home a refund reverses.
func notRefundable(cmd domain.Command, command string) Reply {
	return reply.NotRecorded(cmd.IdempotencyKey, &domain.Rejection{Code: domain.CodeNotRefundable, Message: command + " " + quote(cmd.OriginalKey) + " cannot be refunded"})
}

func quote(s string) string { return "\"" + s + "\"" }
