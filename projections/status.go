package projections

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
)

// Status is one generation of a projection as `projector status` shows it.
type Status struct {
	Projection string              `json:"projection"`
	Generation int                 `json:"generation"`
	State      string              `json:"state"` // live or building
	Checkpoint eventstore.Position `json:"-"`
	Position   string              `json:"checkpoint"`
	Events     int64               `json:"events"` // consumed by this generation
	UpdatedAt  time.Time           `json:"updated_at"`
	Head       string              `json:"head"`
	// LagEvents counts the events of "all" after the checkpoint, up to LagCap
	// (LagCapped then says there are more).
	LagEvents int64 `json:"lag_events"`
	LagCapped bool  `json:"lag_capped,omitempty"`
	// LagSeconds is the age of the first event after the checkpoint (0: caught up).
	LagSeconds float64 `json:"lag_seconds"`
}

// LagCap bounds the events ReadStatus counts behind a checkpoint.
const LagCap = 100_000

// LiveCheckpoint is the live generation of a projection and its checkpoint.
type LiveCheckpoint struct {
	Name       string
	Generation int
	Position   eventstore.Position
}

// Querier is what reading the read models needs: a pool, a connection or a
// transaction (one snapshot for several reads).
type Querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// LiveCheckpoints returns the live generation of every projection and its
// checkpoint, ordered by name: the one reading of the checkpoint table for
// every reader outside this package (the audit, the chaos checker, status).
func LiveCheckpoints(ctx context.Context, q Querier) ([]LiveCheckpoint, error) {
	rows, err := q.Query(ctx, `SELECT name, generation, commit_position, prepare_position FROM readmodel.checkpoints WHERE state = 'live' ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("projections: checkpoints: %w", err)
	}
	var (
		out  []LiveCheckpoint
		l    LiveCheckpoint
		c, p int64
	)
	_, err = pgx.ForEachRow(rows, []any{&l.Name, &l.Generation, &c, &p}, func() error {
		l.Position = position(c, p)
		out = append(out, l)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projections: checkpoints: %w", err)
	}
	return out, nil
}

// Checkpoints returns the live checkpoint of every projection, by name.
func Checkpoints(ctx context.Context, q Querier) (map[string]eventstore.Position, error) {
	live, err := LiveCheckpoints(ctx, q)
	if err != nil {
		return nil, err
	}
	out := make(map[string]eventstore.Position, len(live))
	for _, l := range live {
		out[l.Name] = l.Position
	}
	return out, nil
}

// ReadStatus reports every generation of every projection, live and building,
// with its lag behind the store's head.
func ReadStatus(ctx context.Context, pool *pgxpool.Pool, store Store) ([]Status, error) {
	// The events publisher's checkpoint (publisher.go) is shown beside the
	// projections', as "publisher:events".
	rows, err := pool.Query(ctx, `SELECT name, generation, state, commit_position, prepare_position, events, updated_at
		FROM readmodel.checkpoints
		UNION ALL
		SELECT 'publisher:' || name, 0, 'live', commit_position, prepare_position, events, updated_at
		FROM readmodel.publisher_checkpoints
		ORDER BY 1, 3 DESC, 2`)
	if err != nil {
		return nil, fmt.Errorf("projections: status: %w", err)
	}
	var out []Status
	var (
		s    Status
		c, p int64
	)
	_, err = pgx.ForEachRow(rows, []any{&s.Projection, &s.Generation, &s.State, &c, &p, &s.Events, &s.UpdatedAt}, func() error {
		s.Checkpoint = position(c, p)
		s.Position = s.Checkpoint.String()
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projections: status: %w", err)
	}
	head, err := store.Head(ctx)
	if err != nil {
		return nil, fmt.Errorf("projections: status: head: %w", err)
	}
	type lag struct {
		n      int64
		capped bool
		secs   float64
	}
	lags := map[eventstore.Position]lag{}
	for i := range out {
		out[i].Head = head.String()
		l, ok := lags[out[i].Checkpoint]
		if !ok {
			l.n, l.capped, l.secs, err = countAfter(ctx, store, out[i].Checkpoint)
			if err != nil {
				return nil, err
			}
			lags[out[i].Checkpoint] = l
		}
		out[i].LagEvents, out[i].LagCapped, out[i].LagSeconds = l.n, l.capped, l.secs
	}
	return out, nil
}

// countAfter counts the events after p, up to LagCap, and the age of the first.
func countAfter(ctx context.Context, store Store, p eventstore.Position) (n int64, capped bool, secs float64, err error) {
	const page = 10_000
	for n < LagCap {
		recs, err := store.ReadAll(ctx, p, page)
		if err != nil {
			return 0, false, 0, fmt.Errorf("projections: status: %w", err)
		}
		if n == 0 && len(recs) > 0 {
			secs = max(time.Since(recs[0].Created).Seconds(), 0)
		}
		n += int64(len(recs))
		if len(recs) < page {
			return n, false, secs, nil
		}
		p = recs[len(recs)-1].Position
	}
	return n, true, secs, nil
}
