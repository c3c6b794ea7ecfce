package projections

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
)

// balancesProjection maintains readmodel.balance_history: one row per event of
// every account stream, with the account as it stood after the event (balance,
// held, status), keyed by (account_id, revision). It answers
// ledger.v1.query.balance: the account as of a revision or a time is one lookup
// (migrations/00004_balance_history.sql).
//
// Events state the balance or the held amount they leave (balance_after,
// held_after); the others leave both as they were (NextBalance, which the
// commands projection folds with too), so a batch starts from each account's last
// row and folds forward. The live projector inserts rows ON CONFLICT DO
// NOTHING: applying a batch again changes nothing. A rebuild's load copies
// them into a generation without its unique keys (migrations 00019, 00031),
// each batch once, in the transaction of its checkpoint, and builds the keys
// after the load: a row loaded twice fails the build and the generation is
// refused.
type balancesProjection struct{}

func (balancesProjection) Name() string { return Balances }

// BalanceRow is one row of the balance history.
type BalanceRow struct {
	AccountID     string
	Revision      int64
	EventID       uuid.UUID
	Type          string
	Currency      string
	Balance, Held int64
	Status        string // open or closed
	At            time.Time
	EffectiveAt   time.Time // domain.EffectiveTime of the event (v1.2 §2.3)
}

// BalanceState is an account's state that the history carries from event to
// event (the part of a BalanceRow that is not the event's own).
type BalanceState struct {
	Currency      string
	Balance, Held int64
	// Status is the account's, "" read as open (rowStatus).
	Status domain.AccountStatus
}

// NextBalance is the state after an account event, from the state before it:
// what the event changes of it (domain.AccountChange).
func NextBalance(s BalanceState, payload any) (BalanceState, error) {
	e, ok := payload.(domain.AccountEvent)
	if !ok {
		return s, fmt.Errorf("event %T does not belong to an account stream", payload)
	}
	c := e.Change()
	if c.Opened {
		s = BalanceState{Currency: c.Currency}
	}
	if c.Balance.Changed {
		s.Balance = c.Balance.Value
	}
	if c.Held.Changed {
		s.Held = c.Held.Value
	}
	if c.Status != "" {
		s.Status = c.Status
	}
	return s, nil
}

// rowStatus is the row's status: the state's, open when it has none.
func (s BalanceState) rowStatus() string {
	if s.Status == "" {
		return string(domain.AccountStatusOpen)
	}
	return string(s.Status)
}

// accountIDs lists the accounts whose streams the events are of, each once.
func accountIDs(events []*Event) []string {
	seen := map[string]bool{}
	var ids []string
	for _, ev := range events {
		if id, ok := ev.AccountID(); ok && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// accountEvents counts the events of account streams: the rows a batch can
// add to the balance history or the statement, which they are made for at
// once (append grows a slice of more than 256 by a quarter: about five times
// its length allocated in all for a rebuild's batch).
func accountEvents(events []*Event) int {
	n := 0
	for _, ev := range events {
		if _, ok := ev.AccountID(); ok {
			n++
		}
	}
	return n
}

func (p balancesProjection) Apply(ctx context.Context, tx pgx.Tx, gen int, events []*Event) error {
	return p.applyWith(ctx, tx, gen, events, nil)
}

// applyWith is Apply, the accounts' last rows recalled from memo where it
// holds them and remembered in it.
func (balancesProjection) applyWith(ctx context.Context, tx pgx.Tx, gen int, events []*Event, memo *accountMemo) error {
	ids := accountIDs(events)
	if len(ids) == 0 {
		return nil
	}
	lb, err := lastBalances(ctx, tx, gen, ids, memo)
	if err != nil {
		return err
	}
	state, last := lb.state, lb.rev
	rows := make([]BalanceRow, 0, accountEvents(events))
	for _, ev := range events {
		id, ok := ev.AccountID()
		if !ok || int64(ev.Revision) <= last[id] {
			continue // not an account's, or applied before
		}
		if ev.DecodeErr != nil {
			return fmt.Errorf("projections: balances: %s@%d: %w", ev.Stream, ev.Revision, ev.DecodeErr)
		}
		s, err := NextBalance(state[id], ev.Payload)
		if err != nil {
			return fmt.Errorf("projections: balances: %s@%d: %w", ev.Stream, ev.Revision, err)
		}
		state[id], last[id] = s, int64(ev.Revision)
		rows = append(rows, BalanceRow{AccountID: id, Revision: int64(ev.Revision), EventID: ev.ID, Type: ev.Type,
			Currency: s.Currency, Balance: s.Balance, Held: s.Held, Status: s.rowStatus(), At: ev.Meta.At, EffectiveAt: domain.EffectiveTime(ev.Meta)})
	}
	for _, id := range ids {
		memo.remember(id, memoAccount{state: state[id], rev: last[id]})
	}
	if len(rows) == 0 {
		return nil
	}
	// COPY first (the rows after each account's last are new), the upsert
	// should some of them be there already.
	cols := []string{"account_id", "revision", "event_id", "type", "currency", "balance", "held", "status", "at", "effective_at"}
	err = copyOrUpsert(ctx, tx, genRows{base: "balance_history", gen: gen, columns: cols, n: len(rows), row: func(c *pgcopy.Buf, i int) error {
		r := &rows[i]
		c.Text(r.AccountID).Int8(r.Revision).UUID(r.EventID).Text(r.Type).Text(r.Currency).Int8(r.Balance).Int8(r.Held).Text(r.Status).Timestamptz(r.At).Timestamptz(r.EffectiveAt)
		return nil
	}}, func() error { return insertBalanceRows(ctx, tx, gen, rows) })
	if err != nil {
		return fmt.Errorf("projections: balances: %w", err)
	}
	return nil
}

// insertBalanceRows writes rows to generation gen's balance history, those
// already there left as they are.
func insertBalanceRows(ctx context.Context, tx pgx.Tx, gen int, rows []BalanceRow) error {
	n := len(rows)
	var (
		accounts, types, currencies, statuses = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		revs, balances, helds                 = make([]int64, n), make([]int64, n), make([]int64, n)
		evIDs                                 = make([]uuid.UUID, n)
		ats, effective                        = make([]time.Time, n), make([]time.Time, n)
	)
	for i, r := range rows {
		accounts[i], revs[i], evIDs[i], types[i], currencies[i] = r.AccountID, r.Revision, r.EventID, r.Type, r.Currency
		balances[i], helds[i], statuses[i], ats[i], effective[i] = r.Balance, r.Held, r.Status, r.At, r.EffectiveAt
	}
	sql := fmt.Sprintf(`INSERT INTO %s (account_id, revision, event_id, type, currency, balance, held, status, at, effective_at)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::uuid[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::text[], $9::timestamptz[], $10::timestamptz[])
ON CONFLICT DO NOTHING`, Table("balance_history", gen))
	_, err := tx.Exec(ctx, sql, accounts, revs, evIDs, types, currencies, balances, helds, statuses, ats, effective)
	return err
}

// lastBalances reads the last row of each account: its state and revision (-1
// and the zero state when it has none). Each account's row is one descent of
// the (account_id, revision) key, LIMIT 1 in a lateral join: a DISTINCT ON
// over account_id = ANY($1) reads every row of those accounts (PostgreSQL has
// no skip scan), so a batch's cost grew with its accounts' histories. Those
// memo holds are not read.
func lastBalances(ctx context.Context, tx pgx.Tx, gen int, ids []string, memo *accountMemo) (lastRows, error) {
	state := make(map[string]BalanceState, len(ids))
	last := make(map[string]int64, len(ids))
	ids = memo.recall(ids, func(id string, a memoAccount) { state[id], last[id] = a.state, a.rev })
	for _, id := range ids {
		last[id] = -1
	}
	if len(ids) == 0 {
		return lastRows{state: state, rev: last}, nil
	}
	if err := ensureReadBackKey(ctx, tx, gen, memo); err != nil {
		return lastRows{}, err
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT a.id, h.revision, h.currency, h.balance, h.held, h.status
		FROM unnest($1::text[]) AS a(id)
		CROSS JOIN LATERAL (SELECT revision, currency, balance, held, status FROM %s
			WHERE account_id = a.id ORDER BY revision DESC LIMIT 1) h`, Table("balance_history", gen)), ids)
	if err != nil {
		return lastRows{}, fmt.Errorf("projections: balances: %w", err)
	}
	var (
		id, status string
		rev        int64
		s          BalanceState
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &rev, &s.Currency, &s.Balance, &s.Held, &status}, func() error {
		s.Status = domain.AccountStatus(status)
		state[id], last[id] = s, rev
		return nil
	})
	if err != nil {
		return lastRows{}, fmt.Errorf("projections: balances: %w", err)
	}
	return lastRows{state: state, rev: last}, nil
}

// ensureReadBackKey builds, in tx, the key lastBalances reads by
// (balance_history's primary key) when the memo's generation lacks it: a
// rebuild loads a generation without it (migration 00031) while its
// builder's memo holds every account; a resumed build, or one whose memo
// reached its bound, builds it before its first read-back. Once per memo
// (a batch that fails fails the rebuild, and its memo with it); a nil memo
// (the live runner, the switch's catch-up) reads a generation whose key is
// there.
func ensureReadBackKey(ctx context.Context, tx pgx.Tx, gen int, memo *accountMemo) error {
	if memo == nil || memo.keyed {
		return nil
	}
	if err := setIndexMemory(ctx, tx, memo.indexMemMiB); err != nil {
		return fmt.Errorf("projections: balances: the read-back key of generation %d: %w", gen, err)
	}
	if _, err := tx.Exec(ctx, `SELECT readmodel.create_read_back_keys($1, $2)`, Balances, gen); err != nil {
		return fmt.Errorf("projections: balances: the read-back key of generation %d: %w", gen, err)
	}
	memo.keyed = true
	return nil
}

// lastRows are accounts' last balance-history rows: by account, its state
// and its revision (-1 for an account with none).
type lastRows struct {
	state map[string]BalanceState
	rev   map[string]int64
}
