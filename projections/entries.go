package projections

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
)

// entriesProjection maintains readmodel.entries, the statement: one row per money
// event of an account (Credited, Debited, HoldCaptured), keyed by event ID, with
// the signed amount and the balance after it.
type entriesProjection struct{}

func (entriesProjection) Name() string { return Entries }

// Entry is one statement row as the entries projection derives it from an event.
type Entry struct {
	EventID        uuid.UUID
	AccountID      string
	Revision       int64
	Type           string
	Reason         string
	Ref            string
	Amount         int64 // signed: credits positive, debits negative
	Currency       string
	BalanceAfter   int64
	IdempotencyKey string
	At             time.Time
	Metadata       map[string]string // the client's (v1.1); never nil
	// EffectiveAt is when the money moved in the world (v1.2 §2.3):
	// domain.EffectiveTime of the event.
	EffectiveAt time.Time
}

// EntryOf returns the statement row of a money event, ok false for other events.
func EntryOf(ev *Event) (Entry, bool) {
	id, ok := ev.AccountID()
	if !ok {
		return Entry{}, false
	}
	e := Entry{EventID: ev.ID, AccountID: id, Revision: int64(ev.Revision), Type: ev.Type, IdempotencyKey: ev.Meta.Key, At: ev.Meta.At, EffectiveAt: domain.EffectiveTime(ev.Meta)}
	switch p := ev.Payload.(type) {
	case *domain.Credited:
		e.Reason, e.Ref, e.Amount, e.Currency, e.BalanceAfter, e.Metadata = p.Reason, p.Ref, p.Amount, p.Currency, p.BalanceAfter, p.Metadata
	case *domain.Debited:
		e.Reason, e.Ref, e.Amount, e.Currency, e.BalanceAfter, e.Metadata = p.Reason, p.Ref, -p.Amount, p.Currency, p.BalanceAfter, p.Metadata
	case *domain.HoldCaptured:
		e.Reason, e.Ref, e.Amount, e.Currency, e.BalanceAfter, e.Metadata = "hold_capture", p.HoldID, -p.Amount, p.Currency, p.BalanceAfter, p.Metadata
	default:
		return Entry{}, false
	}
	if e.Metadata == nil {
		e.Metadata = map[string]string{}
	}
	return e, true
}

// emptyObject is the JSON of an empty map, as encoding/json writes it.
var emptyObject = []byte("{}")

// entryMetadata is an entry's metadata as its jsonb column takes it: the
// JSON encoding/json writes of it (as pgx encoded the map) as the read models
// hold it (ReadModelMetadata), without a call for the usual empty one.
func entryMetadata(m map[string]string) ([]byte, error) {
	if len(m) == 0 {
		return emptyObject, nil
	}
	return json.Marshal(ReadModelMetadata(m))
}

func (entriesProjection) Apply(ctx context.Context, tx pgx.Tx, gen int, events []*Event) error {
	rows := make([]Entry, 0, accountEvents(events))
	for _, ev := range events {
		if _, ok := ev.AccountID(); ok && ev.DecodeErr != nil {
			return fmt.Errorf("projections: entries: %s@%d: %w", ev.Stream, ev.Revision, ev.DecodeErr)
		}
		if e, ok := EntryOf(ev); ok {
			rows = append(rows, e)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	cols := []string{"event_id", "account_id", "revision", "type", "reason", "ref", "amount", "currency", "balance_after", "idempotency_key", "at", "metadata", "effective_at"}
	err := copyOrUpsert(ctx, tx, genRows{base: "entries", gen: gen, columns: cols, n: len(rows), row: func(c *pgcopy.Buf, i int) error {
		e := &rows[i]
		md, err := entryMetadata(e.Metadata)
		if err != nil {
			return err
		}
		c.UUID(e.EventID).Text(e.AccountID).Int8(e.Revision).Text(e.Type).Text(e.Reason).Text(e.Ref).Int8(e.Amount).Text(e.Currency).Int8(e.BalanceAfter).Text(e.IdempotencyKey).Timestamptz(e.At).JSONB(md).Timestamptz(e.EffectiveAt)
		return nil
	}}, func() error {
		n := len(rows)
		var (
			ids                                           = make([]uuid.UUID, n)
			accounts, types, reasons, refs, currency, key = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			revs, amounts, balances                       = make([]int64, n), make([]int64, n), make([]int64, n)
			ats, effective                                = make([]time.Time, n), make([]time.Time, n)
			metadata                                      = make([]string, n)
		)
		for i, e := range rows {
			ids[i], accounts[i], revs[i], types[i], reasons[i], refs[i] = e.EventID, e.AccountID, e.Revision, e.Type, e.Reason, e.Ref
			amounts[i], currency[i], balances[i], key[i], ats[i], effective[i] = e.Amount, e.Currency, e.BalanceAfter, e.IdempotencyKey, e.At, e.EffectiveAt
			md, err := entryMetadata(e.Metadata)
			if err != nil {
				return err
			}
			metadata[i] = string(md)
		}
		sql := fmt.Sprintf(`INSERT INTO %s (event_id, account_id, revision, type, reason, ref, amount, currency, balance_after, idempotency_key, at, metadata, effective_at)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::text[], $9::bigint[], $10::text[], $11::timestamptz[], $12::jsonb[], $13::timestamptz[])
ON CONFLICT (event_id) DO NOTHING`, Table("entries", gen))
		_, err := tx.Exec(ctx, sql, ids, accounts, revs, types, reasons, refs, amounts, currency, balances, key, ats, metadata, effective)
		return err
	})
	if err != nil {
		return fmt.Errorf("projections: entries: %w", err)
	}
	return nil
}
