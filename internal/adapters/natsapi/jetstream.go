package natsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// StreamOptions shape the streams EnsureStreams declares.
type StreamOptions struct {
	Replicas      int
	CommandMaxAge time.Duration
	DLQMaxAge     time.Duration
}

// EnsureStreams creates LEDGER_COMMANDS and LEDGER_DLQ, or updates them to this
// configuration: file storage, limits retention, the Nats-Msg-Id window of
// DuplicateWindow. Calling it again, from any number of instances, is harmless.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o StreamOptions) error {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	cfgs := []jetstream.StreamConfig{{
		Name:        StreamName,
		Description: "Ledger commands (PROTOCOL.md §2): acked by the ledger once decided",
		Subjects:    []string{CommandSubjects},
		// NoAck: the stream stores every command but never answers its reply subject.
		// A plain NATS request on a command subject then gets exactly one answer, the
		// ledger's §3 reply, whatever client sends it; a js.Publish gets the same
		// reply as its acknowledgement (WireReply is a valid PubAck), which comes
		// only once the outcome is durable in the event store. With no ledger up the
		// publish times out, the command stays stored and is decided when a ledger
		// starts; the publisher retries with the same key.
		NoAck:      true,
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardOld,
		MaxAge:     o.CommandMaxAge,
		Duplicates: DuplicateWindow,
		Replicas:   o.Replicas,
	}, {
		Name:        DLQStreamName,
		Description: "Ledger commands that can never succeed, with the reason in headers",
		Subjects:    []string{DLQSubject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      o.DLQMaxAge,
		Duplicates:  DuplicateWindow,
		Replicas:    o.Replicas,
	}}
	for _, cfg := range cfgs {
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("natsapi: stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// consumerLoop pulls LEDGER_COMMANDS and hands each message to the lane of its
// account; each lane handles its messages one at a time, in order.
type consumerLoop struct {
	in    *Intake
	cons  jetstream.Consumer
	it    jetstream.MessagesContext
	lanes []chan jetstream.Msg
	quit  chan struct{}
	once  sync.Once
	loop  sync.WaitGroup // the fetch loop
	work  sync.WaitGroup // the lanes
	adv   *nats.Subscription
}

// pullBatch is the most messages one pull request asks for.
const pullBatch = 256

func startConsumer(ctx context.Context, in *Intake) (*consumerLoop, error) {
	o := in.opts
	cons, err := in.js.CreateOrUpdateConsumer(ctx, StreamName, jetstream.ConsumerConfig{
		Durable:       o.Durable,
		Description:   "the ledger's command consumer",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       o.BackOff[0],
		BackOff:       o.BackOff,
		MaxDeliver:    o.MaxDeliver,
		MaxAckPending: o.MaxAckPending,
		FilterSubject: CommandSubjects,
	})
	if err != nil {
		return nil, fmt.Errorf("natsapi: consumer %s: %w", o.Durable, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(min(pullBatch, o.MaxAckPending)))
	if err != nil {
		return nil, fmt.Errorf("natsapi: consume %s: %w", o.Durable, err)
	}
	c := &consumerLoop{in: in, cons: cons, it: it, quit: make(chan struct{}), lanes: make([]chan jetstream.Msg, o.Lanes)}
	// A message whose deliveries ran out without a final failure being seen (its
	// consumer died each time) is announced by an advisory: copy it to the DLQ.
	adv := fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s", StreamName, o.Durable)
	if c.adv, err = in.nc.QueueSubscribe(adv, o.QueueGroup, c.onMaxDeliveries); err != nil {
		it.Stop()
		return nil, fmt.Errorf("natsapi: subscribe %s: %w", adv, err)
	}
	for i := range c.lanes {
		// A lane can hold every message the server may have delivered and not yet
		// seen acked (MaxAckPending), so the fetch loop never blocks on it.
		c.lanes[i] = make(chan jetstream.Msg, o.MaxAckPending)
		c.work.Add(1)
		go c.lane(c.lanes[i])
	}
	c.loop.Add(1)
	go c.fetch()
	return c, nil
}

func (c *consumerLoop) stop() {
	c.once.Do(func() {
		close(c.quit)
		c.it.Drain()
		if c.adv != nil {
			_ = c.adv.Unsubscribe()
		}
	})
}

func (c *consumerLoop) wait() {
	c.loop.Wait()
	c.work.Wait()
}

func (c *consumerLoop) stopping() bool {
	select {
	case <-c.quit:
		return true
	default:
		return false
	}
}

func (c *consumerLoop) fetch() {
	defer c.loop.Done()
	defer func() {
		for _, l := range c.lanes {
			close(l)
		}
	}()
	log := c.in.log
	for {
		m, err := c.it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return
		}
		if err != nil {
			if c.stopping() {
				return
			}
			log.Warn("jetstream pull", "err", err)
			select {
			case <-c.quit:
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		if c.stopping() {
			// Fetched, not started: give it back at once to another instance.
			_ = m.Nak()
			c.in.opts.Metrics.settled("nak")
			continue
		}
		// Never wait here: the pull subscription's buffer holds one pull batch, and
		// the server's heartbeats come through it too. A loop that stops reading
		// (for the grace, or behind a busy lane) lets it overflow: the client drops
		// messages ("slow consumer"), heartbeats among them, and the dropped
		// deliveries come back only after AckWait. The lanes are deep enough to
		// take everything the server may have outstanding (MaxAckPending).
		c.lanes[laneOf(m.Data(), len(c.lanes))] <- m
	}
}

// laneOf picks a lane by the account a command concerns (the source of a transfer,
// the original of a refund), so that one instance keeps an account's commands in
// stream order. Undecodable bodies go to lane 0.
func laneOf(body []byte, n int) int {
	var k struct {
		Account  string `json:"account_id"`
		From     string `json:"from"`
		Original string `json:"original_key"`
		Key      string `json:"idempotency_key"`
	}
	if len(body) > domain.MaxBodyBytes || json.Unmarshal(body, &k) != nil {
		return 0
	}
	key := k.Account
	for _, s := range []string{k.From, k.Original, k.Key} {
		if key == "" {
			key = s
		}
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

func (c *consumerLoop) lane(ch <-chan jetstream.Msg) {
	defer c.work.Done()
	for m := range ch {
		if c.stopping() || !c.graceOver(m) {
			_ = m.Nak()
			c.in.opts.Metrics.settled("nak")
			continue
		}
		c.handle(m)
	}
}

// graceOver waits until a first delivery is Grace old (see Options.Grace); it
// reports false when the consumer stops first. Messages of a lane come in stream
// order, so a lane waits for each message at most once.
func (c *consumerLoop) graceOver(m jetstream.Msg) bool {
	if c.in.opts.Grace <= 0 {
		return true
	}
	md, err := m.Metadata()
	if err != nil || md.NumDelivered != 1 {
		return true
	}
	wait := time.Until(md.Timestamp.Add(c.in.opts.Grace))
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.quit:
		return false
	}
}

// handle decides one stream message and settles it: ack once the outcome is durable
// (applied, or a rejection: recorded in the event store or, for a rejection that
// concerns nothing that exists, final); an invalid command is copied to the DLQ and
// terminated; an infrastructure failure is nak'ed with the back-off delay, and at
// the last delivery copied to the DLQ and terminated.
func (c *consumerLoop) handle(m jetstream.Msg) {
	in := c.in
	typ := commandType(m.Subject())
	md, err := m.Metadata()
	if err != nil {
		in.log.Error("jetstream metadata", "err", err, "subject", m.Subject())
		_ = m.Term()
		return
	}
	in.opts.Metrics.inFlightAdd(SourceJetStream, 1)
	defer in.opts.Metrics.inFlightAdd(SourceJetStream, -1)

	ctx, cancel := context.WithTimeout(in.work, in.opts.CommandTimeout)
	defer cancel()
	stopProgress := inProgress(m, in.opts.BackOff[0]/3)
	start := time.Now()
	r := in.decide(ctx, typ, m.Data())
	stopProgress()
	took := time.Since(start)
	in.opts.Metrics.command(typ, SourceJetStream, r, took)
	in.logOutcome(SourceJetStream, typ, r, took)
	if in.opts.beforeAck != nil && !in.opts.beforeAck(m, r) {
		return
	}
	status := r.Status
	switch {
	case reply.Undecided(r): // a batch with a command left undecided: deliver it again
		status = domain.StatusError
	case reply.Recorded(r): // an atomic batch refused by an invalid element included
		status = domain.StatusApplied
	}
	switch status {
	case domain.StatusApplied, domain.StatusRejected:
		in.failpoint(FailpointAfterCommitBeforeAck)
		if err := m.Ack(); err != nil {
			in.log.Warn("jetstream ack", "err", err, "key", r.IdempotencyKey, "seq", md.Sequence.Stream)
		}
		in.opts.Metrics.settled("ack")
		if in.opts.Failpoint != nil {
			// The ack is buffered: make sure it reached the server, so that the
			// failpoint dies after the ack and not, in effect, before it.
			_ = in.nc.FlushTimeout(5 * time.Second)
			in.failpoint(FailpointAfterAckBeforeReply)
		}
	case domain.StatusInvalid:
		c.deadLetter(ctx, m, md, string(r.Code), r.Message)
	default:
		if in.work.Err() != nil { // Stop gave up: let another instance take it now
			_ = m.Nak()
			in.opts.Metrics.settled("nak")
			return
		}
		if int(md.NumDelivered) >= in.opts.MaxDeliver {
			c.deadLetter(ctx, m, md, "max_deliveries", r.Message)
			return
		}
		_ = m.NakWithDelay(c.backoff(md.NumDelivered))
		in.opts.Metrics.settled("nak")
	}
}

// backoff is the delay before redelivery n+1.
func (c *consumerLoop) backoff(delivered uint64) time.Duration {
	b := c.in.opts.BackOff
	i := int(delivered) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(b) {
		i = len(b) - 1
	}
	return b[i]
}

// inProgress tells the server every period that m is still being worked on, so a
// command that outlives a fraction of AckWait is not redelivered meanwhile.
func inProgress(m jetstream.Msg, period time.Duration) (stop func()) {
	if period <= 0 {
		period = time.Second
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// deadLetter copies m to DLQSubject (durably: the DLQ stream acks it) with the
// reason in headers, then terminates m. If the copy fails, m is nak'ed to be tried
// again, so that nothing is dropped silently.
func (c *consumerLoop) deadLetter(ctx context.Context, m jetstream.Msg, md *jetstream.MsgMetadata, reason, message string) {
	in := c.in
	if err := c.publishDeadLetter(ctx, m.Subject(), m.Headers(), m.Data(), md.Sequence.Stream, md.NumDelivered, reason, message); err != nil {
		in.log.Error("dead letter", "err", err, "seq", md.Sequence.Stream)
		_ = m.NakWithDelay(c.backoff(1))
		in.opts.Metrics.settled("nak")
		return
	}
	if err := m.TermWithReason(reason); err != nil {
		in.log.Warn("jetstream term", "err", err, "seq", md.Sequence.Stream)
	}
	in.opts.Metrics.settled("term")
	in.opts.Metrics.deadLetter(reason)
	in.log.Warn("command dead-lettered", "seq", md.Sequence.Stream, "subject", m.Subject(), "reason", reason, "message", message)
}

func (c *consumerLoop) publishDeadLetter(ctx context.Context, subject string, orig nats.Header, data []byte, seq, delivered uint64, reason, message string) error {
	h := nats.Header{}
	for k, vs := range orig {
		if strings.HasPrefix(k, "Nats-") {
			continue // Nats-Msg-Id and friends would act on the DLQ stream
		}
		h[k] = vs
	}
	h.Set(HeaderDLQReason, reason)
	h.Set(HeaderDLQMessage, headerValue(message))
	h.Set(HeaderDLQSubject, subject)
	h.Set(HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	h.Set(HeaderDLQDeliveries, strconv.FormatUint(delivered, 10))
	// One dead letter per stream message, however often it is retried.
	h.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-%d", StreamName, seq))
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := c.in.js.PublishMsg(pctx, &nats.Msg{Subject: DLQSubject, Header: h, Data: data})
	return err
}

// headerValue makes s safe as a header value: one line, bounded.
func headerValue(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
	if len(s) > 1024 {
		s = s[:1024]
	}
	return s
}

// onMaxDeliveries copies a message whose deliveries ran out to the DLQ.
func (c *consumerLoop) onMaxDeliveries(msg *nats.Msg) {
	var adv struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries uint64 `json:"deliveries"`
	}
	if err := json.Unmarshal(msg.Data, &adv); err != nil || adv.StreamSeq == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.in.js.Stream(ctx, StreamName)
	if err != nil {
		c.in.log.Error("max deliveries: stream", "err", err)
		return
	}
	raw, err := s.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		c.in.log.Error("max deliveries: get message", "seq", adv.StreamSeq, "err", err)
		return
	}
	if err := c.publishDeadLetter(ctx, raw.Subject, raw.Header, raw.Data, adv.StreamSeq, adv.Deliveries, "max_deliveries", "deliveries ran out without an outcome"); err != nil {
		c.in.log.Error("max deliveries: dead letter", "seq", adv.StreamSeq, "err", err)
		return
	}
	c.in.opts.Metrics.deadLetter("max_deliveries")
	c.in.log.Warn("command dead-lettered", "seq", adv.StreamSeq, "subject", raw.Subject, "reason", "max_deliveries")
}
