package ledger

import (
	"context"
	"errors"
	"sync"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/eventstore"
)

// rounds asks the store one question on behalf of many concurrent callers,
// as group commit appends many commands in one transaction: one goroutine
// gathers the rounds, and when a round slot is free it takes what has queued
// (up to maxRound questions) and asks in the background, at most inFlight
// rounds at once. No caller waits for a round to fill: a question that finds
// a free slot and nothing queued is asked at once by its caller (no handoff),
// and the questions that queue while rounds are in flight go together in the
// next one.
type rounds[Q, A any] struct {
	ask      func(ctx context.Context, qs []Q) ([]A, error) // one answer per question, in order
	sizes    prometheus.Observer                            // questions per round
	maxRound int
	inFlight int
	queue    chan *question[Q, A]
	slots    chan struct{} // a round in flight holds one
	done     chan struct{}
	stopped  chan struct{}
	once     sync.Once
}

type question[Q, A any] struct {
	q     Q
	a     A
	err   error
	ready chan struct{}
}

func newRounds[Q, A any](maxRound, inFlight int, sizes prometheus.Observer, ask func(context.Context, []Q) ([]A, error)) *rounds[Q, A] {
	r := &rounds[Q, A]{ask: ask, sizes: sizes, maxRound: maxRound, inFlight: inFlight,
		queue: make(chan *question[Q, A], maxRound), slots: make(chan struct{}, inFlight), done: make(chan struct{}), stopped: make(chan struct{})}
	go r.loop()
	return r
}

var (
	errRoundsClosed = errors.New("ledger: the store's grouped reads are closed")
	errAnswerCount  = errors.New("ledger: a grouped read answered another number of questions than it was asked")
)

// do asks q in the next round and returns its answer.
func (r *rounds[Q, A]) do(ctx context.Context, q Q) (a A, err error) {
	select {
	case <-r.done:
		return a, errRoundsClosed
	default:
	}
	if len(r.queue) == 0 {
		select { // a free slot and nothing queued: ask alone, without a handoff
		case r.slots <- struct{}{}:
			defer func() { <-r.slots }()
			return r.askAlone(q)
		default:
		}
	}
	l := &question[Q, A]{q: q, ready: make(chan struct{})}
	select {
	case r.queue <- l:
	case <-r.done:
		return a, errRoundsClosed
	case <-ctx.Done():
		return a, ctx.Err()
	}
	select {
	case <-l.ready:
		return l.a, l.err
	case <-r.stopped: // closed with this question still queued: nobody will ask
		select {
		case <-l.ready:
			return l.a, l.err
		default:
			return a, errRoundsClosed
		}
	case <-ctx.Done():
		return a, ctx.Err()
	}
}

// askAlone asks one question in a round of its own (the caller holds a slot).
func (r *rounds[Q, A]) askAlone(q Q) (a A, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	as, err := r.ask(ctx, []Q{q})
	r.sizes.Observe(1)
	if err == nil && len(as) != 1 {
		err = errAnswerCount
	}
	if err != nil {
		return a, err
	}
	return as[0], nil
}

func (r *rounds[Q, A]) loop() {
	var running sync.WaitGroup
	defer func() { running.Wait(); close(r.stopped) }()
	slots := r.slots
	for {
		var batch []*question[Q, A]
		select {
		case l := <-r.queue:
			batch = append(batch, l)
		case <-r.done:
			return
		}
		select { // a round slot; questions queue meanwhile and join this round
		case slots <- struct{}{}:
		case <-r.done:
			r.answer(batch, nil, errRoundsClosed)
			return
		}
	fill:
		for len(batch) < r.maxRound {
			select {
			case l := <-r.queue:
				batch = append(batch, l)
			default:
				break fill
			}
		}
		running.Add(1)
		go func() {
			defer func() { <-slots; running.Done() }()
			qs := make([]Q, len(batch))
			for i, l := range batch {
				qs[i] = l.q
			}
			// Not tied to one caller's context: the round answers all of them.
			ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
			as, err := r.ask(ctx, qs)
			cancel()
			if err == nil && len(as) != len(qs) {
				err = errAnswerCount
			}
			r.answer(batch, as, err)
			r.sizes.Observe(float64(len(batch)))
		}()
	}
}

func (r *rounds[Q, A]) answer(batch []*question[Q, A], as []A, err error) {
	for i, l := range batch {
		if err != nil {
			l.err = err
		} else {
			l.a = as[i]
		}
		close(l.ready)
	}
}

// close stops the loop; questions queued meanwhile get errRoundsClosed or
// their context's end.
func (r *rounds[Q, A]) close() {
	r.once.Do(func() { close(r.done) })
	<-r.stopped
}

// keyLookups reads from the store the events of the keys of concurrent
// commands, when it holds them, in one request per round (decidedBefore):
// while resends of forgotten keys arrive on a hot account, each of its
// commands needs to know whether its key was decided, and a resend the
// record its first event starts; one request per command would cost a round
// trip each, and a resend's read under the account's lock one more.
type keyLookups struct {
	*rounds[uuid.UUID, *eventstore.RecordedEvent]
}

// maxLookupBatch bounds the IDs of one request; lookupRounds the requests in
// flight at once (a lookup waits for at most one round ahead of its own).
const (
	maxLookupBatch = 512
	lookupRounds   = 4
)

func newKeyLookups(l eventstore.EventLocator, sizes prometheus.Observer) *keyLookups {
	return &keyLookups{newRounds(maxLookupBatch, lookupRounds, sizes, func(ctx context.Context, ids []uuid.UUID) ([]*eventstore.RecordedEvent, error) {
		found, err := l.ReadEventsByID(ctx, ids)
		if err != nil {
			return nil, err
		}
		out := make([]*eventstore.RecordedEvent, len(ids))
		for i, id := range ids {
			if e, ok := found[id]; ok {
				out[i] = &e
			}
		}
		return out, nil
	})}
}

// event is the store's event of this ID, nil when it holds none.
func (k *keyLookups) event(ctx context.Context, id uuid.UUID) (*eventstore.RecordedEvent, error) {
	return k.do(ctx, id)
}
