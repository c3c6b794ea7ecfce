package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
)

// Store is what the projector needs of an event store.
type Store interface {
	eventstore.AllReader
	// Head is the position of the last event of "all" a reader can see now.
	Head(ctx context.Context) (eventstore.Position, error)
}

// Options configure a Runner. Zero values take the defaults.
type Options struct {
	// Projections names the projections to run (default: all of Names).
	Projections []string
	// BatchSize bounds the events read and applied per transaction (default 2000).
	BatchSize int
	// PollInterval is how long a caught-up runner waits before reading again
	// (default 50ms).
	PollInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failure (database or store
	// unreachable): it doubles from MinBackoff up to MaxBackoff, with jitter, and
	// resets after a success (defaults 100ms and 5s).
	MinBackoff, MaxBackoff time.Duration
	// Hook, when set, runs in every batch's transaction before the commit (a failpoint).
	Hook   Hook
	Logger *slog.Logger
	// Metrics, when set, receives the runner's progress (see NewMetrics).
	Metrics *Metrics
}

func (o *Options) defaults() {
	if len(o.Projections) == 0 {
		o.Projections = Names
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 2000
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 50 * time.Millisecond
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = 5 * time.Second
		if o.MaxBackoff < o.MinBackoff {
			o.MaxBackoff = o.MinBackoff
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Runner keeps the live generation of each of its projections up to date with
// "all". Several runners of the same projections may run at once (on several
// machines): the checkpoint compare-and-set lets exactly one apply each batch.
type Runner struct {
	pool  *pgxpool.Pool
	store Store
	opts  Options
	projs []Projection

	mu     sync.Mutex
	slots  []*slot // nil: reload from the database
	lagSec float64
	head   eventstore.Position
}

// NewRunner returns a runner of opts.Projections over the read-model database pool
// and the event store. The read-model migrations must have been applied.
func NewRunner(pool *pgxpool.Pool, store Store, opts Options) (*Runner, error) {
	opts.defaults()
	r := &Runner{pool: pool, store: store, opts: opts}
	names := append([]string(nil), opts.Projections...)
	sort.Strings(names)
	for i, n := range names {
		if i > 0 && names[i-1] == n {
			return nil, fmt.Errorf("projections: projection %q named twice", n)
		}
		p, err := ByName(n)
		if err != nil {
			return nil, err
		}
		r.projs = append(r.projs, p)
	}
	return r, nil
}

// Run applies batches until ctx ends, then returns nil. Failures (the database or
// the store restarting) are logged and retried with bounded back-off; an event
// that a projection cannot apply (a broken invariant) is retried the same way
// and logged as an error, so that an operator sees it and the runner never skips it.
func (r *Runner) Run(ctx context.Context) error {
	backoff := time.Duration(0)
	for {
		n, err := r.Step(ctx)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, ErrCheckpointMoved):
			r.opts.Metrics.conflict()
			r.opts.Logger.Debug("projector: checkpoint moved, reloading")
			if !sleep(ctx, jitter(r.opts.MinBackoff/4)) {
				return nil
			}
			continue
		case err != nil:
			r.opts.Metrics.failure()
			backoff = min(max(backoff*2, r.opts.MinBackoff), r.opts.MaxBackoff)
			r.opts.Logger.Warn("projector: batch failed, retrying", "err", err, "backoff", backoff)
			if !sleep(ctx, jitter(backoff)) {
				return nil
			}
			continue
		}
		backoff = 0
		if n < r.opts.BatchSize {
			if !sleep(ctx, r.opts.PollInterval) {
				return nil
			}
		}
	}
}

// Step reads and applies one batch; it returns the number of events read.
// ErrCheckpointMoved means another runner (or a switch) got there first.
func (r *Runner) Step(ctx context.Context) (int, error) {
	r.mu.Lock()
	slots := r.slots
	r.mu.Unlock()
	if slots == nil {
		var err error
		if slots, err = loadSlots(ctx, r.pool, r.projs, "live", 0); err != nil {
			return 0, err
		}
		r.setSlots(slots)
	}
	from := minPos(slots)
	recs, err := r.store.ReadAll(ctx, from, r.opts.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("projections: read all after %s: %w", from, err)
	}
	if len(recs) == 0 {
		r.caughtUp(ctx, slots)
		return 0, nil
	}
	events, err := DecodeAll(recs)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := applyBatch(ctx, r.pool, slots, events, r.opts.Hook); err != nil {
		r.setSlots(nil) // whatever happened, trust only the database
		return 0, err
	}
	last := recs[len(recs)-1]
	lag := 0.0
	if len(recs) == r.opts.BatchSize {
		lag = time.Since(last.Created).Seconds()
	}
	r.mu.Lock()
	r.lagSec = max(lag, 0)
	r.mu.Unlock()
	r.opts.Metrics.batch(slots, len(recs), time.Since(start), r.lagSec)
	return len(recs), nil
}

func (r *Runner) setSlots(s []*slot) {
	r.mu.Lock()
	r.slots = s
	r.mu.Unlock()
}

// caughtUp records that the runner has read everything visible.
func (r *Runner) caughtUp(ctx context.Context, slots []*slot) {
	r.mu.Lock()
	r.lagSec = 0
	r.mu.Unlock()
	r.opts.Metrics.batch(slots, 0, 0, 0)
}

// LagSeconds is the age of the oldest event the runner had not applied when it
// last read, 0 when it was caught up.
func (r *Runner) LagSeconds() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lagSec
}

// Positions returns the checkpoint of each projection as this runner last
// committed or loaded it (empty before its first step).
func (r *Runner) Positions() map[string]eventstore.Position {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]eventstore.Position{}
	for _, s := range r.slots {
		out[s.proj.Name()] = s.pos
	}
	return out
}

// loadSlots reads the checkpoints of projs in the given state ("live", or
// "building" for generation gen).
func loadSlots(ctx context.Context, pool *pgxpool.Pool, projs []Projection, state string, gen int) ([]*slot, error) {
	out := make([]*slot, 0, len(projs))
	for _, p := range projs {
		q := `SELECT generation, commit_position, prepare_position, events FROM readmodel.checkpoints WHERE name = $1 AND state = $2`
		args := []any{p.Name(), state}
		if state != "live" {
			q += ` AND generation = $3`
			args = append(args, gen)
		}
		s := &slot{proj: p}
		var c, pr int64
		if err := pool.QueryRow(ctx, q, args...).Scan(&s.gen, &c, &pr, &s.events); err != nil {
			return nil, fmt.Errorf("projections: checkpoint of %s (%s): %w", p.Name(), state, err)
		}
		s.pos = position(c, pr)
		out = append(out, s)
	}
	return out, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jitter returns a duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
