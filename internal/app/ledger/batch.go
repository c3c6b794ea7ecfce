package ledger

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/eventstore"
)

// Group commit. Commands for different streams that arrive together are appended
// in one transaction of a MultiAppender, and each caller gets its own result only
// after that transaction commits. A batch is bounded in commands and in wait: a
// committer takes what is queued, waits at most MaxWait for more while the batch is
// below MaxBatch, and commits. While one batch commits the next one fills, so under
// load batches grow by themselves and a lone command waits for nobody.
//
// Several commands of one stream may share a transaction, in order, each part
// expecting the revision the one before it leaves (the pipelined write path,
// pipeline.go). A stream's requests all go to one committer (by the hash of their
// home stream: the one stream they were pipelined on, by default their last
// part's), so that they reach the store in the order they were decided, batch
// after batch. A request of several accounts is pipelined on one of them at
// most; its other accounts are drained and locked until it resolves, so no
// other request names them meanwhile.
//
// A batch whose append is refused for one stream (wrong expected revision) hands
// that error to the command that owns the stream, and to every later command of
// the batch that shares a stream with it (each was decided on top of it), and
// commits the rest without them; any other failure falls back to appending each
// command alone, in order, so one bad command never fails its batch-mates.

// BatchOptions bound group commit.
type BatchOptions struct {
	MaxBatch   int           // commands per transaction (default 256)
	MaxWait    time.Duration // extra wait for a batch to fill (default 0: take what is queued)
	Committers int           // transactions in flight at once (default 2)
	QueueLen   int           // pending commands before callers block (default 4096)
}

type appendReq struct {
	ctx   context.Context
	parts []eventstore.StreamAppend
	done  chan appendResp
	// chain names the pipeline chain the request was decided in (pipeline.go): the
	// commands of one stream decided one on another's pending state, since the
	// state was last read from the store. 0: none (decided on durable state).
	chain uint64
	// home is the stream whose committer carries the request and whose chain
	// it joins: the stream it was pipelined on.
	home string
	// then, once set (onAnswer), takes the outcome in place of done; mu
	// orders it with the committer's answer.
	mu       sync.Mutex
	then     func(appendResp)
	answered bool
}

// answer hands r its outcome: to then if it is set, else on done.
func (r *appendReq) answer(resp appendResp) {
	r.mu.Lock()
	f := r.then
	r.answered = true
	if f == nil {
		r.done <- resp // buffered: never blocks
	}
	r.mu.Unlock()
	if f != nil {
		f(resp)
	}
}

// onAnswer runs f with r's outcome once it is known, instead of a goroutine
// waiting on done: on the committer, once it answers r, or at once here when
// it has already. f must not block (it runs on the committer).
func (r *appendReq) onAnswer(f func(appendResp)) {
	r.mu.Lock()
	if !r.answered {
		r.then = f
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	f(<-r.done)
}

type appendResp struct {
	res []eventstore.AppendResult
	err error
}

type batcher struct {
	multi  eventstore.MultiAppender
	opts   BatchOptions
	sizes  prometheus.Observer // commands per transaction
	queues []chan *appendReq   // one per committer; a stream's requests all go to one
	wg     sync.WaitGroup
	stop   chan struct{}
	once   sync.Once
	// mu makes closing and queuing atomic: a request is queued only while
	// closed is false (enqueue holds mu for reading), so none is queued after
	// a committer drained its queue on stop; a select between the send and
	// the stop would choose at random when both are ready (TestCloseDuringBatches).
	mu     sync.RWMutex
	closed bool
}

func newBatcher(multi eventstore.MultiAppender, opts BatchOptions, sizes prometheus.Observer) *batcher {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 256
	}
	if opts.Committers <= 0 {
		opts.Committers = 2
	}
	if opts.QueueLen <= 0 {
		opts.QueueLen = 4096
	}
	b := &batcher{multi: multi, opts: opts, sizes: sizes, stop: make(chan struct{})}
	for i := 0; i < opts.Committers; i++ {
		c := b.newCommitter()
		b.queues = append(b.queues, c.queue)
		b.wg.Add(1)
		go c.loop()
	}
	return b
}

// close stops the committers after the queue drains. Callers must not submit after.
func (b *batcher) close() {
	b.once.Do(func() {
		b.mu.Lock() // after the sends under way: the committers still take them
		b.closed = true
		b.mu.Unlock()
		close(b.stop)
	})
	b.wg.Wait()
}

// submit appends parts atomically, in a shared transaction when others are queued.
func (b *batcher) submit(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	r, err := b.enqueue(ctx, parts, "", 0)
	if err != nil {
		return nil, err
	}
	// Once queued, the outcome is waited for even if ctx ends: the append may
	// commit, and the caller must learn it rather than guess.
	resp := <-r.done
	return resp.res, resp.err
}

// enqueue queues parts for a transaction and returns at once; the outcome
// arrives on the request's done channel. home names the committer, so that one
// stream's requests stay in order: the stream the request joins the chain of
// ("": the last part's).
func (b *batcher) enqueue(ctx context.Context, parts []eventstore.StreamAppend, home string, chain uint64) (*appendReq, error) {
	if home == "" {
		home = parts[len(parts)-1].Stream
	}
	r := &appendReq{ctx: ctx, parts: parts, done: make(chan appendResp, 1), chain: chain, home: home}
	q := b.queues[0]
	if len(b.queues) > 1 {
		h := fnv.New32a()
		h.Write([]byte(r.home))
		q = b.queues[h.Sum32()%uint32(len(b.queues))]
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, errBatcherClosed
	}
	select {
	case q <- r:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

var errBatcherClosed = errors.New("ledger: group commit is closed")

// committer commits the requests of its queue, one transaction at a time, so
// that the requests of a stream reach the store in the order they were queued.
type committer struct {
	b     *batcher
	queue chan *appendReq
	// dead are the pipeline chains of a stream that a refused or failed request
	// broke: the later requests of the chain were decided on a state the store
	// does not hold, and are answered without being written. (Their expected
	// revisions alone would not stop them: another instance's event may sit at
	// the failed request's revision.) One entry per stream: a chain that follows
	// is a new one.
	dead map[string]uint64
}

func (b *batcher) newCommitter() *committer {
	return &committer{b: b, queue: make(chan *appendReq, max(1, b.opts.QueueLen/b.opts.Committers)), dead: map[string]uint64{}}
}

func (c *committer) loop() {
	defer c.b.wg.Done()
	var carry []*appendReq // requests deferred because their streams overlapped a batch
	for {
		var batch []*appendReq
		batch, carry = append(batch, carry...), nil
		if len(batch) == 0 {
			select {
			case r := <-c.queue:
				batch = append(batch, r)
			case <-c.b.stop:
				c.drain()
				return
			}
		}
		batch = c.fill(batch)
		batch, carry = splitOverlaps(batch)
		c.commit(batch)
	}
}

// fill adds queued requests up to MaxBatch, waiting at most MaxWait for more.
func (c *committer) fill(batch []*appendReq) []*appendReq {
	b, queue := c.b, c.queue
	var deadline <-chan time.Time
	if b.opts.MaxWait > 0 {
		t := time.NewTimer(b.opts.MaxWait)
		defer t.Stop()
		deadline = t.C
	}
	for len(batch) < b.opts.MaxBatch {
		select {
		case r := <-queue:
			batch = append(batch, r)
			continue
		default:
		}
		if deadline == nil {
			return batch
		}
		select {
		case r := <-queue:
			batch = append(batch, r)
		case <-deadline:
			return batch
		}
	}
	return batch
}

// drain answers what is still queued at shutdown, one by one, in order.
func (c *committer) drain() {
	for {
		select {
		case r := <-c.queue:
			c.commit([]*appendReq{r})
		default:
			return
		}
	}
}

// splitOverlaps keeps the requests that one transaction can carry and defers the
// rest, in order: a request that names a stream already in the batch is kept only
// when each such part follows the one before it (expects the revision it leaves:
// pipelined commands of one account); otherwise it waits for the next batch, and
// so does every later request of its streams. Two different requests claiming
// the same key (both expect no stream) are the case the deferral guards.
func splitOverlaps(batch []*appendReq) (keep, deferred []*appendReq) {
	const unchainable = -2       // a part expecting no exact revision: nothing follows it
	next := map[string]int64{}   // stream -> the last revision its kept parts leave
	blocked := map[string]bool{} // streams of deferred requests
	follows := func(r *appendReq) bool {
		for _, p := range r.parts {
			if blocked[p.Stream] {
				return false
			}
			if last, seen := next[p.Stream]; seen {
				if exp, ok := p.Expected.LastBefore(); !ok || last == unchainable || exp != last {
					return false
				}
			}
		}
		return true
	}
	for _, r := range batch {
		if !follows(r) {
			deferred = append(deferred, r)
			for _, p := range r.parts {
				blocked[p.Stream] = true
			}
			continue
		}
		for _, p := range r.parts {
			if exp, ok := p.Expected.LastBefore(); ok {
				next[p.Stream] = exp + int64(len(p.Events))
			} else {
				next[p.Stream] = unchainable
			}
		}
		keep = append(keep, r)
	}
	return keep, deferred
}

// commit appends a batch in one transaction, peeling off a request whose stream
// refuses (with the requests decided on top of it) and retrying the rest,
// bounded by the batch's size.
func (c *committer) commit(batch []*appendReq) {
	for len(batch) > 0 {
		live := batch[:0]
		for _, r := range batch {
			switch {
			case r.ctx.Err() != nil: // nobody waits for it and nothing was written
				c.fail(r, r.ctx.Err())
			case r.chain != 0 && c.dead[r.home] == r.chain:
				c.fail(r, errDecidedOnFailed)
			default:
				live = append(live, r)
			}
		}
		batch = live
		if len(batch) == 0 {
			return
		}
		var parts []eventstore.StreamAppend
		for _, r := range batch {
			parts = append(parts, r.parts...)
		}
		// The transaction is not tied to one caller's context: it carries others.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := c.b.multi.AppendMulti(ctx, parts)
		cancel()
		if err == nil {
			c.b.sizes.Observe(float64(len(batch)))
			for _, r := range batch {
				mine := res[:len(r.parts)]
				res = res[len(r.parts):]
				if r.chain != 0 && anyIdempotent(mine) {
					// Its events were stored already, by another instance: the
					// rest of its chain was decided on this one's version of them.
					c.dead[r.home] = r.chain
				}
				r.answer(appendResp{res: mine})
			}
			return
		}
		var wrong *eventstore.WrongExpectedRevisionError
		if errors.As(err, &wrong) {
			if i := owner(batch, wrong.Stream); i >= 0 {
				batch = c.peel(batch, i, err)
				continue
			}
		}
		var dup *eventstore.DuplicateEventIDError
		if errors.As(err, &dup) {
			if i := eventOwner(batch, dup.ID); i >= 0 {
				batch = c.peel(batch, i, err)
				continue
			}
		}
		if len(batch) == 1 {
			c.fail(batch[0], err)
			return
		}
		for _, r := range batch { // unknown culprit: each alone, in order
			c.commit([]*appendReq{r})
		}
		return
	}
}

// anyIdempotent reports whether the store held the events of any part already.
func anyIdempotent(res []eventstore.AppendResult) bool {
	for _, x := range res {
		if x.Idempotent {
			return true
		}
	}
	return false
}

// fail answers r with err; nothing of r was written, so the rest of its chain
// must not be either.
func (c *committer) fail(r *appendReq, err error) {
	if r.chain != 0 {
		c.dead[r.home] = r.chain
	}
	r.answer(appendResp{err: err})
}

// errDecidedOnFailed answers a request that was decided on top of one that was
// not written (a part of the same stream before it, in its transaction or its
// pipeline chain): its expected revision cannot be trusted, so its caller
// decides again on the store's head.
var errDecidedOnFailed = fmt.Errorf("%w: an earlier command of the stream was not written", eventstore.ErrWrongExpectedRevision)

// peel answers batch[i] with err, and every later request that shares a stream
// with a request answered so with errDecidedOnFailed, and returns the rest.
func (c *committer) peel(batch []*appendReq, i int, err error) []*appendReq {
	failed := map[string]bool{}
	keep := batch[:i:i]
	for j, r := range batch[i:] {
		shares := j == 0
		for _, p := range r.parts {
			shares = shares || failed[p.Stream]
		}
		if !shares {
			keep = append(keep, r)
			continue
		}
		for _, p := range r.parts {
			failed[p.Stream] = true
		}
		if j == 0 {
			c.fail(r, err)
		} else {
			c.fail(r, errDecidedOnFailed)
		}
	}
	return keep
}

func owner(batch []*appendReq, stream string) int {
	for i, r := range batch {
		for _, p := range r.parts {
			if p.Stream == stream {
				return i
			}
		}
	}
	return -1
}

// eventOwner is the index of the request in batch that carries the event id.
func eventOwner(batch []*appendReq, id uuid.UUID) int {
	for i, r := range batch {
		for _, p := range r.parts {
			for _, e := range p.Events {
				if e.ID == id {
					return i
				}
			}
		}
	}
	return -1
}
