package projections

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
)

// transfersProjection maintains readmodel.transfers from the transfer streams: one
// row per transfer with its status (pending, completed, rejected, failed) and the
// amount refunded so far.
type transfersProjection struct{}

func (transfersProjection) Name() string { return Transfers }

type transferRow struct {
	id                     string
	requested              bool // TransferRequested is in this batch: the row is complete
	from, to, currency     string
	amount                 int64
	status                 string // "" when this batch does not change it
	code                   string
	refunded               int64 // refunds completed in this batch
	key                    string
	revision               int64
	requestedAt, updatedAt time.Time
}

func (transfersProjection) Apply(ctx context.Context, tx pgx.Tx, gen int, events []*Event) error {
	rows := map[string]*transferRow{}
	for _, ev := range events {
		id, ok := strings.CutPrefix(ev.Stream, domain.TransferStreamPrefix)
		if !ok {
			continue
		}
		if ev.DecodeErr != nil {
			return fmt.Errorf("projections: transfers: %s@%d: %w", ev.Stream, ev.Revision, ev.DecodeErr)
		}
		t := rows[id]
		if t == nil {
			t = &transferRow{id: id}
			rows[id] = t
		}
		if err := t.apply(ev); err != nil {
			return err
		}
	}
	if len(rows) == 0 {
		return nil
	}
	return writeTransfers(ctx, tx, gen, rows)
}

// apply folds one event of the transfer's stream into its row: the request,
// the transfer's status and code, the amount refunded.
func (t *transferRow) apply(ev *Event) error {
	t.revision, t.updatedAt = int64(ev.Revision), ev.Meta.At
	switch p := ev.Payload.(type) {
	case *domain.TransferRequested:
		t.requested, t.from, t.to, t.amount, t.currency = true, p.From, p.To, p.Amount, p.Currency
		t.status, t.key, t.requestedAt = domain.TransferStatusPending, ev.Meta.Key, ev.Meta.At
	case *domain.TransferRejected:
		t.status, t.code = domain.TransferStatusRejected, string(p.Code)
	case *domain.TransferCreditRefused:
		t.status, t.code = domain.TransferStatusPending, string(p.Code)
		if p.Moved != 0 { // up_to: what the debit moved (v1.2 §2.3)
			t.amount = p.Moved
		}
	case *domain.TransferCompleted:
		// the amount that moved: a transfer with up_to's (v1.2 §2.3), the
		// requested amount for any other
		t.status, t.amount = domain.TransferStatusCompleted, p.Amount
	case *domain.TransferFailed:
		t.status, t.code = domain.TransferStatusFailed, string(p.Code)
	case *domain.RefundCompleted:
		t.refunded += p.Amount
	case *domain.TransferRefundRequested, *domain.RefundRejected, *domain.RefundCreditRefused, *domain.RefundFailed:
	default:
		return fmt.Errorf("projections: transfers: %s@%d: event %s does not belong to a transfer stream", ev.Stream, ev.Revision, ev.Type)
	}
	return nil
}

// writeTransfers inserts the transfers requested in the batch and updates the
// others, each only when the batch is past the row's revision.
func writeTransfers(ctx context.Context, tx pgx.Tx, gen int, rows map[string]*transferRow) error {
	ids := make([]string, 0, len(rows))
	for id := range rows {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	n := len(ids)
	var (
		requested                            = make([]bool, n)
		from, to, currency, status, code, ks = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		amount, refunded, rev                = make([]int64, n), make([]int64, n), make([]int64, n)
		requestedAt, updatedAt               = make([]time.Time, n), make([]time.Time, n)
	)
	for i, id := range ids {
		t := rows[id]
		requested[i], from[i], to[i], currency[i], status[i], code[i], ks[i] = t.requested, t.from, t.to, t.currency, t.status, t.code, t.key
		amount[i], refunded[i], rev[i], requestedAt[i], updatedAt[i] = t.amount, t.refunded, t.revision, t.requestedAt, t.updatedAt
	}
	// The refunded amount is added, not set: the revision guard makes a batch
	// count once (a batch is applied to a row entirely or not at all).
	sql := fmt.Sprintf(`WITH u AS (
	SELECT * FROM unnest($1::text[], $2::bool[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[],
		$9::bigint[], $10::text[], $11::bigint[], $12::timestamptz[], $13::timestamptz[])
		AS u(transfer_id, requested, from_account, to_account, amount, currency, status, code, refunded, idempotency_key, revision, requested_at, updated_at)
), ins AS (
	INSERT INTO %[1]s AS t (transfer_id, from_account, to_account, amount, currency, status, code, refunded, idempotency_key, revision, requested_at, updated_at)
	SELECT transfer_id, from_account, to_account, amount, currency, status, code, refunded, idempotency_key, revision, requested_at, updated_at
	FROM u WHERE requested
	ON CONFLICT (transfer_id) DO NOTHING
)
UPDATE %[1]s AS t SET
	status = CASE WHEN u.status = '' THEN t.status ELSE u.status END,
	code = CASE WHEN u.code = '' THEN t.code ELSE u.code END,
	amount = CASE WHEN u.amount = 0 THEN t.amount ELSE u.amount END,
	refunded = t.refunded + u.refunded, revision = u.revision, updated_at = u.updated_at
FROM u WHERE NOT u.requested AND t.transfer_id = u.transfer_id AND t.revision < u.revision`, Table("transfers", gen))
	if _, err := tx.Exec(ctx, sql, ids, requested, from, to, amount, currency, status, code, refunded, ks, rev, requestedAt, updatedAt); err != nil {
		return fmt.Errorf("projections: transfers: %w", err)
	}
	return nil
}
