package projections

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
)

// accountsProjection maintains readmodel.accounts and readmodel.holds.
//
// A batch is folded in memory into one row per account and one per hold (the
// balance and held amounts are absolute in the events: balance_after and
// held_after), then written with two multi-row statements. Every update is
// guarded by the stream revision, every insert is ON CONFLICT, so applying a batch
// a second time changes nothing.
type accountsProjection struct{}

func (accountsProjection) Name() string { return Accounts }

type accountRow struct {
	id                  string
	opened              bool // AccountOpened is in this batch: the row is complete
	currency            string
	overdraft           int64
	metadata            string
	balance, held       int64
	hasBalance, hasHeld bool
	status              domain.AccountStatus // "" when this batch does not change it
	revision            int64
	openedAt, updatedAt time.Time
}

type holdRow struct {
	account, hold       string
	placed              bool // HoldPlaced is in this batch: the row is complete
	amount              int64
	currency            string
	status              string
	captured            int64
	expiresAt           *time.Time
	key                 string
	revision            int64
	placedAt, updatedAt time.Time
}

func (accountsProjection) Apply(ctx context.Context, tx pgx.Tx, gen int, events []*Event) error {
	accounts := map[string]*accountRow{}
	holds := map[[2]string]*holdRow{}
	if err := foldAccounts(accounts, holds, events); err != nil {
		return err
	}
	if len(accounts) == 0 {
		return nil
	}
	if err := writeAccounts(ctx, tx, gen, accounts); err != nil {
		return err
	}
	if len(holds) > 0 {
		return writeHolds(ctx, tx, gen, holds)
	}
	return nil
}

// applyHeld is Apply for a builder that holds its accounts' rows (heldAccounts):
// the events are folded into held's rows, which are written when the builder
// releases them, and the holds are written now.
func (accountsProjection) applyHeld(ctx context.Context, tx pgx.Tx, gen int, events []*Event, held *heldAccounts) error {
	holds := map[[2]string]*holdRow{}
	if err := foldAccounts(held.rows, holds, events); err != nil {
		return err
	}
	if len(holds) > 0 {
		return writeHolds(ctx, tx, gen, holds)
	}
	return nil
}

// foldAccounts folds the account events of events into the accounts' rows and
// the holds' (applyAccountEvent).
func foldAccounts(accounts map[string]*accountRow, holds map[[2]string]*holdRow, events []*Event) error {
	for _, ev := range events {
		id, ok := ev.AccountID()
		if !ok {
			continue
		}
		if ev.DecodeErr != nil {
			return fmt.Errorf("projections: accounts: %s@%d: %w", ev.Stream, ev.Revision, ev.DecodeErr)
		}
		if err := applyAccountEvent(accounts, holds, id, ev); err != nil {
			return err
		}
	}
	return nil
}

// applyAccountEvent folds one event of account id into the account's row and,
// for a hold's event, into the hold's row: what the event changes of them
// (domain.AccountChange).
func applyAccountEvent(accounts map[string]*accountRow, holds map[[2]string]*holdRow, id string, ev *Event) error {
	e, ok := ev.Payload.(domain.AccountEvent)
	if !ok {
		return fmt.Errorf("projections: accounts: %s@%d: event %s does not belong to an account stream", ev.Stream, ev.Revision, ev.Type)
	}
	c := e.Change()
	a := accounts[id]
	if a == nil {
		a = &accountRow{id: id}
		accounts[id] = a
	}
	a.revision = int64(ev.Revision)
	a.updatedAt = ev.Meta.At
	if c.Opened {
		if err := a.open(c, ev); err != nil {
			return err
		}
	}
	if c.Balance.Changed {
		a.balance, a.hasBalance = c.Balance.Value, true
	}
	if c.Held.Changed {
		a.held, a.hasHeld = c.Held.Value, true
	}
	if c.Status != "" {
		a.status = c.Status
	}
	if c.Hold.ID != "" {
		applyHoldChange(holdRowOf(holds, id, c.Hold.ID, ev), c.Hold, ev)
	}
	return nil
}

// applyHoldChange folds what an event changes of a hold into the hold's row.
func applyHoldChange(h *holdRow, c domain.HoldChange, ev *Event) {
	h.status = string(c.Status)
	switch c.Status {
	case domain.HoldStatusActive: // placed
		h.placed, h.amount, h.currency, h.key, h.placedAt, h.expiresAt = true, c.Amount, c.Currency, ev.Meta.Key, ev.Meta.At, c.ExpiresAt
	case domain.HoldStatusCaptured:
		h.captured = c.Amount
	}
}

// open records an account's opening: its currency, overdraft limit and
// metadata as the read models hold it ({} when it has none; ReadModelMetadata).
func (a *accountRow) open(c domain.AccountChange, ev *Event) error {
	md := "{}" // none: one string for every such row (a fresh build holds them all)
	if c.Metadata != nil {
		b, err := json.Marshal(ReadModelMetadata(c.Metadata))
		if err != nil {
			return err
		}
		md = string(b)
	}
	a.opened, a.currency, a.overdraft, a.metadata, a.openedAt = true, c.Currency, c.OverdraftLimit, md, ev.Meta.At
	return nil
}

// holdRowOf returns the row of hold holdID of account id, advanced to ev.
func holdRowOf(holds map[[2]string]*holdRow, id, holdID string, ev *Event) *holdRow {
	k := [2]string{id, holdID}
	h := holds[k]
	if h == nil {
		h = &holdRow{account: id, hold: holdID}
		holds[k] = h
	}
	h.revision, h.updatedAt = int64(ev.Revision), ev.Meta.At
	return h
}

// accountColumns are an accounts row's columns, in the order its writes give
// them (the upsert's insert, the held rows' COPY: writeHeldAccounts).
var accountColumns = []string{"account_id", "currency", "overdraft_limit", "metadata", "status", "balance", "held", "revision", "opened_at", "updated_at"}

func writeAccounts(ctx context.Context, tx pgx.Tx, gen int, rows map[string]*accountRow) error {
	ids := make([]string, 0, len(rows))
	for id := range rows {
		ids = append(ids, id)
	}
	sort.Strings(ids) // one lock order for every writer
	n := len(ids)
	var (
		opened, hasBal, hasHeld       = make([]bool, n), make([]bool, n), make([]bool, n)
		currency, metadata, status    = make([]string, n), make([]string, n), make([]string, n)
		overdraft, balance, held, rev = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		openedAt, updatedAt           = make([]time.Time, n), make([]time.Time, n)
	)
	for i, id := range ids {
		a := rows[id]
		opened[i], status[i], hasBal[i], hasHeld[i] = a.opened, string(a.status), a.hasBalance, a.hasHeld
		currency[i], metadata[i], overdraft[i] = a.currency, a.metadata, a.overdraft
		balance[i], held[i], rev[i] = a.balance, a.held, a.revision
		openedAt[i], updatedAt[i] = a.openedAt, a.updatedAt
		if metadata[i] == "" {
			metadata[i] = "{}"
		}
	}
	t := Table("accounts", gen)
	sql := fmt.Sprintf(`WITH u AS (
	SELECT * FROM unnest($1::text[], $2::bool[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::bool[],
		$8::bigint[], $9::bool[], $10::text[], $11::bigint[], $12::timestamptz[], $13::timestamptz[])
		AS u(account_id, opened, currency, overdraft_limit, metadata, balance, has_balance, held, has_held, status, revision, opened_at, updated_at)
), ins AS (
	INSERT INTO %[1]s AS a (%[2]s)
	SELECT account_id, currency, overdraft_limit, metadata::jsonb, COALESCE(NULLIF(status, ''), 'open'),
		balance, held, revision, opened_at, updated_at
	FROM u WHERE opened
	ON CONFLICT (account_id) DO UPDATE SET status = excluded.status, balance = excluded.balance, held = excluded.held,
		revision = excluded.revision, updated_at = excluded.updated_at
	WHERE a.revision < excluded.revision
)
UPDATE %[1]s AS a SET
	balance = CASE WHEN u.has_balance THEN u.balance ELSE a.balance END,
	held = CASE WHEN u.has_held THEN u.held ELSE a.held END,
	status = COALESCE(NULLIF(u.status, ''), a.status),
	revision = u.revision, updated_at = u.updated_at
FROM u WHERE NOT u.opened AND a.account_id = u.account_id AND a.revision < u.revision`, t, strings.Join(accountColumns, ", "))
	_, err := tx.Exec(ctx, sql, ids, opened, currency, overdraft, metadata, balance, hasBal, held, hasHeld, status, rev, openedAt, updatedAt)
	if err != nil {
		return fmt.Errorf("projections: accounts: %w", err)
	}
	return nil
}

func writeHolds(ctx context.Context, tx pgx.Tx, gen int, rows map[[2]string]*holdRow) error {
	keys := make([][2]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	n := len(keys)
	var (
		account, hold, currency, status, key = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		placed                               = make([]bool, n)
		amount, captured, rev                = make([]int64, n), make([]int64, n), make([]int64, n)
		expires                              = make([]*time.Time, n)
		placedAt, updatedAt                  = make([]time.Time, n), make([]time.Time, n)
	)
	for i, k := range keys {
		h := rows[k]
		account[i], hold[i], currency[i], status[i], key[i] = h.account, h.hold, h.currency, h.status, h.key
		placed[i], amount[i], captured[i], rev[i], expires[i] = h.placed, h.amount, h.captured, h.revision, h.expiresAt
		placedAt[i], updatedAt[i] = h.placedAt, h.updatedAt
	}
	t := Table("holds", gen)
	sql := fmt.Sprintf(`WITH u AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bool[], $4::bigint[], $5::text[], $6::text[], $7::bigint[],
		$8::timestamptz[], $9::text[], $10::bigint[], $11::timestamptz[], $12::timestamptz[])
		AS u(account_id, hold_id, placed, amount, currency, status, captured, expires_at, idempotency_key, revision, placed_at, updated_at)
), ins AS (
	INSERT INTO %[1]s AS h (account_id, hold_id, amount, currency, status, captured, expires_at, idempotency_key, revision, placed_at, updated_at)
	SELECT account_id, hold_id, amount, currency, status, captured, expires_at, idempotency_key, revision, placed_at, updated_at
	FROM u WHERE placed
	ON CONFLICT (account_id, hold_id) DO UPDATE SET status = excluded.status, captured = excluded.captured,
		revision = excluded.revision, updated_at = excluded.updated_at
	WHERE h.revision < excluded.revision
)
UPDATE %[1]s AS h SET status = u.status, captured = u.captured, revision = u.revision, updated_at = u.updated_at
FROM u WHERE NOT u.placed AND h.account_id = u.account_id AND h.hold_id = u.hold_id AND h.revision < u.revision`, t)
	_, err := tx.Exec(ctx, sql, account, hold, placed, amount, currency, status, captured, expires, key, rev, placedAt, updatedAt)
	if err != nil {
		return fmt.Errorf("projections: holds: %w", err)
	}
	return nil
}
