package projections

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
	"github.com/ledgerworks/ledger/internal/platform/pgerr"
)

// Event is one event of "all", decoded once per batch and shared by every
// projection of the batch.
type Event struct {
	eventstore.RecordedEvent
	// Meta is the metadata the projections use: key, command, i, n, at, origin.
	Meta domain.Metadata
	// Payload is the typed domain payload (a pointer, as domain.DecodeEvent
	// returns it), nil when DecodeErr is set.
	Payload   any
	DecodeErr error
	// MetaDecoded: Meta is the event's metadata, decoded (an account,
	// transfer or transaction stream's event); false: Meta is zero.
	MetaDecoded bool
}

// Decode decodes a recorded event. Metadata that does not parse is an error: every
// event the ledger writes has it. A payload of a type this build does not know is
// kept with DecodeErr set; a projection that needs it fails on it. Only account,
// transfer and transaction streams are decoded: the others (key claims, the
// ledger's own bookkeeping) are read by no projection and keep Meta and Payload zero.
func Decode(re eventstore.RecordedEvent) (*Event, error) {
	ev := &Event{}
	if err := ev.decode(re); err != nil {
		return nil, err
	}
	return ev, nil
}

// decode sets ev, a zero Event, to re decoded (Decode).
func (ev *Event) decode(re eventstore.RecordedEvent) error {
	ev.RecordedEvent = re
	if !strings.HasPrefix(re.Stream, domain.AccountStreamPrefix) && !strings.HasPrefix(re.Stream, domain.TransferStreamPrefix) && !domain.IsTransactionStream(re.Stream) {
		return nil
	}
	m, err := domain.DecodeMetadataNoRequest(re.Metadata)
	if err != nil {
		return fmt.Errorf("projections: %s@%d: %w", re.Stream, re.Revision, err)
	}
	ev.Meta, ev.MetaDecoded = m, true
	ev.Payload, ev.DecodeErr = domain.DecodeEvent(re.Type, re.Data)
	return nil
}

// DecodeAll decodes a batch. Its events are one allocation, not one each (a
// rebuild decodes a page of thousands).
func DecodeAll(res []eventstore.RecordedEvent) ([]*Event, error) {
	out, evs := make([]*Event, len(res)), make([]Event, len(res))
	for i, re := range res {
		if err := evs[i].decode(re); err != nil {
			return nil, err
		}
		out[i] = &evs[i]
	}
	return out, nil
}

// AccountID returns the account of an account-stream event, ok false for other streams.
func (e *Event) AccountID() (string, bool) {
	return strings.CutPrefix(e.Stream, domain.AccountStreamPrefix)
}

// Projection is one read model: a name and how a batch of events changes its
// tables of a given generation. Apply is called inside the batch's transaction
// with the events after the projection's checkpoint, in the order of "all"; it
// must be idempotent (rows keyed by event ID, updates guarded by stream revision)
// because a batch may reach it again after a crash of its caller.
type Projection interface {
	Name() string
	Apply(ctx context.Context, tx pgx.Tx, gen int, events []*Event) error
}

// Names of the projections.
const (
	Accounts  = "accounts"
	Entries   = "entries"
	Transfers = "transfers"
	Commands  = "commands"
	Balances  = "balances"
)

// Names lists every projection, in the order their checkpoints are locked.
var Names = []string{Accounts, Balances, Commands, Entries, Transfers}

// ByName returns the projection called name.
func ByName(name string) (Projection, error) {
	switch name {
	case Accounts:
		return accountsProjection{}, nil
	case Entries:
		return entriesProjection{}, nil
	case Transfers:
		return transfersProjection{}, nil
	case Commands:
		return commandsProjection{}, nil
	case Balances:
		return balancesProjection{}, nil
	}
	return nil, fmt.Errorf("projections: unknown projection %q (known: %s)", name, strings.Join(Names, ", "))
}

// Select returns the named projections sorted by name: the one rule of a
// list of projections, for `projector run` and `rebuild` alike and for the
// command line's check before either opens anything. A name of none, or one
// named twice, is refused.
func Select(names []string) ([]Projection, error) {
	names = slices.Sorted(slices.Values(names))
	projs := make([]Projection, 0, len(names))
	for i, n := range names {
		if i > 0 && names[i-1] == n {
			return nil, fmt.Errorf("projections: projection %q named twice", n)
		}
		p, err := ByName(n)
		if err != nil {
			return nil, err
		}
		projs = append(projs, p)
	}
	return projs, nil
}

// Table is the quoted name of a read-model table of a generation, e.g.
// readmodel.accounts_g3.
func Table(base string, gen int) string {
	return pgx.Identifier{"readmodel", fmt.Sprintf("%s_g%d", base, gen)}.Sanitize()
}

// View is the quoted name of the view readers use, e.g. readmodel.accounts.
func View(base string) string { return pgx.Identifier{"readmodel", base}.Sanitize() }

// pgPosition is a position as the two bigint columns that store it.
type pgPosition struct{ commit, prepare int64 }

// posArgs converts a position to the two bigint columns that store it.
func posArgs(p eventstore.Position) (pgPosition, error) {
	if p.Commit > math.MaxInt64 || p.Prepare > math.MaxInt64 {
		return pgPosition{}, fmt.Errorf("projections: position %s does not fit in bigint columns", p)
	}
	return pgPosition{int64(p.Commit), int64(p.Prepare)}, nil
}

func position(commit, prepare int64) eventstore.Position {
	return eventstore.Position{Commit: uint64(commit), Prepare: uint64(prepare)}
}

// genRows are n rows for generation gen of the table base, in columns:
// row(c, i) writes the fields of the i-th to c, one per column, in their
// binary form (pgcopy), after copyOrUpsert has started its tuple.
type genRows struct {
	base    string
	gen     int
	columns []string
	n       int
	row     func(c *pgcopy.Buf, i int) error
}

// copyBufs are the COPY buffers of the projections' writes, kept for the
// next batch: each holds one piece of a COPY's data at a time
// (pgcopy.StreamPieceBytes), not a batch's rows.
var copyBufs = sync.Pool{New: func() any { return new(pgcopy.Buf) }}

// copyOrUpsert writes rows to a generation's table: first with COPY straight
// into it, the fastest way in, inside a savepoint; should a row already be there
// (a unique violation: the batch, or part of it, was applied before), the
// savepoint is rolled back and fallback writes the rows with its conflict rules.
// The rows are written as COPY reads them, a piece at a time (pgcopy.Stream).
// No rows is no write: a COPY of none, no savepoint.
func copyOrUpsert(ctx context.Context, tx pgx.Tx, rows genRows, fallback func() error) error {
	if rows.n == 0 {
		return nil
	}
	c := copyBufs.Get().(*pgcopy.Buf)
	defer copyBufs.Put(c)
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	cols := make([]string, len(rows.columns))
	for i, col := range rows.columns {
		cols[i] = pgx.Identifier{col}.Sanitize()
	}
	sql := fmt.Sprintf("COPY %s (%s) FROM STDIN (FORMAT binary)", Table(rows.base, rows.gen), strings.Join(cols, ", "))
	r := pgcopy.Stream(c, int16(len(rows.columns)), rows.n, rows.row)
	// pgconn's CopyFrom returns on a failed connection without waiting for
	// the goroutine reading r: Close waits for its Read and ends it before c
	// goes back to the pool (defers run in reverse).
	defer r.Close()
	_, err = sp.Conn().PgConn().CopyFrom(ctx, r, sql)
	if err == nil {
		return sp.Commit(ctx)
	}
	if r.Err() != nil { // a row that could not be written: the COPY was abandoned
		return r.Err()
	}
	if !pgerr.Is(err, pgerr.UniqueViolation) {
		return err
	}
	if err := sp.Rollback(ctx); err != nil {
		return err
	}
	return fallback()
}
