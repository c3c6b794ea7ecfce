package projections

import (
	"context"
	"fmt"
	"time"

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

// ReadStatus reports every generation of every projection, live and building,
// with its lag behind the store's head.
func ReadStatus(ctx context.Context, pool *pgxpool.Pool, store Store) ([]Status, error) {
	// The events publisher's checkpoint (publisher.go) is shown beside the
	// projections', as "publisher:events".
	out, err := Checkpoints.statusRows(ctx, pool)
	if err != nil {
		return nil, err
	}
	head, err := store.Head(ctx)
	if err != nil {
		return nil, fmt.Errorf("projections: status: head: %w", err)
	}
	lags := map[eventstore.Position]lag{}
	for i := range out {
		out[i].Head = head.String()
		l, ok := lags[out[i].Checkpoint]
		if !ok {
			l, err = countAfter(ctx, store, out[i].Checkpoint)
			if err != nil {
				return nil, err
			}
			lags[out[i].Checkpoint] = l
		}
		out[i].LagEvents, out[i].LagCapped, out[i].LagSeconds = l.n, l.capped, l.secs
	}
	return out, nil
}

// lag is how far behind a checkpoint is: n events after it (capped: at
// least n, counting stopped at LagCap), the first of them secs old.
type lag struct {
	n      int64
	capped bool
	secs   float64
}

// countAfter counts the events after p, up to LagCap, and the age of the first.
func countAfter(ctx context.Context, store Store, p eventstore.Position) (lag, error) {
	const page = 10_000
	var l lag
	for l.n < LagCap {
		recs, err := store.ReadAll(ctx, p, page)
		if err != nil {
			return lag{}, fmt.Errorf("projections: status: %w", err)
		}
		if l.n == 0 && len(recs) > 0 {
			l.secs = max(time.Since(recs[0].Created).Seconds(), 0)
		}
		l.n += int64(len(recs))
		if len(recs) < page {
			return l, nil
		}
		p = recs[len(recs)-1].Position
	}
	l.capped = true
	return l, nil
}
