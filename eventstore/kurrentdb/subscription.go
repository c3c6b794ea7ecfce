package kurrentdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ledgerworks/ledger/eventstore"
)

// Subscription is a $all catch-up subscription that resubscribes after a drop.
//
// It resumes from the last position it may skip: the position of the last event
// it delivered (or left out as a system record), or the last checkpoint the
// server sent after it, whichever is later. A checkpoint comes only after every
// event before it was sent, and events are delivered in order, so nothing
// between the two is lost; a resubscription never repeats a delivered event.
type Subscription struct {
	store  *Store
	filter *esdb.SubscriptionFilter
	events chan eventstore.RecordedEvent
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	err        error
	checkpoint eventstore.Position
	drops      int
}

var _ eventstore.Subscription = (*Subscription)(nil)

// Events delivers the events in global order; it is closed when the subscription ends.
func (s *Subscription) Events() <-chan eventstore.RecordedEvent { return s.events }

// Err tells why the subscription ended: nil after Close or cancellation of its
// context, an error wrapping eventstore.ErrUnavailable when resubscribing failed
// too many times in a row, or the server's refusal.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the subscription and waits for it to stop.
func (s *Subscription) Close() error {
	s.cancel()
	<-s.done
	return nil
}

// Checkpoint is the position up to which every event of the filter was
// delivered: the last delivered event's or a later server checkpoint's. A
// consumer whose prefixes match rarely may store it to resume without rescanning.
func (s *Subscription) Checkpoint() eventstore.Position {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkpoint
}

// Drops counts the times the subscription was dropped and resubscribed.
func (s *Subscription) Drops() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drops
}

// SubscribeAll subscribes to $all after the position (exclusive), catch-up then
// live, filtered on the server by opts.StreamPrefixes (system events are always
// left out). The first subscription is made before it returns, so a server that
// cannot be reached is reported here.
func (s *Store) SubscribeAll(ctx context.Context, after eventstore.Position, opts eventstore.SubscribeOptions) (eventstore.Subscription, error) {
	size := opts.BufferSize
	if size <= 0 {
		size = defaultBufferSize
	}
	filter := esdb.ExcludeSystemEventsFilter()
	if len(opts.StreamPrefixes) > 0 {
		filter = &esdb.SubscriptionFilter{Type: esdb.StreamFilterType, Prefixes: append([]string(nil), opts.StreamPrefixes...)}
	}
	subCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.subCtx, cancel) // Store.Close ends it too
	sub := &Subscription{
		store:      s,
		filter:     filter,
		events:     make(chan eventstore.RecordedEvent, size),
		ctx:        subCtx,
		cancel:     cancel,
		done:       make(chan struct{}),
		checkpoint: after,
	}
	es, err := s.subscribeAfter(subCtx, after, filter)
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = es.Close()
		stop()
		cancel()
		return nil, errClosed
	}
	s.subs.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.subs.Done()
		defer stop()
		sub.run(es, after)
	}()
	return sub, nil
}

// subscribeAfter subscribes so that the server delivers every event strictly
// after p (and perhaps some before it, which run drops). The server starts after
// the first event at or after its start position: exclusive when an event sits at
// p, but when none does (a checkpoint between events, say) it would skip the next
// event. So p is used only when an event sits at it; otherwise the subscription
// starts from the last event before p.
func (s *Store) subscribeAfter(ctx context.Context, p eventstore.Position, filter *esdb.SubscriptionFilter) (*esdb.Subscription, error) {
	from, err := s.startFor(ctx, p)
	if err != nil {
		return nil, err
	}
	return s.subscribe(ctx, from, filter)
}

func (s *Store) startFor(ctx context.Context, p eventstore.Position) (eventstore.Position, error) {
	if p == eventstore.Start {
		return p, nil
	}
	at, err := s.readAllPage(ctx, allFrom(p), esdb.Forwards, 1)
	if err != nil {
		return p, err
	}
	if len(at) == 1 && at[0].Position == p {
		return p, nil
	}
	// Backwards from (commit, commit): a read from (X, 0) leaves out the record
	// that ends at X (the server compares post-positions), the very one wanted.
	prev, err := s.readAllPage(ctx, allFrom(eventstore.Position{Commit: p.Commit, Prepare: max(p.Prepare, p.Commit)}), esdb.Backwards, 2)
	if err != nil {
		return p, err
	}
	for _, e := range prev {
		if e.Position.Compare(p) < 0 {
			return e.Position, nil
		}
	}
	return eventstore.Start, nil
}

func (s *Store) subscribe(ctx context.Context, from eventstore.Position, filter *esdb.SubscriptionFilter) (*esdb.Subscription, error) {
	var es *esdb.Subscription
	err := s.do(ctx, func(ctx context.Context, c *esdb.Client) error {
		var err error
		es, err = c.SubscribeToAll(ctx, esdb.SubscribeToAllOptions{
			From:               allFrom(from),
			Filter:             filter,
			MaxSearchWindow:    s.opts.searchWindow,
			CheckpointInterval: s.opts.checkpointMultiple,
		})
		if err != nil && es != nil {
			_ = es.Close()
		}
		return err
	})
	if err != nil {
		return nil, mapError(ctx, err, "subscribe to $all")
	}
	return es, nil
}

func (sub *Subscription) finish(err error) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.ctx.Err() != nil {
		err = nil // closed or cancelled: not a failure
	}
	sub.err = err
}

func (sub *Subscription) setCheckpoint(p eventstore.Position) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	sub.checkpoint = p
}

// permanent reports a drop that resubscribing cannot cure.
func permanent(err error) bool {
	if errors.Is(err, io.EOF) {
		return false
	}
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument, codes.Unimplemented, codes.FailedPrecondition:
		return true
	}
	return false
}

func (sub *Subscription) run(es *esdb.Subscription, after eventstore.Position) {
	defer close(sub.done)
	defer close(sub.events)
	defer func() {
		if es != nil {
			_ = es.Close()
		}
	}()
	// resume: the last position the subscription may skip: the last event delivered
	// (or left out as a system record), or a later checkpoint. Nothing at or before
	// it is delivered again.
	resume, haveResume := after, after != eventstore.Start
	// seen: the furthest position known to exist in the log. A checkpoint beyond
	// it is checked against the log's head before it is adopted: KDB-710 (24.2,
	// 24.6, 24.10.0-24.10.4) sends one at the maximum position, and a resume
	// point beyond the head would drop every event to come.
	seen := after
	attempts := 0
	for {
		ev := es.Recv()
		switch {
		case ev.EventAppeared != nil:
			attempts = 0
			rec := toRecorded(ev.EventAppeared.OriginalEvent())
			if haveResume && rec.Position.Compare(resume) <= 0 {
				continue // before the start, or delivered before a resubscription
			}
			if !isSystem(rec.Stream, rec.Type) {
				select {
				case sub.events <- rec:
				case <-sub.ctx.Done():
					sub.finish(nil)
					return
				}
			}
			resume, haveResume = rec.Position, true
			seen = maxPosition(seen, rec.Position)
			sub.setCheckpoint(rec.Position)
		case ev.CheckPointReached != nil:
			attempts = 0
			p := eventstore.Position{Commit: ev.CheckPointReached.Commit, Prepare: ev.CheckPointReached.Prepare}
			if p.Compare(resume) > 0 && sub.withinLog(p, &seen) {
				resume, haveResume = p, true
				sub.setCheckpoint(p)
			}
		case ev.CaughtUp != nil, ev.FellBehind != nil:
			attempts = 0
		case ev.SubscriptionDropped != nil:
			_ = es.Close()
			es = nil
			cause := ev.SubscriptionDropped.Error
			if sub.ctx.Err() != nil {
				sub.finish(nil)
				return
			}
			if permanent(cause) {
				sub.finish(mapError(sub.ctx, cause, "subscription to $all"))
				return
			}
			sub.mu.Lock()
			sub.drops++
			sub.mu.Unlock()
			if es, attempts = sub.resubscribe(resume, cause, attempts); es == nil {
				return // finished
			}
		}
	}
}

// resubscribe subscribes again after a drop (whose cause was cause), from
// resume, with back-off, until it succeeds or the subscription finishes: the
// attempts in a row run out (counted on from attempts), the store closes, or
// the subscription is closed. It returns the new subscription and the attempts
// made, or nil once it has finished the subscription.
func (sub *Subscription) resubscribe(resume eventstore.Position, cause error, attempts int) (*esdb.Subscription, int) {
	o := sub.store.opts
	for {
		attempts++
		if o.resubscribeAttempts > 0 && attempts > o.resubscribeAttempts {
			sub.finish(fmt.Errorf("kurrentdb: subscription to $all: %d resubscriptions failed: %w: %w",
				attempts-1, eventstore.ErrUnavailable, cause))
			return nil, attempts
		}
		if !sleep(sub.ctx, backoff(o.backoffMin, o.backoffMax, attempts)) {
			sub.finish(nil)
			return nil, attempts
		}
		es, err := sub.store.subscribeAfter(sub.ctx, resume, sub.filter)
		if err == nil {
			return es, attempts
		}
		cause = err
		if errors.Is(err, errClosed) || sub.ctx.Err() != nil {
			sub.finish(nil)
			return nil, attempts
		}
	}
}

// withinLog reports whether p is a position the log has reached: at or before
// *seen, or else at or before the head read now (which moves *seen). A
// checkpoint it refuses is left out, which costs nothing but a longer re-read
// after a drop; when the head cannot be read, the checkpoint is left out too.
func (sub *Subscription) withinLog(p eventstore.Position, seen *eventstore.Position) bool {
	if p.Compare(*seen) <= 0 {
		return true
	}
	head, err := sub.store.readAllPage(sub.ctx, esdb.End{}, esdb.Backwards, 1)
	if err != nil || len(head) == 0 {
		return false
	}
	*seen = maxPosition(*seen, head[0].Position)
	return p.Compare(*seen) <= 0
}

func maxPosition(a, b eventstore.Position) eventstore.Position {
	if a.Compare(b) >= 0 {
		return a
	}
	return b
}

// backoff is lo doubled per attempt after the first, capped at hi.
func backoff(lo, hi time.Duration, attempt int) time.Duration {
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
