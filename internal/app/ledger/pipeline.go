package ledger

import (
	"context"
	"sync"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// Pipelined decisions (ARCHITECTURE: hot accounts). On a store that group-commits
// (batch.go), a command on an account whose previous append is still in flight is
// decided on the state that append will leave (the pending state) and queued
// behind it, expecting the revision that follows; the stream's lock is held only
// while deciding, not while the append commits. So a hot account costs what a
// cold one costs: every command that arrives during one commit joins the next.
//
// Nothing is answered before it is durable: the caller of each command waits for
// its own transaction. A key whose append is in flight is not answered from the
// pending state either: a resend waits for the outcome. When an append fails (or
// finds other events than the ones decided: another instance wrote), the pending
// state is stale: the commands decided on top of it fail too (their expected
// revisions cannot hold: the store refuses them), the stream drains, and the next
// command reloads the account from the store and decides again, in order.

// pipe is the pipeline state of one account stream, guarded by pipes.mu. It is
// changed only by the holder of the stream's lock, except by end, which the
// command whose append resolved calls before it takes the lock again.
type pipe struct {
	// acc is the pending aggregate, pinned while appends are in flight: loads
	// return it rather than anything the cache evicted or the store holds.
	acc      *domain.Account
	inflight int
	// pending are the keys whose append is in flight, each with a channel closed
	// when it resolves.
	pending map[string]chan struct{}
	// stale: an append failed or found other events: acc is not the store's
	// state. The next command waits for the stream to drain and reloads.
	stale bool
	// drained is closed when inflight drops to 0 (made when someone waits).
	drained chan struct{}
	// room is closed when inflight drops below roomAt (made when someone
	// waits: full).
	room   chan struct{}
	roomAt int
	// settling: a reader waits for inflight to drop to 0 (settle); the
	// commands after it wait with it (full).
	settling bool
	// chain names the appends in flight, decided one on another's pending state
	// since the state was last durable: group commit writes none of a chain
	// after one of it failed (batch.go).
	chain uint64
}

type pipes struct {
	mu     sync.Mutex
	m      map[string]*pipe
	chains uint64 // the last chain named
}

func newPipes() *pipes { return &pipes{m: map[string]*pipe{}} }

// wait returns a channel to wait on before the stream's state may be read for
// key: the key's own append in flight, or a stale pipeline still draining; nil
// when the state is ready.
func (ps *pipes) wait(stream, key string) <-chan struct{} {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[stream]
	if p == nil {
		return nil
	}
	if ch, ok := p.pending[key]; ok {
		return ch
	}
	if p.stale && p.inflight > 0 {
		return p.drainedChan()
	}
	return nil
}

// full returns a channel to wait on before another command is pipelined on
// the stream: when half of keyLimit (Account.KeyLimit; 0: no limit) appends
// are in flight, the pending aggregate could forget the record of a key whose
// append is still in flight before its owner reads it, so the next command
// waits until one of them resolves (a batch of one hot account's commands
// gets there). It waits for one, not for them all: draining the stream
// stopped a hot account's decisions for a whole commit every keyLimit/2
// commands (BenchmarkBatchesHotAndSpread). A key's owner still reads its
// record within keyLimit/2 decisions of its resolution: the stream's lock
// is handed over in the order it was asked for. That does not bound the
// decisions taken between a commit and its owner's taking the lock again
// (the commits that resolve meanwhile make room for more), so the owner
// reads the record its decision folded, forgotten or not (queuedHot.rec;
// TestBatchesOnAHotAccountWithFewKeys). While a reader waits for the
// stream to settle (settle), nothing more is pipelined on it until it has:
// a hot account under a stream of batches would otherwise never settle.
// Nil when there is room.
func (ps *pipes) full(stream string, keyLimit int) <-chan struct{} {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	limit := max(1, keyLimit/2)
	p := ps.m[stream]
	switch {
	case p == nil:
		return nil
	case p.settling && p.inflight > 0:
		return p.drainedChan()
	case keyLimit <= 0 || p.inflight < limit:
		return nil
	}
	if p.room == nil {
		p.room, p.roomAt = make(chan struct{}), limit
	}
	return p.room
}

// before returns a channel to wait on, the stream's lock released, before a
// command of key is decided on the stream's (pending) state and its append
// pipelined there: the key's own append in flight or a stale pipeline
// draining (wait), else a reader settling the stream or the key limit's
// bound (full). Every write pipelined on an account asks it, whether of one
// account (decideOnAccount) or of several (loadAccounts): one that skipped
// it starved a reader waiting for the stream to settle, and could make the
// pending aggregate forget a key in flight. Nil when the command may go on.
func (ps *pipes) before(stream, key string, keyLimit int) <-chan struct{} {
	if ch := ps.wait(stream, key); ch != nil {
		return ch
	}
	return ps.full(stream, keyLimit)
}

// settle returns a channel to wait on until nothing is in flight on the stream:
// for readers that must see only durable state (lookups, saga step records, hold
// expiry). Nil when nothing is in flight.
func (ps *pipes) settle(stream string) <-chan struct{} {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[stream]
	switch {
	case p == nil:
		return nil
	case p.inflight > 0:
		p.settling = true // no more pipelined until it has (full)
		return p.drainedChan()
	}
	for _, ch := range p.pending { // durable, its owner not done with it yet
		return ch
	}
	return nil
}

func (p *pipe) drainedChan() chan struct{} {
	if p.drained == nil {
		p.drained = make(chan struct{})
	}
	return p.drained
}

// takeStale reports whether the drained stream's state is stale and, if so,
// clears it: the caller (holding the lock) reloads from the store.
func (ps *pipes) takeStale(stream string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[stream]
	if p == nil || !p.stale || p.inflight > 0 {
		return false
	}
	p.stale = false
	ps.dropIdle(stream, p)
	return true
}

// dropIdle forgets a pipe with nothing in flight, pending or stale.
func (ps *pipes) dropIdle(stream string, p *pipe) {
	if p.inflight == 0 && !p.stale && len(p.pending) == 0 {
		delete(ps.m, stream)
	}
}

// pinned is the pending aggregate of a stream with appends in flight, stale or
// not, and the chain of those appends: it is never caught up from the store (the
// store is behind it, or beside it); a decision taken on it joins its chain, so
// that group commit refuses it if an append of the chain fails, even one that
// resolves after this call. Nil and 0 when nothing is in flight.
func (ps *pipes) pinned(stream string) (*domain.Account, uint64) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.m[stream]; p != nil && p.inflight > 0 {
		return p.acc, p.chain
	}
	return nil, 0
}

// inflightChan returns a channel closed when no append is in flight on the
// stream any more; nil when none is.
func (ps *pipes) inflightChan(stream string) <-chan struct{} {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.m[stream]; p != nil && p.inflight > 0 {
		return p.drainedChan()
	}
	return nil
}

// flowing reports whether appends are in flight on the stream and its pending
// state is not stale: a decision may be pipelined on it.
func (ps *pipes) flowing(stream string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[stream]
	return p != nil && p.inflight > 0 && !p.stale
}

// idle reports whether nothing is in flight on the stream and its state is not
// stale: the cached aggregate is what the store holds.
func (ps *pipes) idle(stream string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[stream]
	return p == nil || (p.inflight == 0 && !p.stale)
}

// poison marks the stream's pending state stale without an append of its own
// (a decision that could not be folded into it): the next command waits for the
// appends in flight to drain and reloads.
func (ps *pipes) poison(stream string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.m[stream]; p != nil {
		p.stale = true
	}
}

// begin records an append of key decided on acc as in flight and returns the
// chain it belongs to: chain, the one acc was pinned by when it was loaded, or a
// new one when acc was durable (chain 0).
func (ps *pipes) begin(stream, key string, acc *domain.Account, chain uint64) uint64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[stream]
	if p == nil {
		p = &pipe{pending: map[string]chan struct{}{}}
		ps.m[stream] = p
	}
	if chain == 0 {
		ps.chains++
		chain = ps.chains
	}
	p.chain = chain
	p.acc = acc
	p.inflight++
	if _, ok := p.pending[key]; !ok { // a key is pending once (its resends wait for it: wait)
		p.pending[key] = make(chan struct{})
	}
	return p.chain
}

// end records the outcome of an append: ok false makes the pending state stale.
// The last append to resolve releases the pin. Its key stays pending until its
// owner, holding the stream's lock again, has finished its record (resolve).
func (ps *pipes) end(stream string, ok bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[stream]
	p.inflight--
	p.stale = p.stale || !ok
	if p.room != nil && p.inflight < p.roomAt {
		close(p.room)
		p.room = nil
	}
	if p.inflight > 0 {
		return
	}
	p.acc = nil
	p.settling = false
	if p.drained != nil {
		close(p.drained)
		p.drained = nil
	}
	ps.dropIdle(stream, p)
}

// resolve ends key's pending state: whoever waits for it reads its record.
func (ps *pipes) resolve(stream, key string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[stream]
	if p == nil {
		return
	}
	if ch, found := p.pending[key]; found {
		close(ch)
		delete(p.pending, key)
	}
	ps.dropIdle(stream, p)
}

// hotLeg is the account stream a write is pipelined on: decided on its pending
// state acc (chain: that state's pipeline chain, 0 when it was durable), the
// events w it writes there folded into acc before the write is queued. key is
// the client's key, pending on the stream until the write resolves.
type hotLeg struct {
	stream string
	acc    *domain.Account
	chain  uint64
	key    string
	w      written
}

// appendHot appends parts in one write pipelined on hot: it folds hot's events
// into the pending aggregate, queues the write behind the stream's appends in
// flight (joining their chain, on their committer), and waits for it with hot's
// lock released (queueHot, then finishHot). The other locks of l stay held:
// their accounts were drained, so no other request names them until this one
// resolves. When every part was written, settled runs with the results, those
// locks still held; then every lock of l is taken again, in order (hot's alone
// would invert it). On success hot's record of its events carries their
// position; it is returned, to be read rather than hot's pending aggregate,
// which may have forgotten it meanwhile (queuedHot.rec). A write that found its events stored already (another instance)
// makes the pending state stale; the caller learns it from the results.
func (s *Service) appendHot(ctx context.Context, l *heldLocks, parts []eventstore.StreamAppend, hot hotLeg, settled func(res []eventstore.AppendResult) error) ([]eventstore.AppendResult, *domain.KeyRecord, error) {
	q, err := s.queueHot(ctx, l, parts, hot, settled)
	if err != nil {
		return nil, nil, err
	}
	res, err := s.finishHot(ctx, q, <-q.r.done)
	return res, q.rec, err
}

// queuedHot is a write queued on its hot account by queueHot, whose outcome
// (q.r.done) is yet to be handed to finishHot: hot's lock is released, the
// key pending on the stream, the decision folded into its pending state.
type queuedHot struct {
	l       *heldLocks
	parts   []eventstore.StreamAppend
	hot     hotLeg
	settled func(res []eventstore.AppendResult) error
	r       *appendReq
	// rec is the record of hot's key its decision folded into the pending
	// aggregate: read through it, not through the aggregate, which may have
	// forgotten it (Account.KeyLimit) by the time the commit is known and
	// the stream's lock taken again (TestBatchesOnAHotAccountWithFewKeys).
	rec *domain.KeyRecord
}

// queueHot is appendHot up to the wait: the decision folded into the pending
// state and queued, hot's lock released, the batch element (if any) marked
// decided. On error nothing is queued and hot's lock is still held.
func (s *Service) queueHot(ctx context.Context, l *heldLocks, parts []eventstore.StreamAppend, hot hotLeg, settled func(res []eventstore.AppendResult) error) (*queuedHot, error) {
	for i, ev := range hot.w.events {
		if err := domain.EvolveAccountDecided(hot.acc, ev, hot.w.payloads[i]); err != nil {
			// Half folded: the store's state is read again, once the appends in
			// flight on this pending state have drained.
			s.accounts.c.Remove(hot.stream)
			s.pipes.poison(hot.stream)
			return nil, err
		}
	}
	var rec *domain.KeyRecord
	if len(hot.w.events) > 0 {
		rec = hot.acc.Keys[hot.w.events[0].Metadata.Key]
	}
	chain := s.pipes.begin(hot.stream, hot.key, hot.acc, hot.chain)
	// Queued whatever becomes of ctx: the decision is folded into the pending
	// state, and the commands decided on it after must find it in the queue (or
	// the batcher closed, which refuses them too).
	r, err := s.batch.enqueue(context.WithoutCancel(ctx), parts, hot.stream, chain)
	if err != nil {
		s.pipes.end(hot.stream, false)
		s.pipes.resolve(hot.stream, hot.key)
		return nil, err
	}
	// Once queued, the outcome is waited for even if ctx ends: the append may
	// commit, and the pipeline must learn it rather than guess.
	l.release(hot.stream)
	if e := batchElementOf(ctx); e != nil {
		e.markDecided()    // the batch's next command of this account decides on the pending state (batches.go)
		e.redecided(false) // and so do its later ones, if this is its decision again after a refusal
	}
	return &queuedHot{l: l, parts: parts, hot: hot, settled: settled, r: r, rec: rec}, nil
}

// finishHot is appendHot after the wait, given the write's outcome: the
// pipeline learns it (a failure makes the pending state stale, so that every
// command decided on it is refused or decided again), settled runs, and every
// lock of q.l is taken again; the key stops pending once they are.
func (s *Service) finishHot(ctx context.Context, q *queuedHot, resp appendResp) ([]eventstore.AppendResult, error) {
	hot, l := q.hot, q.l
	defer s.pipes.resolve(hot.stream, hot.key) // with the locks held again
	ok := resp.err == nil && !anyIdempotent(resp.res)
	if !ok {
		batchElementOf(ctx).refused() // before the pipeline learns it (Service.refusedBefore)
	}
	s.pipes.end(hot.stream, ok)
	var serr error
	if ok && q.settled != nil {
		serr = q.settled(resp.res)
	}
	l.unlock()
	if err := l.lock(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	switch {
	case resp.err != nil:
		return nil, resp.err
	case serr != nil:
		return nil, serr
	}
	if ok && q.rec != nil {
		q.rec.Position = resp.res[partOf(q.parts, hot.stream)].Position.String()
	}
	return resp.res, nil
}

// partOf is the index of stream's part in parts.
func partOf(parts []eventstore.StreamAppend, stream string) int {
	for i, p := range parts {
		if p.Stream == stream {
			return i
		}
	}
	return -1
}

// heldLocks are the locks of the streams a command is decided on, taken in
// their order (the caller sorts them); a pipelined command gives them up while
// it waits.
type heldLocks struct {
	s       *Service
	streams []string
	held    []func()
}

// lock takes every lock in order, or none.
func (l *heldLocks) lock(ctx context.Context) error {
	for _, st := range l.streams {
		u, err := l.s.locks.lock(ctx, st)
		if err != nil {
			l.unlock()
			return err
		}
		l.held = append(l.held, u)
	}
	return nil
}

// unlock releases the locks that are held, in reverse order.
func (l *heldLocks) unlock() {
	for i := len(l.held) - 1; i >= 0; i-- {
		if l.held[i] != nil {
			l.held[i]()
		}
	}
	l.held = l.held[:0]
}

// release gives up one stream's lock and keeps the others (every lock held).
// Taking it back alone would invert the order: unlock, then lock them all.
func (l *heldLocks) release(stream string) {
	for i, st := range l.streams {
		if st == stream && i < len(l.held) && l.held[i] != nil {
			l.held[i]()
			l.held[i] = nil
		}
	}
}

// waitFor releases the locks, waits for ch, and takes the locks again; on
// error (ctx ended) none is held.
func (l *heldLocks) waitFor(ctx context.Context, ch <-chan struct{}) error {
	l.unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return ctx.Err()
	}
	return l.lock(ctx)
}

// whenSettled runs f under the stream's lock once no append is in flight on it,
// so that f reads only durable state.
func (s *Service) whenSettled(ctx context.Context, stream string, f func() error) error {
	for {
		unlock, err := s.locks.lock(ctx, stream)
		if err != nil {
			return err
		}
		wait := s.pipes.settle(stream)
		if wait == nil {
			defer unlock()
			return f()
		}
		unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// dropStale forgets the cached state of a drained stream whose pending state went
// stale (it holds decisions the store refused): the next load reads the store.
// The caller holds the stream's lock.
func (s *Service) dropStale(stream string) {
	if s.pipes.takeStale(stream) {
		s.accounts.c.Remove(stream)
	}
}
