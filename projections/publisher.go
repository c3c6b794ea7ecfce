package projections

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/eventstore"
)

// Events out (PROTOCOL.md §4.1, ARCHITECTURE decision 10b). The publisher reads
// "all" in order, as a projector does (the store's ReadAll never skips an event
// whose transaction commits late), and publishes every event to the JetStream
// stream LEDGER_EVENTS with Nats-Msg-Id = the event ID.
//
// No gap, no reorder: each message of a round expects the stream's last sequence
// to be the one before it (Nats-Expected-Last-Sequence), so when one is not
// stored, none after it is either, and the next round starts from the first
// event not stored. The stream is the source of truth for what was published:
// after a failure (and at start) the publisher reads the position of the stream's
// last message and resumes after it, so a crash between the acknowledgements and
// the checkpoint publishes nothing twice. The checkpoint row
// (readmodel.publisher_checkpoints) is advanced after every acknowledged round:
// `projector status` shows it with its lag, and it is where a new or emptied
// stream starts from. A rebuild of the read models never touches it.
//
// One publisher at a time: each holds a PostgreSQL session advisory lock (the
// lease) while it publishes; another one waits and takes over when the holder's
// session ends. Two holding at once (a lease lost while a round was in flight)
// would publish the same messages, which the duplicate window and the expected
// sequences refuse: harmless.

// Events stream layout.
const (
	EventsStream        = "LEDGER_EVENTS"
	EventsSubjectPrefix = "ledger.v1.events."
	// HeaderPosition carries the event's position in "all" on every message.
	HeaderPosition = "Ledger-Position"
)

// EventSubject is the subject of an event: ledger.v1.events.<category>.<type>,
// the category being the stream name before its first '-'.
func EventSubject(stream, typ string) string {
	category, _, _ := strings.Cut(stream, "-")
	return EventsSubjectPrefix + subjectToken(category) + "." + subjectToken(typ)
}

// subjectToken makes s one NATS subject token: no '.', '*', '>' or white space.
func subjectToken(s string) string {
	if s == "" {
		return "_"
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r == '.' || r == '*' || r == '>' || r <= ' ' || r == 0x7f:
			return '_'
		}
		return r
	}, s)
}

// EventMessage is the body of a message of LEDGER_EVENTS.
type EventMessage struct {
	ID             uuid.UUID       `json:"id"`
	Stream         string          `json:"stream"`
	Revision       uint64          `json:"revision"`
	Position       string          `json:"position"`
	Type           string          `json:"type"`
	Data           json.RawMessage `json:"data"`
	IdempotencyKey string          `json:"idempotency_key"`
	At             time.Time       `json:"at"`
}

// PublisherOptions configure a Publisher. Zero values take the defaults.
type PublisherOptions struct {
	// BatchSize bounds the events of one round, all in flight at once (default 1000).
	BatchSize int
	// PollInterval is how long a caught-up publisher waits before reading again
	// (default 50ms); LeaseInterval how often a publisher without the lease tries
	// to take it (default 1s).
	PollInterval, LeaseInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failure (defaults 100ms, 5s).
	MinBackoff, MaxBackoff time.Duration
	// AckTimeout bounds the wait for a message's acknowledgement (default 10s).
	AckTimeout time.Duration
	// MaxAge is how long LEDGER_EVENTS keeps a message (default 30 days; 0 or
	// less keeps them until the stream is full: MaxBytes).
	MaxAge time.Duration
	// MaxBytes bounds the stream (default -1: unbounded); the oldest go first.
	MaxBytes int64
	// Duplicates is the stream's Nats-Msg-Id window (default 2 minutes).
	Duplicates time.Duration
	// Replicas of the stream (default 1; 3 on a JetStream cluster).
	Replicas int
	Logger   *slog.Logger
	// Registry, when set, receives the publisher's metrics.
	Registry prometheus.Registerer
}

func (o *PublisherOptions) defaults() {
	if o.BatchSize <= 0 {
		o.BatchSize = 1000
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 50 * time.Millisecond
	}
	if o.LeaseInterval <= 0 {
		o.LeaseInterval = time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(5*time.Second, o.MinBackoff)
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 10 * time.Second
	}
	if o.MaxAge == 0 {
		o.MaxAge = 30 * 24 * time.Hour
	}
	if o.MaxAge < 0 {
		o.MaxAge = 0
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = -1
	}
	if o.Duplicates <= 0 {
		o.Duplicates = 2 * time.Minute
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// EventsStreamConfig is LEDGER_EVENTS as the publisher declares it: every event
// subject, file storage, limits retention (MaxAge, MaxBytes; the oldest go
// first), the Nats-Msg-Id window.
func EventsStreamConfig(o PublisherOptions) jetstream.StreamConfig {
	o.defaults()
	return jetstream.StreamConfig{
		Name:        EventsStream,
		Description: "Every event of the ledger's event store, in order (PROTOCOL.md §4.1); Nats-Msg-Id is the event ID",
		Subjects:    []string{EventsSubjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      o.MaxAge,
		MaxBytes:    o.MaxBytes,
		Duplicates:  o.Duplicates,
		Replicas:    o.Replicas,
	}
}

// Publisher publishes the event store's events to LEDGER_EVENTS.
type Publisher struct {
	pool    *pgxpool.Pool
	store   Store
	js      jetstream.JetStream
	opts    PublisherOptions
	metrics *publisherMetrics

	// Owned by the goroutine that calls Step.
	lease   *pgxpool.Conn
	stream  jetstream.Stream
	from    eventstore.Position // published up to here
	lastSeq uint64              // the stream's last sequence after what was published
	synced  bool                // from and lastSeq were read from the stream

	mu        sync.Mutex
	lagSec    float64
	published eventstore.Position // from, for other goroutines
}

// NewPublisher returns a publisher over the read-model database (its checkpoint
// and lease), the event store and a NATS connection with JetStream.
func NewPublisher(pool *pgxpool.Pool, store Store, nc *nats.Conn, opts PublisherOptions) (*Publisher, error) {
	opts.defaults()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(opts.BatchSize), jetstream.WithPublishAsyncTimeout(opts.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	p := &Publisher{pool: pool, store: store, js: js, opts: opts}
	if opts.Registry != nil {
		p.metrics = newPublisherMetrics(opts.Registry)
	}
	return p, nil
}

// ErrNoLease means another publisher holds the lease.
var ErrNoLease = errors.New("publisher: another publisher holds the lease")

// Run publishes until ctx ends, then returns nil: it takes the lease (waiting
// while another publisher holds it), then publishes round after round. Failures
// are logged and retried with bounded back-off; the lease is given up and taken
// again when its session fails.
func (p *Publisher) Run(ctx context.Context) error {
	defer p.releaseLease()
	backoff := time.Duration(0)
	for {
		n, err := p.Step(ctx)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, ErrNoLease):
			if !sleep(ctx, jitter(p.opts.LeaseInterval)) {
				return nil
			}
			continue
		case err != nil:
			p.metrics.failure()
			backoff = min(max(backoff*2, p.opts.MinBackoff), p.opts.MaxBackoff)
			p.opts.Logger.Warn("publisher: round failed, retrying", "err", err, "published", n, "backoff", backoff)
			if !sleep(ctx, jitter(backoff)) {
				return nil
			}
			continue
		}
		backoff = 0
		if n < p.opts.BatchSize && !sleep(ctx, p.opts.PollInterval) {
			return nil
		}
	}
}

// Step publishes one round: up to BatchSize events after what is published, all
// in flight at once. It returns how many were acknowledged (and checkpointed);
// ErrNoLease when another publisher holds the lease.
func (p *Publisher) Step(ctx context.Context) (int, error) {
	if err := p.takeLease(ctx); err != nil {
		return 0, err
	}
	if !p.synced {
		if err := p.sync(ctx); err != nil {
			return 0, err
		}
	}
	recs, err := p.store.ReadAll(ctx, p.from, p.opts.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("publisher: read all after %s: %w", p.from, err)
	}
	if len(recs) == 0 {
		p.setLag(0)
		return 0, nil
	}
	n, perr := p.publish(ctx, recs)
	if n > 0 {
		p.from = recs[n-1].Position
		p.lastSeq += uint64(n)
		if err := p.checkpoint(ctx, n); err != nil {
			return n, err
		}
		p.metrics.published(n, p.from)
	}
	lag := 0.0
	if n < len(recs) || len(recs) == p.opts.BatchSize {
		lag = max(time.Since(recs[min(n, len(recs)-1)].Created).Seconds(), 0)
	}
	p.setLag(lag)
	if perr != nil {
		p.synced = false // the stream says where to go on
		return n, perr
	}
	return n, nil
}

// publish sends recs, each expecting the stream's last sequence to be the one
// before it, and returns how many, from the first, the stream stored.
func (p *Publisher) publish(ctx context.Context, recs []eventstore.RecordedEvent) (int, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(recs))
	var sendErr error
	for i, re := range recs {
		msg, err := EventMsg(re)
		if err != nil {
			sendErr = err
			break
		}
		f, err := p.js.PublishMsgAsync(msg, jetstream.WithMsgID(re.ID.String()), jetstream.WithExpectLastSequence(p.lastSeq+uint64(i)))
		if err != nil {
			sendErr = fmt.Errorf("publisher: publish %s@%d: %w", re.Stream, re.Revision, err)
			break
		}
		futures = append(futures, f)
	}
	stored, firstErr := 0, sendErr
	for i, f := range futures { // every future resolves (acknowledged, refused or timed out)
		var err error
		select {
		case ack := <-f.Ok():
			if ack.Duplicate || ack.Sequence != p.lastSeq+uint64(i)+1 {
				err = fmt.Errorf("publisher: %s@%d stored as sequence %d (duplicate %v), want %d", recs[i].Stream, recs[i].Revision, ack.Sequence, ack.Duplicate, p.lastSeq+uint64(i)+1)
			}
		case err = <-f.Err():
			err = fmt.Errorf("publisher: %s@%d: %w", recs[i].Stream, recs[i].Revision, err)
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err == nil && stored == i {
			stored++
		} else if err != nil && firstErr == nil {
			firstErr = err
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	return stored, firstErr
}

// sync declares the stream and reads where the publishing stands: after the
// stream's last message, or the checkpoint when the stream holds nothing later.
func (p *Publisher) sync(ctx context.Context) error {
	if p.stream == nil {
		s, err := p.js.CreateOrUpdateStream(ctx, EventsStreamConfig(p.opts))
		if err != nil {
			return fmt.Errorf("publisher: declare %s: %w", EventsStream, err)
		}
		p.stream = s
	}
	from, err := Checkpoints.Published(ctx, p.lease)
	if err != nil {
		return err
	}
	info, err := p.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("publisher: %s info: %w", EventsStream, err)
	}
	last := info.State.LastSeq
	if last > 0 && info.State.Msgs > 0 {
		msg, err := p.stream.GetMsg(ctx, last)
		if err != nil {
			return fmt.Errorf("publisher: %s last message: %w", EventsStream, err)
		}
		pos, err := eventstore.ParsePosition(msg.Header.Get(HeaderPosition))
		if err != nil {
			return fmt.Errorf("publisher: %s message %d: %s header: %w", EventsStream, last, HeaderPosition, err)
		}
		if pos.Compare(from) > 0 {
			// The stream holds events the checkpoint does not count: a round
			// published them and its checkpoint failed. Record them now, or the
			// checkpoint would stay behind until another event is published
			// (and the status, and whoever waits for it, with it).
			n, err := p.countAfter(ctx, from, pos)
			if err != nil {
				return err
			}
			p.from = pos
			if err := p.checkpoint(ctx, n); err != nil {
				return err
			}
			from = pos
		}
	}
	p.from, p.lastSeq, p.synced = from, last, true
	return nil
}

// countAfter counts the store's events after from, up to and including to.
func (p *Publisher) countAfter(ctx context.Context, from, to eventstore.Position) (int, error) {
	n := 0
	for {
		recs, err := p.store.ReadAll(ctx, from, p.opts.BatchSize)
		if err != nil {
			return 0, fmt.Errorf("publisher: read all after %s: %w", from, err)
		}
		for _, re := range recs {
			if re.Position.Compare(to) > 0 {
				return n, nil
			}
			n++
		}
		if len(recs) < p.opts.BatchSize {
			return n, nil
		}
		from = recs[len(recs)-1].Position
	}
}

// takeLease takes the publisher's session advisory lock on a connection of its
// own, unless it holds it already and the session is alive.
func (p *Publisher) takeLease(ctx context.Context) error {
	if p.lease != nil {
		if p.lease.Conn().IsClosed() {
			p.releaseLease()
		} else {
			return nil
		}
	}
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("publisher: lease: %w", err)
	}
	got, err := Checkpoints.TryLease(ctx, c)
	if err != nil {
		c.Release()
		return fmt.Errorf("publisher: lease: %w", err)
	}
	if !got {
		c.Release()
		return ErrNoLease
	}
	p.lease, p.synced = c, false
	p.opts.Logger.Info("publisher: lease taken: publishing to " + EventsStream)
	return nil
}

// releaseLease ends the lease's session (closing it releases the lock however
// the session stands).
func (p *Publisher) releaseLease() {
	if p.lease == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.lease.Conn().Close(ctx)
	p.lease.Release()
	p.lease = nil
}

// checkpoint records that n more events are published, up to p.from, on the
// lease's session: a session that failed gives up the lease.
func (p *Publisher) checkpoint(ctx context.Context, n int) error {
	if err := Checkpoints.publish(ctx, p.lease, p.from, n); err != nil {
		p.releaseLease()
		return fmt.Errorf("publisher: checkpoint: %w", err)
	}
	return nil
}

// Start runs the publisher in the background until ctx ends or stop is called;
// stop waits for it to give up its lease.
func (p *Publisher) Start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx) // Run retries every failure until ctx ends, then returns nil
	}()
	return func() { cancel(); <-done }
}

// Close gives up the lease (Run does when it returns). Step and Run must not be
// running.
func (p *Publisher) Close() { p.releaseLease() }

// Position is how far the publisher has published, as of its last round.
func (p *Publisher) Position() eventstore.Position {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published
}

func (p *Publisher) setLag(s float64) {
	p.mu.Lock()
	p.lagSec, p.published = s, p.from
	p.mu.Unlock()
	p.metrics.lag(s)
}

// LagSeconds is the age of the oldest event not yet published when the
// publisher last read, 0 when it was caught up.
func (p *Publisher) LagSeconds() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lagSec
}

// publisherMetrics are the publisher's Prometheus metrics; nil records nothing.
type publisherMetrics struct {
	events     prometheus.Counter
	failures   prometheus.Counter
	lagSeconds prometheus.Gauge
	checkpoint *prometheus.GaugeVec
}

func newPublisherMetrics(reg prometheus.Registerer) *publisherMetrics {
	m := &publisherMetrics{
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ledger_publisher_events_total", Help: "Events published to LEDGER_EVENTS and acknowledged.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ledger_publisher_failures_total", Help: "Publishing rounds that failed and were retried.",
		}),
		lagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ledger_publisher_lag_seconds", Help: "Age of the oldest event not yet published (0 when caught up).",
		}),
		checkpoint: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledger_publisher_checkpoint", Help: "The publisher's checkpoint position (commit and prepare parts).",
		}, []string{"part"}),
	}
	reg.MustRegister(m.events, m.failures, m.lagSeconds, m.checkpoint)
	return m
}

func (m *publisherMetrics) published(n int, p eventstore.Position) {
	if m == nil {
		return
	}
	m.events.Add(float64(n))
	m.checkpoint.WithLabelValues("commit").Set(float64(p.Commit))
	m.checkpoint.WithLabelValues("prepare").Set(float64(p.Prepare))
}

func (m *publisherMetrics) failure() {
	if m != nil {
		m.failures.Inc()
	}
}

func (m *publisherMetrics) lag(s float64) {
	if m != nil {
		m.lagSeconds.Set(s)
	}
}
