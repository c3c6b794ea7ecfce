package ledger

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Batches (PROTOCOL.md v1.2 §2.2, ARCHITECTURE decision 13): many commands in
// one request. Not atomic, each command goes the way it goes alone (Handle),
// and the batch is decided exactly as if its commands had been sent one after
// another: a command starts only once every earlier command it shares
// something with (an account, a key, a transfer or transaction ID; a refund,
// whose original's accounts are known only once it is found, shares with
// everything) has been decided, its append queued behind it on the accounts'
// pending states (pipeline.go) or answered. A refund waits for more: every
// earlier command answered, its append durable, since it finds its original
// in the store; so does a command whose key an earlier one carries, for that
// one, since the store's claim of the key binds it across accounts
// (scheduleBatch says why). Commands that share nothing run in
// parallel and join the same group commits. So a batch of one hot account
// costs what a spread one costs: every command is decided on the pending state
// the one before it left, and they commit together.
//
// Should a command's append be refused (a command decided before it in its
// pipeline was not written: another instance wrote its account, or the store
// failed), it is decided again only once every earlier command it shares
// something with has finished, so that the order holds when decisions are
// taken again (underLocks calls afterEarlier). Until it is decided again
// (or answered), no later command of its batch is decided on its account's
// durable state (refusedBefore): one that started once the refused command
// was decided, and loaded the account after the refusal, would be decided on
// the store's state without it, before it
// (TestBatchRefusalBetweenCheckAndLoad).
//
// Should a command answer error (nothing written: the client resends the
// batch), every later command that comes after it, through after followed
// transitively, answers error too, nothing written for it
// (ErrEarlierUndecided, earlierFailed): decided without it, it would be
// decided before it, since the resend decides the failed one first.

// maxBatchParallel bounds the commands of one batch being decided at once (a
// command waiting for an earlier one, or for its commit, does not count).
const maxBatchParallel = 128

// HandleBatch decides a ledger.v1.cmd.batch body. maxReplyBytes bounds the
// size of the reply on the wire (the NATS server's message limit; 0: none):
// a batch whose reply could not fit is invalid as a whole, naming commands,
// before anything is decided.
func (s *Service) HandleBatch(ctx context.Context, body []byte, maxReplyBytes int) Reply {
	b, ierr := domain.DecodeBatch(body)
	if ierr != nil {
		return reply.Invalid("", ierr)
	}
	postings := 0
	for _, c := range b.Commands {
		postings += len(c.Postings)
	}
	if maxReplyBytes > 0 && reply.MaxBatchReplyBytes(len(b.Commands), postings) > maxReplyBytes {
		return reply.Invalid(b.Key, &domain.InvalidError{Field: "commands", Message: "the reply to this many commands might not fit the NATS server's message limit: send fewer"})
	}
	if b.Atomic {
		return s.atomicBatch(ctx, b)
	}
	return reply.Batch(s.runBatch(ctx, b.Commands))
}

// atomicBatch decides an atomic batch as the store allows (mover.atomicBatch).
func (s *Service) atomicBatch(ctx context.Context, b domain.Batch) Reply {
	r, err := s.mover.atomicBatch(ctx, b)
	if err == nil && r.Duplicate {
		err = s.answered(ctx)
	}
	if err != nil {
		s.log.Warn("atomic batch failed", "key", b.Key, "err", err)
		return reply.Error(b.Key, err)
	}
	return r
}

// runBatch decides the commands of a batch that is not atomic, each as if
// sent alone after the ones before it, and answers them in order.
func (s *Service) runBatch(ctx context.Context, cmds []domain.BatchCommand) []Reply {
	replies := make([]Reply, len(cmds))
	elems := scheduleBatch(cmds)
	if s.waitHook != nil {
		for _, e := range elems {
			e.waitHook = s.waitHook
		}
	}
	s.lookUpBatchKeys(ctx, cmds, elems)
	slots := make(chan struct{}, maxBatchParallel)
	var wg sync.WaitGroup
	done := func(i int, r Reply) {
		replies[i] = r
		if r.Status == domain.StatusError {
			elems[i].fail() // before finish: a later command that waits for it finds it (earlierFailed)
		}
		elems[i].finish()
		wg.Done()
	}
	for i, c := range cmds {
		if c.Invalid != nil {
			replies[i] = reply.Invalid(keyOf(c.Raw), c.Invalid)
		}
	}
	for _, run := range batchRuns(cmds, elems) {
		wg.Add(len(run))
		if elems[run[0]].tryStart(slots) { // no goroutine to wait for its turn
			s.decideRunOn(ctx, cmds, elems, run, slots, done, nil)
			continue
		}
		go s.decideRun(ctx, cmds, elems, run, slots, done) // a run's commands of one account on one worker (batchruns.go)
	}
	wg.Wait()
	return s.answeredAll(ctx, replies)
}

// lookUpBatchKeys asks, for the batch's account commands on streams where
// resends of forgotten keys arrive, whether their keys were decided, in one
// request for them all (keyFinder.decidedBeforeAll), each element keeping
// its answer for newAccountWrite. Should it fail, each asks alone; so does an
// element whose key an earlier one carries (afterKey), once that one is
// answered: looked up now, its key would be found absent.
func (s *Service) lookUpBatchKeys(ctx context.Context, cmds []domain.BatchCommand, elems []*batchElement) {
	qs := make([]keyAnswer, len(cmds))
	for i, c := range cmds {
		if c.Invalid == nil && c.Type.IsClient() && isAccountCommand(c.Command) && elems[i].afterKey == nil {
			qs[i] = keyAnswer{stream: domain.AccountStream(c.AccountID), key: c.IdempotencyKey}
		}
	}
	qs, err := s.keys.decidedBeforeAll(ctx, qs)
	if err != nil {
		s.log.Warn("batch: keys not looked up together", "err", err)
		return
	}
	for i, q := range qs {
		elems[i].key = q
	}
}

// answeredAll makes the duplicates among a batch's replies durable
// (answered) with one wait for all of them, not one each: the wait covers
// every write committed before it, so every read its elements made. Should it
// fail, each duplicate is answered error instead (resend the batch).
func (s *Service) answeredAll(ctx context.Context, replies []Reply) []Reply {
	dup := slices.IndexFunc(replies, func(r Reply) bool { return r.Duplicate })
	if dup < 0 {
		return replies
	}
	err := s.answered(ctx)
	if err == nil {
		return replies
	}
	s.log.Warn("batch: duplicates not known durable", "key", replies[dup].IdempotencyKey, "err", err)
	for i, r := range replies {
		if r.Duplicate {
			replies[i] = reply.Error(r.IdempotencyKey, err)
		}
	}
	return replies
}

// batchElement is a command of a batch that is not atomic, in its order: it
// starts once the earlier commands it shares something with (after) are
// decided, and is decided again after a refused append only once they have
// all finished.
type batchElement struct {
	after []*batchElement
	// afterAnswers: the command starts only once the ones it comes after
	// have finished, not merely been decided (a refund: scheduleBatch).
	afterAnswers bool
	// afterKey is the last earlier command with the same key, if any: the
	// command starts only once it has finished (scheduleBatch), and looks
	// its key up then, not with the batch's (lookUpBatchKeys).
	afterKey *batchElement
	// decided is closed once the command is decided: its append queued (its
	// account's pending state holds it) or its answer given.
	decided     chan struct{}
	decidedOnce sync.Once
	// slots, once it has one, holds the command's slot among those being
	// decided (maxBatchParallel) until it is decided.
	slots chan struct{}
	// finished is closed once the command and every earlier one it shares
	// something with have their answers: once unfinished, the command itself
	// (until answered) and each of after not finished yet, falls to zero.
	// waiters are the later commands whose after holds this one. Counted, not
	// waited for: a goroutine per command waiting for the ones before it cost
	// its creation and its wake-ups on every element (BENCHMARKS.md).
	finished   chan struct{}
	unfinished atomic.Int32
	waiters    []*batchElement
	// key is whether its key was decided, looked up with the batch's
	// (lookUpBatchKeys), when it was.
	key keyAnswer
	// index is the command's place in its batch, whose commands refused and
	// not yet decided again are refusals.
	index    int
	refusals *batchRefusals
	answered bool // guarded by refusals.mu: finish was called
	// failed: the command answered error (an infrastructure failure left it
	// undecided), set before it finishes (runBatch).
	failed atomic.Bool
	// waitHook is Service.waitHook (tests only).
	waitHook func(e, a *batchElement, ch <-chan struct{})
}

// batchRefusals are the commands of a batch whose append was refused and
// that are neither decided again nor answered yet, each with a channel
// closed once it is. No later command of the batch is decided on durable
// state meanwhile (Service.refusedBefore): it would be decided before the
// refused one, on a state without it.
type batchRefusals struct {
	mu      sync.Mutex
	pending map[int]chan struct{}
	// anyFailed: a command of the batch answered error (batchElement.fail).
	anyFailed atomic.Bool
}

// ErrEarlierUndecided answers a command of a batch that is not atomic when
// an earlier command of the batch it comes after (scheduleBatch's after,
// followed through every command in between) answered error: sent alone
// after that one, as the client resends it, it would be decided on a state
// holding it, so it is not decided now; nothing is written for it, and the
// client resends the batch (PROTOCOL.md §2.2).
var ErrEarlierUndecided = errors.New("ledger: an earlier command of the batch that this one shares an account, a key, a transfer or a transaction with was left undecided: send the batch again")

// fail records that e answered error (runBatch), before it finishes.
func (e *batchElement) fail() {
	e.failed.Store(true)
	e.refusals.anyFailed.Store(true)
}

// earlierFailed reports whether a command e comes after answered error,
// directly or through the commands it comes after in turn (scheduleBatch):
// e must then not be decided (ErrEarlierUndecided). Nothing to walk while no
// command of the batch failed, the common case. Asked before e starts
// (decideRunOn) and after every load of a decision (batchTurn): a command
// decided on the pending state of one that fails later is refused with its
// chain and decided again only after it finished (afterEarlier), so the
// load of that decision finds it failed.
func (e *batchElement) earlierFailed() bool {
	if e == nil || !e.refusals.anyFailed.Load() {
		return false
	}
	seen := map[*batchElement]bool{}
	next := slices.Clone(e.after)
	for len(next) > 0 {
		a := next[len(next)-1]
		next = next[:len(next)-1]
		if seen[a] {
			continue
		}
		if a.failed.Load() {
			return true
		}
		seen[a] = true
		next = append(next, a.after...)
	}
	return false
}

// refused records that e's append was refused (finishHot), before its
// pipeline learns it (pipes.end): a later command that finds the pipeline
// drained (pipes.pinned under pipes.mu) finds e here. Nothing once e is
// answered (a write made on its behalf after its answer).
func (e *batchElement) refused() {
	if e == nil {
		return
	}
	e.refusals.mu.Lock()
	defer e.refusals.mu.Unlock()
	if !e.answered && e.refusals.pending[e.index] == nil {
		e.refusals.pending[e.index] = make(chan struct{})
	}
}

// redecided records that e, should its append have been refused, is decided
// again (its append queued anew: queueHot) or answered (answered set).
func (e *batchElement) redecided(answered bool) {
	e.refusals.mu.Lock()
	defer e.refusals.mu.Unlock()
	e.answered = e.answered || answered
	if ch := e.refusals.pending[e.index]; ch != nil {
		close(ch)
		delete(e.refusals.pending, e.index)
	}
}

// earlierRefused is a channel to wait on before e is decided on durable
// state: an earlier command of its batch refused and not yet decided again;
// nil when there is none (or e is not a batch's). Any earlier one, whether e
// shares something with it or not: refusals are rare, and a wide wait is
// simpler to prove (Service.refusedBefore).
func (e *batchElement) earlierRefused() <-chan struct{} {
	if e == nil {
		return nil
	}
	e.refusals.mu.Lock()
	defer e.refusals.mu.Unlock()
	for i, ch := range e.refusals.pending {
		if i < e.index {
			return ch
		}
	}
	return nil
}

// refusedBefore is what a command must wait for, its locks released, before
// it is decided on the state loadPending returned it (durable or
// pending): an earlier command of its batch whose append was refused and
// that is not decided again yet (earlierRefused). Asked after every load,
// never before: the refused command is marked before its pipeline learns of
// the refusal (finishHot), and the load reads the pipeline under pipes.mu
// (pinned). So either the load found the earlier command's append in flight
// and the mark not yet set, decided on its pending state and joined its
// chain, which group commit refuses with it (the later command is refused
// too, and decided again only after the earlier ones it shares something
// with finished: afterEarlier); or the mark is set and this finds it,
// whether the state loaded is durable or a newer chain's (a third party's
// command, or an earlier refused one decided again, that began a chain
// after the refusal: neither holds the refused command). A command refused
// and not yet decided again never has a later command of its batch decided
// before it, on one account or across several (loadAccounts asks for each).
// Nil when it may go on.
// earlierRefusedWait is the error a decision (decideOnAccountOnce,
// loadAccounts) returns when refusedBefore asks it to wait: the attempts
// loop (attempts) waits with every lock it holds released, the command's own
// stream's too (a transfer's, a transaction's: the refused command may be
// of the same transfer, and need it to be decided again), and tries again.
type earlierRefusedWait struct{ ch <-chan struct{} }

func (*earlierRefusedWait) Error() string {
	return "ledger: an earlier command of the batch is to be decided again first"
}

func (s *Service) refusedBefore(ctx context.Context) <-chan struct{} {
	return batchElementOf(ctx).earlierRefused()
}

// batchTurn is asked after every load of a decision (decideOnAccountOnce,
// loadAccounts), before the command is decided on what was loaded:
// ErrEarlierUndecided when an earlier command it comes after answered error
// (earlierFailed), earlierRefusedWait when it must wait (refusedBefore), nil
// when it may go on, as it always may outside a batch.
func (s *Service) batchTurn(ctx context.Context) error {
	if batchElementOf(ctx).earlierFailed() {
		return ErrEarlierUndecided
	}
	if wait := s.refusedBefore(ctx); wait != nil {
		return &earlierRefusedWait{wait} // waited for by attempts, every lock released
	}
	return nil
}

type batchElementKey struct{}

// batchElementOf is the batch element ctx decides, or nil.
func batchElementOf(ctx context.Context) *batchElement {
	e, _ := ctx.Value(batchElementKey{}).(*batchElement)
	return e
}

// scheduleBatch links each command to the last earlier command of each thing
// it names (after): its accounts, its key, its transfer's or transaction's ID.
// A refund names everything (its original's accounts are found only while it
// is decided): it comes after every command since the last refund, and every
// later command after it. An invalid command names nothing.
//
// A refund starts only once those earlier commands have finished (their
// answers given, so their appends durable), not once they are decided: it
// finds its original by the claim of its key, read from the store
// (readClaim), and a decision queued in a group commit that has not
// committed yet is not there. Started on a decision alone, the refund of an
// original just before it in the batch answered original_not_found (and
// wrote nothing, so every later command of the original's account was decided
// a revision early), where sent alone after it, it finds it. The commands
// after a refund still start once it is decided: they are decided on the
// pending state it leaves, as on any other command's.
//
// A command whose key an earlier command carries (afterKey) starts only once
// that one has finished, too, and looks its key up afresh: what binds a key
// to one request across accounts is its claim, written with the decision's
// append and refused by the store to another request (claims.go). Started on
// the earlier one's decision alone, a command of another account raced its
// claim to the store from its own account's group commit: a deposit on b
// with the key of a deposit on a just before it was now and then applied,
// and the one on a answered idempotency_key_conflict, where sent one after
// the other the later one is the conflict
// (TestBatchKeyReusedOnAnotherAccount).
func scheduleBatch(cmds []domain.BatchCommand) []*batchElement {
	elems := make([]*batchElement, len(cmds))
	last := map[string]*batchElement{}
	var barrier *batchElement
	var sinceBarrier []*batchElement
	refusals := &batchRefusals{pending: map[int]chan struct{}{}}
	for i, c := range cmds {
		e := &batchElement{decided: make(chan struct{}), finished: make(chan struct{}), index: i, refusals: refusals}
		elems[i] = e
		if c.Invalid != nil {
			e.linkAfter()
			e.finish()
			continue
		}
		if barrier != nil {
			e.after = append(e.after, barrier)
		}
		if c.Type == domain.CmdRefund {
			e.after = append(e.after, sinceBarrier...)
			e.afterAnswers = true
			barrier, sinceBarrier, last = e, nil, map[string]*batchElement{keyName(c.IdempotencyKey): e}
			e.linkAfter()
			continue
		}
		for _, name := range namesOf(c.Command) {
			if prev := last[name]; prev != nil && prev != e { // a name may come twice (postings)
				e.after = append(e.after, prev)
				if name == keyName(c.IdempotencyKey) {
					e.afterKey = prev
				}
			}
			last[name] = e
		}
		e.linkAfter()
		sinceBarrier = append(sinceBarrier, e)
	}
	return elems
}

// namesOf is what a command shares with others that it may be decided on:
// its accounts, its key and its transfer's or transaction's ID.
func namesOf(c domain.Command) []string {
	names := []string{keyName(c.IdempotencyKey)}
	for _, id := range []string{c.AccountID, c.From, c.To} {
		if id != "" {
			names = append(names, domain.AccountStream(id))
		}
	}
	if c.TransferID != "" {
		names = append(names, domain.TransferStream(c.TransferID))
	}
	if c.TransactionID != "" {
		names = append(names, domain.TransactionStream(c.TransactionID))
	}
	for _, p := range c.Postings {
		names = append(names, domain.AccountStream(p.From), domain.AccountStream(p.To))
	}
	return names
}

// keyName is the name (namesOf) of a command's key.
func keyName(key string) string { return "key " + key }

// waitStart waits until every command e comes after is decided (finished,
// for a refund, and for the earlier command of its key: scheduleBatch), then
// for a slot among the commands being decided.
func (e *batchElement) waitStart(ctx context.Context, slots chan struct{}) error {
	for _, a := range e.after {
		ch := e.ready(a)
		if e.waitHook != nil {
			e.waitHook(e, a, ch)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case slots <- struct{}{}:
		e.slots = slots
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ready is what e waits for of a, one of its after: a decided, or a
// finished (scheduleBatch).
func (e *batchElement) ready(a *batchElement) <-chan struct{} {
	if e.afterAnswers || a == e.afterKey {
		return a.finished
	}
	return a.decided
}

// tryStart is waitStart when it need not wait: true, with a slot taken, when
// every command e comes after is ready and a slot is free.
func (e *batchElement) tryStart(slots chan struct{}) bool {
	for _, a := range e.after {
		select {
		case <-e.ready(a):
		default:
			return false
		}
	}
	select {
	case slots <- struct{}{}:
		e.slots = slots
		return true
	default:
		return false
	}
}

// markDecided records that e's decision is taken: its append queued behind
// the account's appends in flight (appendHot). The commands after it may be
// decided on the pending state it leaves.
func (e *batchElement) markDecided() {
	e.decidedOnce.Do(func() {
		close(e.decided)
		if e.slots != nil {
			<-e.slots // a command waiting for its commit is not being decided
		}
	})
}

// finish records that e has its answer; it is finished once the commands it
// comes after are.
func (e *batchElement) finish() {
	e.markDecided()
	e.redecided(true)
	e.countFinished()
}

// countFinished counts one of e's unfinished down and, for each command
// that this finishes, one of its waiters' (in a loop: a batch's chain of
// commands may be 1,000 long).
func (e *batchElement) countFinished() {
	next := []*batchElement{e}
	for len(next) > 0 {
		x := next[len(next)-1]
		next = next[:len(next)-1]
		if x.unfinished.Add(-1) == 0 {
			close(x.finished)
			next = append(next, x.waiters...)
		}
	}
}

// linkAfter records e's after: e is finished once they are, and answered.
func (e *batchElement) linkAfter() {
	e.unfinished.Store(int32(len(e.after)) + 1)
	for _, a := range e.after {
		a.waiters = append(a.waiters, e)
	}
}

// earlierFinished is closed once every command e comes after has finished.
func (e *batchElement) earlierFinished() <-chan struct{} {
	if len(e.after) == 0 {
		return nil
	}
	ch := make(chan struct{})
	go func() {
		for _, a := range e.after {
			<-a.finished
		}
		close(ch)
	}()
	return ch
}

// afterEarlier, before a command of a batch is decided again (its append was
// refused, or it is to be decided on the store's head), waits with its locks
// released until the earlier commands it shares something with have
// finished, so that it is decided again after them, as alone it would be.
// Only a store that pipelines decides a command before an earlier one
// finished (groupAppends.afterEarlier); elsewhere nothing waits.
func (s *Service) afterEarlier(ctx context.Context, a *attempt) error {
	e := batchElementOf(ctx)
	if e == nil {
		return nil
	}
	ch := e.earlierFinished()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	default:
	}
	return a.locks.waitFor(ctx, ch)
}
