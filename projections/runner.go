package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
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
	// BatchSize bounds the events read and applied per transaction (default 5000).
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
		o.BatchSize = 5000
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

	// slots and prefetch belong to the goroutine that calls Step.
	slots    []*slot // nil: reload from the database
	prefetch *prefetched

	mu        sync.Mutex
	lagSec    float64
	positions map[string]eventstore.Position
}

// NewRunner returns a runner of opts.Projections over the read-model database pool
// and the event store. The read-model migrations must have been applied.
func NewRunner(pool *pgxpool.Pool, store Store, opts Options) (*Runner, error) {
	opts.defaults()
	r := &Runner{pool: pool, store: store, opts: opts}
	projs, err := Select(opts.Projections)
	if err != nil {
		return nil, err
	}
	r.projs = projs
	return r, nil
}

// Run applies batches until ctx ends, then returns nil. Step and Run must not be
// called at once. Failures (the database or
// the store restarting) are logged and retried with bounded back-off; an event
// that a projection cannot apply (a broken invariant) is retried the same way
// and logged as an error, so that an operator sees it and the runner never skips it.
func (r *Runner) Run(ctx context.Context) error {
	defer func() { // the read ahead ends with ctx
		if r.prefetch != nil {
			<-r.prefetch.done
			r.prefetch = nil
		}
	}()
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
//
// While a full batch is applied, the next one is read and decoded (it starts
// where this one ends; it is dropped should the checkpoints turn out elsewhere).
func (r *Runner) Step(ctx context.Context) (int, error) {
	slots := r.slots
	if slots == nil {
		var err error
		if slots, err = loadSlots(ctx, r.pool, r.projs, stateLive, 0); err != nil {
			return 0, err
		}
		r.slots = slots
	}
	from := minPos(slots)
	var (
		events []*Event
		err    error
	)
	if p := r.prefetch; p != nil {
		<-p.done
		r.prefetch = nil
		if p.from == from {
			events, err = p.events, p.err
		}
	}
	if events == nil && err == nil {
		events, err = readBatch(ctx, r.store, from, r.opts.BatchSize)
	}
	if err != nil {
		return 0, err
	}
	if len(events) == 0 {
		r.record(slots, 0, 0, 0)
		return 0, nil
	}
	if len(events) == r.opts.BatchSize {
		r.prefetch = startPrefetch(ctx, r.store, events[len(events)-1].Position, r.opts.BatchSize)
	}
	before := make([]int64, len(slots))
	for i, s := range slots {
		before[i] = s.events
	}
	start := time.Now()
	if err := applyBatch(ctx, r.pool, slots, events, r.opts.Hook); err != nil {
		r.slots = nil // whatever happened, trust only the database
		return 0, err
	}
	for i, s := range slots {
		r.opts.Metrics.applied(s.proj.Name(), int(s.events-before[i]))
	}
	lag := 0.0
	if len(events) == r.opts.BatchSize {
		lag = max(time.Since(events[len(events)-1].Created).Seconds(), 0)
	}
	r.record(slots, len(events), time.Since(start), lag)
	return len(events), nil
}

// prefetched is a batch read ahead.
type prefetched struct {
	from   eventstore.Position
	events []*Event
	err    error
	done   chan struct{}
}

func startPrefetch(ctx context.Context, store Store, from eventstore.Position, n int) *prefetched {
	p := &prefetched{from: from, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.events, p.err = readBatch(ctx, store, from, n)
	}()
	return p
}

// readBatch reads and decodes up to n events after from.
func readBatch(ctx context.Context, store Store, from eventstore.Position, n int) ([]*Event, error) {
	recs, err := store.ReadAll(ctx, from, n)
	if err != nil {
		return nil, fmt.Errorf("projections: read all after %s: %w", from, err)
	}
	return DecodeAll(recs)
}

// record publishes the runner's progress (Positions, LagSeconds, metrics).
func (r *Runner) record(slots []*slot, n int, d time.Duration, lag float64) {
	pos := make(map[string]eventstore.Position, len(slots))
	for _, s := range slots {
		pos[s.proj.Name()] = s.pos
	}
	r.mu.Lock()
	r.lagSec, r.positions = lag, pos
	r.mu.Unlock()
	r.opts.Metrics.batch(slots, n, d, lag)
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
	out := make(map[string]eventstore.Position, len(r.positions))
	for k, v := range r.positions {
		out[k] = v
	}
	return out
}

// loadSlots reads the checkpoints of projs in the given state (stateLive, or
// stateBuilding for generation gen).
func loadSlots(ctx context.Context, pool *pgxpool.Pool, projs []Projection, state string, gen int) ([]*slot, error) {
	out := make([]*slot, 0, len(projs))
	for _, p := range projs {
		s, err := Checkpoints.load(ctx, pool, p, state, gen)
		if err != nil {
			return nil, err
		}
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

// NewPool opens a pool on the read-model database sized for a runner (which
// writes its projections in parallel) and the queries beside it: at least 16
// connections unless the URL sets pool_max_conns.
func NewPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return newPool(ctx, url, false)
}

// NewAuditPool is NewPool for an audit (`ledger audit`, the bench's): its
// sessions run without PostgreSQL's JIT compilation (jit = off, as every
// session's setting, pgx's RuntimeParams) unless the URL sets jit. An audit's
// statements read the read models and its sets whole, so some plans cost
// past jit_above_cost and PostgreSQL compiled them before running them: an
// incremental audit's few statements were compiled anew on each run, and
// without JIT it took 0.77x the time and 0.80x PostgreSQL's CPU (the last 1%
// of 1,000,000 events, a quiet machine; a full audit's and a rebuild's showed
// no difference: BENCHMARKS.md, "an audit's sessions without JIT"). The
// projector's pool keeps the server's setting.
func NewAuditPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return newPool(ctx, url, true)
}

func newPool(ctx context.Context, url string, noJIT bool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("projections: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") && cfg.MaxConns < 16 {
		cfg.MaxConns = 16
	}
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; noJIT && !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("projections: %w", err)
	}
	return pool, nil
}
