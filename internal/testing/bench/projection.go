package bench

import (
	"context"
	"log/slog"
	"time"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/projections"
)

// ProjectionReport is what the projection phase measured.
type ProjectionReport struct {
	Events       int64   `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	CaughtUp     bool    `json:"caught_up"`
	Projections  int     `json:"projections"`
	BatchSize    int     `json:"batch_size"`
	CPU          *CPUUse `json:"cpu,omitempty"`
	ErrorSample  string  `json:"error,omitempty"`
}

// projectAll runs the projector (every projection, the runner's defaults) over the
// ledger's event store (storeURL) into the read models of the database at url,
// from its checkpoints until it has caught up or timeout passes, and measures
// events applied per second.
func projectAll(ctx context.Context, url, storeURL string, timeout time.Duration, components, log *slog.Logger) (*ProjectionReport, error) {
	pool, err := projections.NewPool(ctx, url) // as the projector sizes it
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	store, err := config.OpenEventStore(ctx, storeURL, components)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	opts := projections.Options{Logger: components}
	r, err := projections.NewRunner(pool, store, opts)
	if err != nil {
		return nil, err
	}
	rep := &ProjectionReport{Projections: len(projections.Names)}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	lastLog := start
	for {
		n, err := r.Step(pctx)
		if err != nil {
			if pctx.Err() != nil {
				break
			}
			rep.ErrorSample = err.Error()
			break
		}
		if n == 0 {
			rep.CaughtUp = true
			break
		}
		rep.Events += int64(n)
		if time.Since(lastLog) > 2*time.Second {
			lastLog = time.Now()
			log.Info("bench", "phase", "projection", "events", rep.Events,
				"rate", int(float64(rep.Events)/time.Since(start).Seconds()))
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	if rep.Seconds > 0 {
		rep.EventsPerSec = float64(rep.Events) / rep.Seconds
	}
	return rep, ctx.Err()
}
