package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/eventstore"
)

// MaxLoadEvents bounds the events of one Load (one COPY, one transaction).
const MaxLoadEvents = 100_000

// Load writes the events of parts, decided elsewhere (a seeding ledger over a
// memory store), straight into the events table with COPY in one
// transaction: far faster than appends, for seeding benchmarks with many new
// streams. Each part's expected revision must be NoStream or Exact (its
// events take the revisions after it, as an append would give them). Nothing
// is checked against the heads beyond the table's constraints: a stream or an
// event ID already there refuses the whole load and nothing is written, so it
// is for streams no one else writes meanwhile, not a way around Append.
func (s *Store) Load(ctx context.Context, parts []eventstore.StreamAppend) error {
	if s.closed() {
		return ErrClosed
	}
	rows, err := loadRows(parts)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"events"}, []string{"stream", "revision", "event_id", "type", "data", "metadata", "subject"}, pgx.CopyFromRows(rows))
		return err
	})
	if err != nil {
		return classify(ctx, "load", err)
	}
	s.notify()
	return nil
}

// loadRows is the COPY rows of parts, in order.
func loadRows(parts []eventstore.StreamAppend) ([][]any, error) {
	var n int
	for _, p := range parts {
		n += len(p.Events)
	}
	if n > MaxLoadEvents {
		return nil, fmt.Errorf("eventstore/postgres: load: %d events, at most %d a load", n, MaxLoadEvents)
	}
	rows := make([][]any, 0, n)
	for _, p := range parts {
		last, ok := p.Expected.LastBefore()
		if !ok {
			return nil, fmt.Errorf("eventstore/postgres: load: stream %q: expected revision %s, want NoStream or Exact", p.Stream, p.Expected)
		}
		if p.Stream == "" {
			return nil, errors.New("eventstore/postgres: load: a part without a stream")
		}
		for i, e := range p.Events {
			var subject any
			if e.Subject != "" {
				subject = e.Subject
			}
			rows = append(rows, []any{p.Stream, last + 1 + int64(i), [16]byte(e.ID), e.Type, e.Data, e.Metadata, subject})
		}
	}
	return rows, nil
}
