package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// The write path (ARCHITECTURE decisions 5 and 16): every command is decided
// under its streams' locks in one attempts loop (underLocks): load, decide
// on the pending state, append (pipelined where the store group-commits,
// pipeline.go), and on a refusal decide again on the store's head. A command
// of one account takes it through decideOnAccount; a write over several
// accounts through its mover (mover.go); a transfer stream's through
// decideOnTransfer (transfers.go). Events are encoded here with their
// deterministic IDs and metadata (encodeEvents), and the key's claim written
// with the decision (claims.go).

// attempt is one pass of underLocks' loop: its number (0 first) and the locks
// it holds.
type attempt struct {
	n      int
	locks  *heldLocks
	waited bool
}

// waitUncounted releases the locks, waits for ch and takes them again; the pass
// that waited is not counted as an attempt (it decided nothing).
func (a *attempt) waitUncounted(ctx context.Context, ch <-chan struct{}) error {
	a.waited = true
	return a.locks.waitFor(ctx, ch)
}

// underLocks is the one attempts loop of the command side: it takes the locks
// of the streams a command is decided on, in order (an account command's one
// stream; a transaction's accounts and its stream; a capture into an account;
// a transfer's stream), and calls try until it answers without asking to retry
// (retry: another instance wrote one of the streams, a command decided before
// this one failed, or the decision is to be taken again on the store's head),
// at most Options.MaxAttempts counted attempts, and releases the locks. try
// may give the locks up while it waits (a pipelined append, attempt.locks); a
// pass that only waited for a key's append in flight is not counted
// (attempt.waitUncounted).
func (s *Service) underLocks(ctx context.Context, streams []string, try func(a *attempt) (r Reply, retry bool, err error)) (Reply, error) {
	l := &heldLocks{s: s, streams: streams}
	if err := l.lock(ctx); err != nil {
		return Reply{}, err
	}
	defer l.unlock()
	return s.attempts(ctx, &attempt{locks: l}, try)
}

// attempts is underLocks' loop from attempt a on, a's locks held.
func (s *Service) attempts(ctx context.Context, a *attempt, try func(a *attempt) (r Reply, retry bool, err error)) (Reply, error) {
	for a.n < s.opts.MaxAttempts {
		a.waited = false
		r, retry, err := try(a)
		var refused *earlierRefusedWait
		if errors.As(err, &refused) { // decided nothing: again once it is decided again
			s.metrics.refusalWaits.Inc()
			if err := a.waitUncounted(ctx, refused.ch); err != nil {
				return Reply{}, err
			}
			continue
		}
		if err != nil || !retry {
			return r, err
		}
		if !a.waited {
			a.n++
		}
		if err := s.appends.afterEarlier(ctx, a); err != nil {
			return Reply{}, err
		}
	}
	return Reply{}, ErrTooManyConflicts
}

// outcome is what an attempt at a command comes to: an answer (r), or to
// decide again (retry); neither while the command goes on (for example its
// append succeeded and its reply is yet to be made).
type outcome struct {
	r        Reply
	answered bool
	retry    bool
}

// answer is the outcome that answers r.
func answer(r Reply) outcome { return outcome{r: r, answered: true} }

// decided reports whether the attempt is over: answered, or to be taken again.
func (o outcome) decided() bool { return o.answered || o.retry }

// drain waits, holding the stream's lock, until no pipelined append is in
// flight on it: its cached aggregate is then what the store holds (or stale,
// and reloaded by the next load).
func (s *Service) drain(ctx context.Context, stream string) error {
	if ch := s.pipes.inflightChan(stream); ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// accountWrite is a command the write path decides on one account stream:
// what it is, fixed across its attempts, and the state of the attempt under
// way (the aggregate it is decided on, how the next attempt is taken, and
// the answer once there is one).
type accountWrite struct {
	cmd       domain.Command
	req       domain.Canonical
	stream    string
	accountID string
	// claim: the key's claim is written with the decision (client commands;
	// saga steps where the key finder finds steps by their claims).
	claim bool

	acc   *domain.Account // the (pending) aggregate this attempt decides on
	chain uint64          // its pipeline chain (pipeline.go)
	next  nextAttempt
	ans   accountAnswer
	// apart: a pipelined append is not waited for in place but left queued
	// (queued), its commit waited for apart (queued.go: batch elements).
	apart  bool
	queued *queuedWrite
	// first is the key's first event, found in the store before the first
	// attempt (decidedBefore: a resend of a key decided long ago): its record
	// is rebuilt from it, not read again under the lock.
	first *eventstore.RecordedEvent
	// rec is the key's record its pipelined append folded, once that append
	// succeeded (finishPipelined): the answer, even should the pending
	// aggregate have forgotten it since (afterAccountAppend).
	rec *domain.KeyRecord
}

// nextAttempt is how the next attempt at a command is taken.
type nextAttempt struct {
	refresh bool // decide on the store's head, not the cache
	recall  bool // the key may have been decided long ago, its record forgotten: look it up in the store
}

// accountAnswer is what a command decided on an account answers: a copy of
// the key's record (duplicate: decided before this call), or, for outcomes
// that leave no record (invalid, refused without record, key conflict), the
// reply; neither while the key is not decided.
type accountAnswer struct {
	rec       *ownedRecord
	duplicate bool
	r         *Reply
}

// known reports whether the answer is given.
func (a accountAnswer) known() bool { return a.rec != nil || a.r != nil }

// reply is the answer as the client gets it.
func (a accountAnswer) reply() Reply {
	if a.r != nil {
		return *a.r
	}
	return ownedRecordReply(a.rec, a.duplicate)
}

// decideOnAccount decides cmd against an account stream under the stream's lock:
// a known key is answered from its record (duplicate), otherwise the command is
// decided and appended with the revision it was decided on, claiming the key when
// claim is set (client commands; saga steps and schedulers use derived keys and
// write no claim).
//
// On a store that group-commits, the append is pipelined (pipeline.go): the lock
// is released while it commits, and the next command of the stream is decided on
// the state it will leave.
func (s *Service) decideOnAccount(ctx context.Context, cmd domain.Command, stream, accountID string, claim bool) (accountAnswer, error) {
	w, err := s.newAccountWrite(ctx, cmd, stream, accountID, claim)
	if err != nil {
		return accountAnswer{}, err
	}
	_, err = s.underLocks(ctx, []string{stream}, s.accountAttempt(ctx, w))
	return w.ans, err
}

// newAccountWrite is the write of cmd on an account stream, before its
// first attempt (decideOnAccount).
func (s *Service) newAccountWrite(ctx context.Context, cmd domain.Command, stream, accountID string, claim bool) (*accountWrite, error) {
	w := &accountWrite{cmd: cmd, stream: stream, accountID: accountID, claim: claim}
	var err error
	if e := batchElementOf(ctx); e != nil && e.key.looked && e.key.stream == stream && e.key.key == cmd.IdempotencyKey {
		w.first = e.key.first // looked up with its batch's (runBatch)
	} else if w.first, err = s.keys.decidedBefore(ctx, stream, cmd.IdempotencyKey); err != nil {
		return nil, err
	}
	w.next.recall = w.first != nil
	if !w.claim && s.keys.stepsClaim() { // a saga step claims its key too: that is how it is found once forgotten
		w.claim, w.cmd.Claimed = true, true
	}
	w.req = w.cmd.Canonical()
	return w, nil
}

// accountAttempt is an attempt at w (underLocks' try): once nothing asks it
// to wait (pipes.before), decideOnAccountOnce.
func (s *Service) accountAttempt(ctx context.Context, w *accountWrite) func(a *attempt) (Reply, bool, error) {
	return func(a *attempt) (Reply, bool, error) {
		if wait := s.pipes.before(w.stream, w.cmd.IdempotencyKey, s.keyLimit); wait != nil {
			return Reply{}, true, a.waitUncounted(ctx, wait)
		}
		again, err := s.decideOnAccountOnce(ctx, a.locks, w)
		return Reply{}, again, err
	}
}

// decideOnAccountOnce is one attempt of decideOnAccount, under the stream's
// lock: the key answered from what is known of it, or the command decided on
// the (pending) state and appended; again asks for another attempt, w.next
// saying how to take it.
func (s *Service) decideOnAccountOnce(ctx context.Context, l *heldLocks, w *accountWrite) (again bool, err error) {
	p, err := s.loadPending(ctx, w.stream, w.accountID, w.next.refresh)
	if err != nil {
		return false, err
	}
	if err := s.batchTurn(ctx); err != nil {
		return false, err
	}
	w.acc, w.chain = p.acc, p.chain
	if w.ans, err = s.answerKnownKey(ctx, w, w.next.recall || s.keys.first(w.acc) || w.acc.MayHaveDecided(w.cmd.IdempotencyKey, s.residents.print)); err != nil || w.ans.known() {
		return false, err
	}
	switch err := s.recallForgotten(ctx, w.stream, w.acc, w.cmd); {
	case errors.Is(err, domain.ErrRecallUnsettled):
		w.next.refresh = true
		return true, s.settleBeforeDecidingAgain(ctx, l, w.stream)
	case err != nil:
		return false, err
	}
	d := domain.DecideAccount(w.acc, w.cmd)
	if d.Invalid != nil || len(d.Events) == 0 {
		if !w.next.refresh || !w.next.recall {
			w.next = nextAttempt{refresh: true, recall: true}
			return true, s.settleBeforeDecidingAgain(ctx, l, w.stream)
		}
		r := unwrittenReply(w.cmd, d)
		w.ans = accountAnswer{r: &r}
		return false, nil
	}
	res, err := s.appends.account(ctx, l, w, d.Events)
	if w.queued != nil {
		return false, nil // its commit is waited for apart (queued.go)
	}
	return s.afterAccountAppend(w, res, err)
}

// afterAccountAppend is decideOnAccountOnce once w's append has resolved
// (res, err), the stream's lock held: the answer, or again to decide again.
func (s *Service) afterAccountAppend(w *accountWrite, res written, err error) (again bool, _ error) {
	if err != nil || res.idempotent {
		w.ans.r, err = s.afterRefusedAppend(w, res, err)
		return w.ans.r == nil && err == nil, err
	}
	kr := w.rec // the record its pipelined append folded, forgotten or not
	if kr == nil {
		kr = w.acc.Keys[w.cmd.IdempotencyKey] // appended holding the lock throughout
	}
	w.rec = nil
	if kr == nil {
		return false, fmt.Errorf("ledger: %s: key %q not found after its own append", w.stream, w.cmd.IdempotencyKey)
	}
	s.tookCommand(w.stream, w.acc, int64(res.events[len(res.events)-1].Revision))
	w.ans = accountAnswer{rec: copyRecord(kr)}
	return false, nil
}

// settleBeforeDecidingAgain waits, the stream's lock released, for its appends
// in flight to settle, before a decision that writes nothing is taken again on
// the store's head: nothing is written, so no expected revision would catch a
// cache that another instance left behind (one that may hold this very key, or
// the state that makes the command valid), and a pending state is never caught
// up from the store.
func (s *Service) settleBeforeDecidingAgain(ctx context.Context, l *heldLocks, stream string) error {
	if wait := s.pipes.settle(stream); wait != nil {
		return l.waitFor(ctx, wait)
	}
	return nil
}

// unwrittenReply is the reply to a decision that writes nothing: invalid, or
// refused without a record.
func unwrittenReply(cmd domain.Command, d domain.Decision) Reply {
	if d.Invalid != nil {
		return reply.Invalid(cmd.IdempotencyKey, d.Invalid)
	}
	return reply.NotRecorded(cmd.IdempotencyKey, d.Rejection)
}

// answerKnownKey answers a key w's stream already decided, from the
// aggregate's record (w.acc) or, when recall is set and the aggregate forgot
// it, from the store: the record (duplicate) or the conflict's reply; nothing
// for a key never decided.
func (s *Service) answerKnownKey(ctx context.Context, w *accountWrite, recall bool) (accountAnswer, error) {
	key := w.cmd.IdempotencyKey
	rec := w.acc.Keys[key]
	if rec == nil && recall {
		var err error
		if rec, err = s.keyRecordFrom(ctx, w.stream, w.acc, key, w.first); err != nil {
			return accountAnswer{}, err
		}
	}
	j, err := domain.Judge(rec.DecidedFor(func() ([]byte, error) { return s.recordRequest(ctx, w.stream, rec) }), w.req)
	switch {
	case err != nil:
		return accountAnswer{}, err
	case j.Verdict == domain.KeyConflict:
		r := reply.Conflict(key, j.Fields)
		return accountAnswer{r: &r}, nil
	case j.Verdict == domain.KeyDuplicate:
		return accountAnswer{rec: copyRecord(rec), duplicate: true}, nil
	}
	return accountAnswer{}, nil
}

// afterRefusedAppend handles an append of w's decision that wrote nothing
// (err, or res idempotent): the reply when there is one to give, an error when
// the append failed otherwise; else it sets w.next, how to decide again, and
// the caller does.
func (s *Service) afterRefusedAppend(w *accountWrite, res written, err error) (*Reply, error) {
	var conflict *claimConflict
	switch {
	case errors.As(err, &conflict):
		r := reply.Conflict(w.cmd.IdempotencyKey, conflict.fields)
		return &r, nil
	case errors.Is(err, eventstore.ErrWrongExpectedRevision):
		// Another instance wrote, or a command this one was decided on top
		// of failed (perhaps a resend of a key the aggregate forgot, as this
		// one may be): catch up and decide again, the key looked up first.
		w.next = nextAttempt{refresh: true, recall: w.acc.Forgot()}
		s.metrics.appendsRefused.Inc()
	case errors.Is(err, eventstore.ErrDuplicateEventID):
		// The store holds this key's events already: it was decided long ago
		// (the aggregate forgot it) or by another instance. Answer it from them.
		w.next = nextAttempt{refresh: true, recall: true}
		s.keys.noteOldKey(w.stream)
	case err != nil:
		return nil, err
	case res.idempotent:
		// The store already held this key's events: another instance decided
		// it before this cache saw them. Answer it as the duplicate it is,
		// from the store's own record.
		w.next = nextAttempt{refresh: true, recall: true}
	}
	return nil, nil
}

// tookCommand accounts for an aggregate that took a command, durable up to
// revision durable: the closed holds and refunded originals it may forget now, its size in the cache,
// and a snapshot when one is due and nothing is in flight on it (so that it is
// durable). The caller holds the stream's lock.
func (s *Service) tookCommand(stream string, acc *domain.Account, durable int64) {
	acc.ForgetDurable(durable)
	if cached, ok := s.accounts.c.Peek(stream); !ok || cached != acc {
		return
	}
	s.accounts.resize(stream, acc)
	if s.pipes.idle(stream) {
		s.snapshotIfDue(stream, acc)
	}
}

// appendAccount appends w's decision (events, decided on w.acc) and folds it
// into the cached aggregate, holding the stream's lock throughout (a store
// without group commit).
func (s *Service) appendAccount(ctx context.Context, w *accountWrite, events []domain.NewEvent) (written, error) {
	var (
		res written
		err error
	)
	d, head := decision{cmd: w.cmd, req: w.req, events: events}, streamHead{stream: w.stream, last: w.acc.Revision, chain: w.acc.LastChain}
	if w.claim {
		res, err = s.appendDecision(ctx, d, head)
	} else {
		res, err = s.appendStep(ctx, d, head)
	}
	if err == nil {
		res.idempotent, err = s.repeats.foundAt(ctx, w.stream, res)
	}
	if err != nil || res.idempotent {
		return res, err
	}
	return res, s.applyWritten(ctx, w.stream, w.acc, res)
}

// appendPipelined folds w's decision (events) into the pending aggregate,
// queues its append behind the stream's appends in flight, and waits for it
// with the stream's lock released (appendHot). On return the lock is held
// again; on success the key's record in w.acc is durable, its position set.
// When w.apart, it returns once queued, leaving the wait to w.queued's owner
// (queued.go).
func (s *Service) appendPipelined(ctx context.Context, l *heldLocks, w *accountWrite, events []domain.NewEvent) (written, error) {
	acc := w.acc
	e, err := s.encodeEvents(decision{cmd: w.cmd, req: w.req, events: events}, streamHead{stream: w.stream, last: acc.Revision, chain: acc.LastChain})
	if err != nil {
		return written{}, err
	}
	parts := []eventstore.StreamAppend{e.part(eventstore.ExactOrNoStream(acc.Revision))}
	if w.claim {
		c, err := s.claimPart(w.cmd, w.req, w.stream, e.first)
		if err != nil {
			return written{}, err
		}
		parts = append([]eventstore.StreamAppend{c}, parts...)
	}
	q, err := s.queueHot(ctx, l, parts, hotLeg{stream: w.stream, acc: acc, chain: w.chain, key: w.cmd.IdempotencyKey, w: e.pending()}, nil)
	if err != nil {
		return s.pipelinedOutcome(ctx, w, parts, nil, err)
	}
	qw := &queuedWrite{hot: q}
	if w.apart {
		w.queued = qw
		return written{}, nil
	}
	return s.finishPipelined(ctx, w, qw, <-q.r.done)
}

// queuedWrite is an account command's write queued on its pipeline
// (appendPipelined), its outcome not yet waited for.
type queuedWrite struct{ hot *queuedHot }

// finishPipelined is appendPipelined after the wait, given the outcome of
// the write queued (q, resp): the stream's lock is held again on return.
func (s *Service) finishPipelined(ctx context.Context, w *accountWrite, q *queuedWrite, resp appendResp) (written, error) {
	res, err := s.finishHot(ctx, q.hot, resp)
	if err == nil && !anyIdempotent(res) {
		w.rec = q.hot.rec
		return q.hot.hot.w, nil // the events as they were folded, now durable
	}
	return s.pipelinedOutcome(ctx, w, q.hot.parts, res, err)
}

// pipelinedOutcome is what appendPipelined answers for a write of parts
// that was refused or failed (err), or found its events stored already (res).
func (s *Service) pipelinedOutcome(ctx context.Context, w *accountWrite, parts []eventstore.StreamAppend, res []eventstore.AppendResult, err error) (written, error) {
	switch {
	case err != nil && w.claim:
		return written{}, s.claimError(ctx, parts[0].Stream, w.req, err)
	case err != nil:
		return written{}, err
	}
	return written{idempotent: anyIdempotent(res)}, nil
}

// ownedRecord is a key record copied out of a cached aggregate, with its account
// view made once, so that a reply can point at both.
type ownedRecord struct {
	domain.KeyRecord
	after domain.AccountView
}

// copyRecord copies a record out of a cached aggregate, so that it can be read
// after the stream's lock is released.
func copyRecord(rec *domain.KeyRecord) *ownedRecord {
	c := &ownedRecord{KeyRecord: *rec, after: rec.After()}
	c.Events = append([]domain.EventRef(nil), rec.Events...)
	return c
}

// recordRequest reads the canonical request a key was decided for, for a
// conflict's fields. Records keep only the request's hash: the request itself
// is read from the metadata of the key's first event in the stream (one read,
// on this rare path), the event the record was started from; nil when the
// record has no event.
func (s *Service) recordRequest(ctx context.Context, stream string, rec *domain.KeyRecord) ([]byte, error) {
	if len(rec.Events) == 0 {
		return nil, nil
	}
	first := rec.Events[0]
	evs, err := s.store.ReadStream(ctx, stream, first.Revision, eventstore.Forwards, 1)
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 || evs[0].ID != first.ID {
		return nil, fmt.Errorf("ledger: %s: the first event of key %q is not at revision %d", stream, rec.Key, first.Revision)
	}
	m, err := domain.DecodeMetadata(evs[0].Metadata)
	if err != nil {
		return nil, err
	}
	return m.Request, nil
}

// written is a successful append: the events as they now stand in the stream.
type written struct {
	events []domain.StoredEvent
	// payloads are the events' decided data, in order (what events[i].Data encodes).
	payloads []any
	// idempotent: the store already held these events and wrote nothing.
	idempotent bool
}

// applyWritten folds freshly written events into the cached aggregate. Should the
// cache be behind (another instance wrote just before), it catches up instead.
func (s *Service) applyWritten(ctx context.Context, stream string, acc *domain.Account, w written) error {
	if len(w.events) > 0 && int64(w.events[0].Revision) != acc.Revision+1 {
		_, err := s.loadAccount(ctx, stream, acc.ID, true)
		return err
	}
	for i, ev := range w.events {
		if err := domain.EvolveAccountDecided(acc, ev, w.payloads[i]); err != nil {
			s.accounts.c.Remove(stream)
			return err
		}
	}
	return nil
}

// decision is what a command decided on one stream, to encode there: the
// command, the client's canonical request (carried by the first event; a
// saga's steps and markers carry their client's), and the events.
type decision struct {
	cmd    domain.Command
	req    domain.Canonical
	events []domain.NewEvent
}

// streamHead is where a decision's events go: after the stream's event at
// revision last (-1: none), whose chain hash is chain ("" for none).
type streamHead struct {
	stream string
	last   int64
	chain  string
}

// encoded is a decision's events as they are appended at a stream head:
// their data, with deterministic IDs and metadata (encodeEvents).
type encoded struct {
	stream string
	first  uint64 // the revision of the first event
	data   []eventstore.EventData
	metas  []domain.Metadata
	events []domain.NewEvent // what data encodes, in order
}

// part appends the events expecting expected.
func (e encoded) part(expected eventstore.ExpectedRevision) eventstore.StreamAppend {
	return eventstore.StreamAppend{Stream: e.stream, Expected: expected, Events: e.data}
}

// written is the events as the append whose result is res left them.
func (e encoded) written(res eventstore.AppendResult) written {
	w := written{events: make([]domain.StoredEvent, len(e.data)), payloads: make([]any, len(e.data)), idempotent: res.Idempotent}
	for i, d := range e.data {
		w.events[i] = domain.StoredEvent{ID: d.ID, Stream: e.stream, Revision: res.FirstRevision + uint64(i), Type: d.Type, Data: d.Data, Metadata: e.metas[i]}
		w.payloads[i] = e.events[i].Data
	}
	if n := len(w.events); n > 0 {
		w.events[n-1].Position = res.Position.String()
	}
	return w
}

// pending is the events as they will stand once appended where they were
// encoded (no position yet): what a pending state folds before the append.
func (e encoded) pending() written {
	return e.written(eventstore.AppendResult{FirstRevision: e.first})
}

// encodeEvents turns d's events into event data at head with deterministic
// IDs and metadata; the first event carries the canonical request. Each
// event's metadata carries its chain hash, linked to head's.
func (s *Service) encodeEvents(d decision, head streamHead) (encoded, error) {
	key, first, prevChain := d.cmd.IdempotencyKey, uint64(head.last+1), head.chain
	e := encoded{stream: head.stream, first: first, data: make([]eventstore.EventData, len(d.events)), metas: make([]domain.Metadata, len(d.events)), events: d.events}
	for i, ev := range d.events {
		data, err := json.Marshal(ev.Data)
		if err != nil {
			return encoded{}, fmt.Errorf("ledger: encode %s: %w", ev.Type, err)
		}
		m := domain.Metadata{Key: key, Command: string(d.cmd.Type), RequestHash: d.req.Hash, Index: i, Count: len(d.events), At: d.cmd.At, Origin: d.cmd.Origin, Producer: s.opts.Producer, Schema: 1, Claimed: d.cmd.Claimed, Subject: domain.EventSubject(ev), EffectiveAt: d.cmd.EffectivePtr()}
		if i == 0 {
			m.Request = d.req.JSON
		}
		id := domain.EventID(key, head.stream, i)
		m.Chain = domain.ChainHash(prevChain, domain.StoredEvent{ID: id, Stream: head.stream, Revision: first + uint64(i), Type: ev.Type, Data: data, Metadata: m})
		prevChain = m.Chain
		meta, err := domain.EncodeMetadata(m)
		if err != nil {
			return encoded{}, err
		}
		e.data[i] = eventstore.EventData{ID: id, Type: ev.Type, Data: data, Metadata: meta, Subject: m.Subject}
		e.metas[i] = m
	}
	return e, nil
}

// lastChain is the chain hash of the last event encoded ("" for none).
func (e encoded) lastChain() string {
	if len(e.metas) == 0 {
		return ""
	}
	return e.metas[len(e.metas)-1].Chain
}

// appendDecision writes a client command's decision to its home stream (at
// head) together with the claim of its key (see claims.go).
func (s *Service) appendDecision(ctx context.Context, d decision, head streamHead) (written, error) {
	e, err := s.encodeEvents(d, head)
	if err != nil {
		return written{}, err
	}
	claim, err := s.claimPart(d.cmd, d.req, head.stream, e.first)
	if err != nil {
		return written{}, err
	}
	res, err := s.appendWithClaim(ctx, claim, e.part(eventstore.ExactOrNoStream(head.last)), d.req)
	if err != nil {
		return written{}, err
	}
	return e.written(res), nil
}

// appendStep writes an internal step's decision (a derived key: no claim).
func (s *Service) appendStep(ctx context.Context, d decision, head streamHead) (written, error) {
	e, err := s.encodeEvents(d, head)
	if err != nil {
		return written{}, err
	}
	res, err := s.appends.one(ctx, e.part(eventstore.ExactOrNoStream(head.last)))
	if err != nil {
		return written{}, err
	}
	return e.written(res), nil
}
