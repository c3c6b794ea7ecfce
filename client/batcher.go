package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// batchOverhead bounds the bytes of a batch body besides its elements and
// their commas: {"commands":[ ... ]}.
const batchOverhead = 32

// errBatchUnsupported: the ledger answered ledger.v1.cmd.batch as an unknown
// command type (a ledger before v1.2); the client sends one request per
// command from then on.
var errBatchUnsupported = errors.New("client: the ledger does not take ledger.v1.cmd.batch; sending commands alone")

// call is one attempt of a command queued for an automatic batch.
type call struct {
	typ      string
	body     []byte
	elem     []byte // the batch element: body with its type
	postings int
	ctx      context.Context
	out      chan outcome
}

// batcher coalesces concurrent calls into ledger.v1.cmd.batch requests: a
// call made while nothing is in flight goes at once; one made while requests
// are in flight waits up to the linger for others, then goes with them, at
// most maxInFlight batches awaiting replies at a time, each within the
// protocol's limits. A batch of one is sent as a plain command.
type batcher struct {
	c           *Client
	unsupported atomic.Bool

	mu        sync.Mutex
	queue     []*call
	bytes     int
	posts     int
	inflight  int
	lingering bool
}

func newBatcher(c *Client) *batcher { return &batcher{c: c} }

// attempt queues the call and waits for its outcome. A call made while
// nothing is queued or in flight is sent at once, on the caller's goroutine.
func (b *batcher) attempt(ctx context.Context, cl *call) outcome {
	b.mu.Lock()
	if b.inflight == 0 && len(b.queue) == 0 && !b.lingering {
		b.inflight++
		b.mu.Unlock()
		out := b.c.request(ctx, CommandSubjectPrefix+cl.typ, cl.body)
		b.done()
		return out
	}
	b.mu.Unlock()
	cl.ctx, cl.out = ctx, make(chan outcome, 1)
	b.enqueue(cl)
	select {
	case o := <-cl.out:
		return o
	case <-ctx.Done():
		return outcome{err: ctx.Err()}
	}
}

func (b *batcher) enqueue(cl *call) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queue = append(b.queue, cl)
	b.bytes += len(cl.elem) + 1
	b.posts += cl.postings
	switch {
	case b.inflight == 0 && !b.lingering, b.full():
		b.flushLocked()
	case !b.lingering:
		b.lingering = true
		time.AfterFunc(b.c.o.linger, b.lingered)
	}
}

func (b *batcher) full() bool {
	return len(b.queue) >= b.c.o.maxBatch || b.bytes+batchOverhead >= MaxBatchBytes || b.posts >= MaxBatchPostings
}

func (b *batcher) lingered() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lingering = false
	b.flushLocked()
}

// flushLocked sends what is queued, batch by batch, while fewer than
// maxInFlight are awaiting replies; the rest goes when one is answered.
func (b *batcher) flushLocked() {
	for len(b.queue) > 0 && b.inflight < b.c.o.maxInFlight {
		batch := b.takeLocked()
		b.inflight++
		go b.send(batch)
	}
}

// takeLocked removes the longest prefix of the queue within a batch's limits
// (at least one call).
func (b *batcher) takeLocked() []*call {
	n, size, posts := 0, batchOverhead, 0
	for _, cl := range b.queue {
		if n > 0 && (n == b.c.o.maxBatch || size+len(cl.elem)+1 > MaxBatchBytes || posts+cl.postings > MaxBatchPostings) {
			break
		}
		n, size, posts = n+1, size+len(cl.elem)+1, posts+cl.postings
	}
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	b.bytes -= size - batchOverhead
	b.posts -= posts
	if len(b.queue) == 0 {
		b.queue, b.bytes, b.posts = nil, 0, 0
	}
	return batch
}

// done ends a request in flight and sends what waited for it.
func (b *batcher) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight--
	if !b.lingering {
		b.flushLocked()
	}
}

// send makes one attempt of the batch's live calls and hands each its outcome.
func (b *batcher) send(batch []*call) {
	defer b.done()
	live := batch[:0]
	for _, cl := range batch {
		if cl.ctx.Err() == nil {
			live = append(live, cl)
		}
	}
	switch len(live) {
	case 0:
		return
	case 1:
		cl := live[0]
		cl.out <- b.c.request(cl.ctx, CommandSubjectPrefix+cl.typ, cl.body)
		return
	}
	body := batchBody(len(live), func(i int) []byte { return live[i].elem })
	out := b.c.request(context.Background(), BatchSubject, body)
	if out.final { // over the server's max payload: each goes alone
		out = outcome{err: out.err, alone: true}
	}
	for i, o := range b.split(out, len(live)) {
		live[i].out <- o
	}
}

// batchWire is a batch reply with its elements left to their callers to decode.
type batchWire struct {
	Status  Status            `json:"status"`
	Code    Code              `json:"code"`
	Message string            `json:"message"`
	Fields  []string          `json:"fields"`
	Replies []json.RawMessage `json:"replies"`
}

// split turns a batch attempt's outcome into the outcome of each of its n calls.
func (b *batcher) split(out outcome, n int) []outcome {
	outs := make([]outcome, n)
	fill := func(o outcome) []outcome {
		for i := range outs {
			outs[i] = o
		}
		return outs
	}
	if out.raw == nil {
		return fill(out)
	}
	var w batchWire
	if err := json.Unmarshal(out.raw, &w); err != nil {
		return fill(outcome{err: fmt.Errorf("client: undecodable batch reply %.200q: %w", out.raw, err), wait: true})
	}
	if len(w.Replies) == n {
		for i, r := range w.Replies {
			outs[i] = outcome{raw: r, stored: out.stored}
		}
		return outs
	}
	if w.Status == StatusInvalid && len(w.Fields) == 1 && w.Fields[0] == "type" {
		b.unsupported.Store(true)
		b.c.o.log.Warn("the ledger answered ledger.v1.cmd.batch as an unknown command type: sending commands alone", "message", w.Message)
		return fill(outcome{err: errBatchUnsupported})
	}
	// A batch refused as a whole although the client kept it within the
	// protocol's limits (a server allowing smaller messages, or an error):
	// each command is sent again, alone.
	return fill(outcome{err: fmt.Errorf("client: batch answered %s %s: %s", w.Status, w.Code, w.Message), alone: true})
}
