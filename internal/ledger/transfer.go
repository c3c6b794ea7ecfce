package ledger

import (
	"context"
	"errors"

	"github.com/ledgerworks/ledger/domain"
)

// errTransfersPending marks the transfer saga as not built yet (issue 4 builds it).
var errTransfersPending = errors.New("ledger: transfers are not available in this build yet")

func (s *Service) handleTransfer(ctx context.Context, cmd domain.Command) (Reply, error) {
	return Reply{}, errTransfersPending
}

func (s *Service) refundTransfer(ctx context.Context, cmd domain.Command, orig *domain.KeyClaimed) (Reply, error) {
	return Reply{}, errTransfersPending
}

func (s *Service) lookupTransfer(ctx context.Context, key string, c *domain.KeyClaimed) (Reply, bool, error) {
	return Reply{}, false, errTransfersPending
}
