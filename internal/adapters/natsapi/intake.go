package natsapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/platform/workers"
)

// Handler decides a raw command: ledger.Service implements it.
type Handler interface {
	HandleRaw(ctx context.Context, typ string, body []byte) reply.Reply
}

// BatchHandler is a Handler that decides a batch (PROTOCOL.md v1.2 §2.2)
// knowing how large its reply may be: the NATS server's message limit.
// ledger.Service implements it; a Handler that does not gets batches through
// HandleRaw.
type BatchHandler interface {
	HandleBatch(ctx context.Context, body []byte, maxReplyBytes int) reply.Reply
}

// decide hands a command (or a batch) to the handler.
func (in *Intake) decide(ctx context.Context, typ string, body []byte) reply.Reply {
	if bh, ok := in.h.(BatchHandler); ok && typ == string(domain.CmdBatch) {
		return bh.HandleBatch(ctx, body, int(in.nc.MaxPayload()))
	}
	return in.h.HandleRaw(ctx, typ, body)
}

// CommandLookup answers the outcome of a decided key, nil for a key never
// decided: ledger.Service implements it from the event store; the read side
// may serve it from its read models.
type CommandLookup interface {
	Lookup(ctx context.Context, key string) (*reply.Reply, error)
}

// TransactionLookup answers a transaction by its ID (ledger.v1.query.transaction):
// ledger.Service implements it from the event store. An Intake whose Lookup
// implements it answers that query too.
type TransactionLookup interface {
	LookupTransaction(ctx context.Context, id string) (*reply.TransactionDetail, error)
}

// Options configure an Intake. Zero values take the defaults.
type Options struct {
	// QueueGroup shares request-reply commands and queries among instances (default "ledger").
	QueueGroup string
	// MaxInFlight bounds the request-reply commands handled at once (default 64).
	// When all slots are busy the subscription stops being read and its pending
	// buffer (PendingLimit) absorbs the burst: back-pressure, not more goroutines.
	MaxInFlight int
	// PendingLimit bounds the messages buffered by the command subscription (default 4096).
	PendingLimit int
	// CommandTimeout bounds the handling of one command (default 15s).
	CommandTimeout time.Duration

	// DisableJetStream leaves out the stream, the consumer and the DLQ.
	DisableJetStream bool
	// Durable names the pull consumer (default "ledger").
	Durable string
	// BackOff is the redelivery schedule: its first value is the consumer's AckWait,
	// delivery n waits BackOff[min(n, len)-1] for its ack before being redelivered, and
	// a command that failed for an infrastructure reason is nak'ed with the same delay
	// (default 10s, 30s, 1m, 2m, 5m, 10m).
	BackOff []time.Duration
	// MaxDeliver bounds the deliveries of a message (default 20); the last failure
	// copies it to the DLQ with reason max_deliveries.
	MaxDeliver int
	// MaxAckPending bounds the consumer's delivered and unacknowledged messages
	// (default 20,000). Every command captured from request-reply waits out the
	// Grace before it is confirmed, so this must exceed Grace times the command
	// rate, or the consumer falls behind the stream (1,024 and a 2s grace confirm
	// at most 512 commands/s).
	MaxAckPending int
	// Lanes is the number of JetStream workers (default 16). A message goes to the
	// lane of its account (or transfer source), so that one instance handles the
	// commands of an account in stream order.
	Lanes int
	// Grace delays the first delivery of a stream message until it is this old
	// (default 2s; negative: no delay). A command sent by request-reply is also
	// captured by the stream: the grace lets the request-reply path decide it first,
	// so that its requester never sees its own command as a duplicate; the consumer
	// then only confirms it from the record.
	Grace time.Duration
	// Replicas of the streams (default 1).
	Replicas int
	// CommandMaxAge bounds how long LEDGER_COMMANDS keeps a message (default 7 days).
	CommandMaxAge time.Duration
	// DLQMaxAge bounds how long LEDGER_DLQ keeps a dead letter (default 30 days).
	DLQMaxAge time.Duration

	// Lookup, when set, answers ledger.v1.query.command.
	Lookup CommandLookup

	Metrics *Metrics
	Logger  *slog.Logger

	// Failpoint, when set (tests and the chaos suite only; off in production), is
	// called at the named failpoints (FailpointAfterCommitBeforeAck,
	// FailpointAfterAckBeforeReply) and may end the process there. See
	// FailpointHook.
	Failpoint func(name string)

	// beforeAck, in tests, runs after a JetStream command's outcome is known and
	// before it is settled; returning false leaves the message unsettled (a
	// consumer that died before its ack).
	beforeAck func(m jetstream.Msg, r reply.Reply) bool
}

func (o *Options) defaults() {
	if o.QueueGroup == "" {
		o.QueueGroup = DefaultQueueGroup
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 64
	}
	if o.PendingLimit <= 0 {
		o.PendingLimit = 4096
	}
	if o.CommandTimeout <= 0 {
		o.CommandTimeout = 15 * time.Second
	}
	if o.Durable == "" {
		o.Durable = DefaultDurable
	}
	if len(o.BackOff) == 0 {
		o.BackOff = []time.Duration{10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute}
	}
	if o.MaxDeliver <= 0 {
		o.MaxDeliver = 20
	}
	if o.MaxDeliver < len(o.BackOff) {
		o.MaxDeliver = len(o.BackOff)
	}
	if o.MaxAckPending <= 0 {
		o.MaxAckPending = 20_000
	}
	if o.Lanes <= 0 {
		o.Lanes = 16
	}
	if o.Grace == 0 {
		o.Grace = 2 * time.Second
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.CommandMaxAge <= 0 {
		o.CommandMaxAge = 7 * 24 * time.Hour
	}
	if o.DLQMaxAge <= 0 {
		o.DLQMaxAge = 30 * 24 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Intake feeds commands from NATS to a Handler and replies.
type Intake struct {
	nc   *nats.Conn
	h    Handler
	opts Options
	log  *slog.Logger

	// work is the context of command handling: it outlives Stop's draining and is
	// cancelled only when Stop gives up (its ctx ends).
	work       context.Context
	cancelWork context.CancelFunc

	requests *workers.Pool // request-reply workers, MaxInFlight at most
	drained  chan struct{} // closed once the subscriptions are drained
	qsem     chan struct{} // query slots
	wg       sync.WaitGroup
	subs     []*nats.Subscription
	js       jetstream.JetStream
	cons     *consumerLoop
	mu       sync.Mutex
	started  bool
	stopped  bool
}

// New returns an Intake on nc; Start subscribes.
func New(nc *nats.Conn, h Handler, opts Options) *Intake {
	opts.defaults()
	work, cancel := context.WithCancel(context.Background())
	return &Intake{
		nc: nc, h: h, opts: opts, log: opts.Logger.With("component", "intake"),
		work: work, cancelWork: cancel,
		qsem:     make(chan struct{}, opts.MaxInFlight),
		requests: workers.New(opts.MaxInFlight, workerIdle), drained: make(chan struct{}),
	}
}

// Start makes sure the streams and the consumer exist (creating or updating them)
// and subscribes. ctx bounds the set-up only.
func (in *Intake) Start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.started {
		return errors.New("natsapi: intake already started")
	}
	in.started = true
	if !in.opts.DisableJetStream {
		js, err := jetstream.New(in.nc)
		if err != nil {
			return fmt.Errorf("natsapi: jetstream: %w", err)
		}
		in.js = js
		if err := EnsureStreams(ctx, js, StreamOptions{Replicas: in.opts.Replicas, CommandMaxAge: in.opts.CommandMaxAge, DLQMaxAge: in.opts.DLQMaxAge}); err != nil {
			return err
		}
	}
	sub, err := in.nc.QueueSubscribe(CommandSubjects, in.opts.QueueGroup, in.onRequest)
	if err != nil {
		return fmt.Errorf("natsapi: subscribe %s: %w", CommandSubjects, err)
	}
	if err := sub.SetPendingLimits(in.opts.PendingLimit, 64<<20); err != nil {
		return err
	}
	in.subs = append(in.subs, sub)
	if in.opts.Lookup != nil {
		queries := map[string]func(context.Context, []byte) any{
			CommandQuerySubject: func(ctx context.Context, b []byte) any { return AnswerCommandQuery(ctx, in.opts.Lookup, b) },
		}
		if tl, ok := in.opts.Lookup.(TransactionLookup); ok {
			queries[TransactionQuerySubject] = func(ctx context.Context, b []byte) any { return AnswerTransactionQuery(ctx, tl, b) }
		}
		for subject, answer := range queries {
			q, err := in.nc.QueueSubscribe(subject, in.opts.QueueGroup, func(msg *nats.Msg) { in.onQuery(msg, subject, answer) })
			if err != nil {
				return fmt.Errorf("natsapi: subscribe %s: %w", subject, err)
			}
			in.subs = append(in.subs, q)
		}
	}
	if in.js != nil {
		c, err := startConsumer(ctx, in)
		if err != nil {
			return err
		}
		in.cons = c
	}
	if err := in.nc.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("natsapi: flush: %w", err)
	}
	in.log.Info("intake started", "subjects", CommandSubjects, "queue", in.opts.QueueGroup, "jetstream", in.js != nil, "max_in_flight", in.opts.MaxInFlight)
	return nil
}

// Ready reports whether the intake is started and its connection is up.
func (in *Intake) Ready() error {
	in.mu.Lock()
	started, stopped := in.started, in.stopped
	in.mu.Unlock()
	switch {
	case !started:
		return errors.New("intake not started")
	case stopped:
		return errors.New("intake stopped")
	case !in.nc.IsConnected():
		return fmt.Errorf("nats %s", in.nc.Status())
	}
	return nil
}

// Stop stops taking commands and finishes those in flight: the subscriptions are
// drained (what they had buffered is still handled), the consumer stops pulling and
// naks what it had fetched but not started, and Stop waits for every command being
// handled to reply or settle. When ctx ends first, in-flight commands are cancelled
// (their JetStream messages are redelivered) and ctx's error is returned.
func (in *Intake) Stop(ctx context.Context) error {
	in.mu.Lock()
	if in.stopped || !in.started {
		in.stopped = true
		in.mu.Unlock()
		return nil
	}
	in.stopped = true
	in.mu.Unlock()

	for _, s := range in.subs {
		if err := s.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			in.log.Warn("drain subscription", "subject", s.Subject, "err", err)
		}
	}
	if in.cons != nil {
		in.cons.stop()
	}
	done := make(chan struct{})
	go func() {
		for _, s := range in.subs {
			for s.IsValid() && in.nc.IsConnected() { // drained: IsValid turns false
				time.Sleep(5 * time.Millisecond)
			}
		}
		close(in.drained) // no more commands: idle workers end
		in.requests.Close()
		if in.cons != nil {
			in.cons.wait()
		}
		in.wg.Wait()
		in.requests.Wait()
		close(done)
	}()
	select {
	case <-done:
		in.cancelWork()
		in.log.Info("intake stopped")
		return nil
	case <-ctx.Done():
		in.cancelWork()
		in.requests.Close()
		<-done
		return fmt.Errorf("natsapi: stop: %w", ctx.Err())
	}
}

// onRequest runs on the subscription's goroutine: it hands the command to an idle
// worker, or starts one while fewer than MaxInFlight run, or waits for a worker
// to be free (back-pressure: the subscription's pending buffer absorbs the burst).
// Workers are reused (internal/platform/workers): a command's handling grows its
// goroutine's stack, and a fresh goroutine per command paid that growth every time.
func (in *Intake) onRequest(msg *nats.Msg) {
	if msg.Reply == "" {
		// A plain publish: no one waits for a reply. The stream captured it and the
		// consumer decides it, with an ack, which is the durable path.
		return
	}
	in.requests.Go(in.work.Done(), func() {
		in.opts.Metrics.inFlightAdd(SourceRequest, 1)
		in.handleRequest(msg)
		in.opts.Metrics.inFlightAdd(SourceRequest, -1)
	})
}

// workerIdle is how long a request worker waits for another command before it ends.
const workerIdle = 10 * time.Second

func (in *Intake) handleRequest(msg *nats.Msg) {
	typ := commandType(msg.Subject)
	ctx, cancel := context.WithTimeout(in.work, in.opts.CommandTimeout)
	defer cancel()
	start := time.Now()
	r := in.decide(ctx, typ, msg.Data)
	in.opts.Metrics.command(typ, SourceRequest, r, time.Since(start))
	in.logOutcome(SourceRequest, typ, r, time.Since(start))
	if durable(r) {
		in.failpoint(FailpointAfterCommitBeforeAck) // the reply is request-reply's ack
	}
	b, err := encodeReply(r)
	if err != nil {
		in.log.Error("encode reply", "err", err)
		return
	}
	if err := msg.Respond(b); err != nil {
		in.log.Warn("reply", "err", err, "key", r.IdempotencyKey)
	}
}

// durable reports whether r is an outcome the event store keeps (or that is final).
func durable(r reply.Reply) bool {
	return r.Status == domain.StatusApplied || r.Status == domain.StatusRejected
}

// failpoint calls Options.Failpoint, if any.
func (in *Intake) failpoint(name string) {
	if in.opts.Failpoint != nil {
		in.opts.Failpoint(name)
	}
}

func (in *Intake) logOutcome(source, typ string, r reply.Reply, took time.Duration) {
	lvl := slog.LevelDebug
	if r.Status == domain.StatusError {
		lvl = slog.LevelWarn
	}
	in.log.Log(context.Background(), lvl, "command", "source", source, "type", typ, "key", r.IdempotencyKey,
		"status", r.Status, "code", r.Code, "duplicate", r.Duplicate, "took", took)
}

// WireReply is a command reply as the intake sends it: the ledger's reply plus the
// fields that make it a valid JetStream publish acknowledgement. The stream captures
// the command subjects, so a js.Publish of a command reaches this intake too, and
// its reply may reach the publisher before the stream's PubAck; the publisher then
// takes it as its ack (a stronger one: the outcome is durable) or, when nothing
// was applied or recorded (reply.Recorded), as a publish error (code 400 for
// status invalid, 503 for status error: publish again, same key).
type WireReply struct {
	reply.Reply
	// Stream names the stream that captured the command (PubAck compatibility).
	Stream string `json:"stream"`
	// Error is set when nothing was recorded: status invalid or error.
	Error *WireError `json:"error,omitempty"`
}

// WireError is the "error" of a JetStream API response.
type WireError struct {
	Code        int    `json:"code"`
	Description string `json:"description"`
}

func wire(r reply.Reply) WireReply {
	w := WireReply{Reply: r, Stream: StreamName}
	switch {
	case reply.Recorded(r): // an atomic batch refused by an invalid element included
	case r.Status == domain.StatusInvalid:
		w.Error = &WireError{Code: 400, Description: string(r.Code) + ": " + r.Message}
	case r.Status == domain.StatusError:
		w.Error = &WireError{Code: 503, Description: string(r.Code) + ": " + r.Message}
	}
	return w
}
