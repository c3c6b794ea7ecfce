package ledger

import (
	"context"

	"github.com/ledgerworks/ledger/domain"
)

// Batch elements decided apart from their commit (runBatch). A decider (a
// bounded pool of element workers, batchworkers.go) decides a command of one
// account, queues its append on the account's pipeline (pipeline.go) and
// returns to the pool at once: it never parks, with the deep frames of a
// decision (about 9 KiB, BENCHMARKS.md "runtime.copystack"), for the length
// of a commit. What follows the commit (the key's record is read under the
// stream's lock, the reply is made) runs as the transaction's continuation:
// one goroutine per committer runs those of every command its transactions
// carried, one after another (committer.flush), so the stacks that grow are
// one per committer, not one per command.
//
// No continuation waits for a decider, so the bound cannot deadlock: a
// decider waits only for what the store, the committers or the
// continuations give (room on a pipeline, a key's append in flight, a stream
// draining, earlier commands of its batch finished, a lock held by a decision
// under way), and a continuation waits only for a stream's lock. The
// pipeline learns a commit's outcome on the committer itself (handoff.resolved),
// not behind the continuations queued before it: a transfer holding one
// account's lock while it waits for another to drain would otherwise wait
// for a continuation stuck behind one that waits for that lock. A
// continuation reads the record its decision folded (queuedHot.rec), so
// that the pending aggregate may forget it first (Account.KeyLimit). A
// command whose write was refused (a command decided before it in its
// pipeline was not written, or the store failed) is decided again on a
// goroutine of its own, as alone (finish, then again, waiting where it
// must): the continuation goes on with the transaction's other commands.
//
// Nothing changes in what a client is told: the reply is made only after the
// commit is known, exactly as Handle would make it, and a failed commit fails
// or decides again every command decided on it (TestBatchOnAFailedCommit).

// handleElement decides cmd, a command of a batch (ctx carries its element),
// and hands its reply to done: at once, or once its commit has resolved when
// it was queued on its account's pipeline.
func (s *Service) handleElement(ctx context.Context, cmd domain.Command, done func(Reply)) {
	cmd = s.stamped(cmd)
	if !cmd.Type.IsClient() || !isAccountCommand(cmd) {
		done(s.Handle(ctx, cmd))
		return
	}
	q, r, err := s.queueAccountCommand(ctx, cmd)
	if q == nil {
		done(s.replyOf(ctx, cmd, r, err))
		return
	}
	q.w.queued.hot.hot.apart.onDone(func(resp appendResp) {
		r, again, err := q.finish(ctx, resp)
		if !again {
			done(s.replyOf(ctx, cmd, r, err))
			return
		}
		go func() { // its write refused: decided again, waiting where it must
			r, err := q.again(ctx)
			done(s.replyOf(ctx, cmd, r, err))
		}()
	})
}

// handoff is a queued write's continuation (batch.go): resolved, on the
// committer, tells the pipeline the outcome (end); deliver runs the
// command's continuation (onDone) with it, once given: the decider that
// queued the write gives it on its way back, waiting for nothing.
type handoff struct {
	k   chan func(appendResp)
	end func(appendResp)
}

func newHandoff() *handoff { return &handoff{k: make(chan func(appendResp), 1)} }

func (h *handoff) resolved(resp appendResp) { h.end(resp) }

func (h *handoff) deliver(resp appendResp) { (<-h.k)(resp) }

// onDone gives the command's continuation k, run with the outcome.
func (h *handoff) onDone(k func(appendResp)) { h.k <- k }

// queuedCommand is a command of one account decided and queued on the
// account's pipeline (queueAccountCommand), its commit not yet known: the
// write, the attempt it was queued by and the attempts' function.
type queuedCommand struct {
	s   *Service
	w   *accountWrite
	a   *attempt
	try func(a *attempt) (Reply, bool, error)
}

// queueAccountCommand is handleAccountCommand up to the commit: it decides
// cmd under its account's lock and either answers it (r, err: a duplicate,
// an invalid command, a refusal; or decided on a store that does not
// pipeline) or returns it queued, the account's lock released.
func (s *Service) queueAccountCommand(ctx context.Context, cmd domain.Command) (q *queuedCommand, r Reply, err error) {
	stream := domain.AccountStream(cmd.AccountID)
	w, err := s.newAccountWrite(ctx, cmd, stream, cmd.AccountID, true)
	if err != nil {
		return nil, Reply{}, err
	}
	w.apart = true
	a := &attempt{locks: &heldLocks{s: s, streams: []string{stream}}}
	if err := a.locks.lock(ctx); err != nil {
		return nil, Reply{}, err
	}
	try := s.accountAttempt(ctx, w)
	_, err = s.attempts(ctx, a, try)
	if err == nil && w.queued != nil {
		return &queuedCommand{s: s, w: w, a: a, try: try}, Reply{}, nil
	}
	a.locks.unlock()
	if err != nil {
		return nil, Reply{}, err
	}
	return nil, w.ans.reply(), nil
}

// finish is the rest of the queued command given its commit's outcome
// (resp), waiting for nothing but the stream's lock: the pipeline learns the
// outcome, the lock is taken again, and the command is answered from its
// record (the lock released), or again asks for it to be decided again (its
// write was refused), the lock still held: then again decides it.
func (q *queuedCommand) finish(ctx context.Context, resp appendResp) (r Reply, again bool, err error) {
	s, w, a := q.s, q.w, q.a
	qw := w.queued
	w.queued, w.apart = nil, false // any attempt after this one waits in place
	res, err := s.finishPipelined(ctx, w, qw, resp)
	again, err = s.afterAccountAppend(w, res, err)
	if err == nil && again {
		return Reply{}, true, nil
	}
	a.locks.unlock()
	if err != nil {
		return Reply{}, false, err
	}
	return w.ans.reply(), false, nil
}

// again decides the queued command again after its write was refused
// (finish): its remaining attempts, after the earlier commands of its batch
// it shares something with (attempts, afterEarlier), its lock held on entry.
func (q *queuedCommand) again(ctx context.Context) (Reply, error) {
	s, w, a := q.s, q.w, q.a
	defer a.locks.unlock()
	a.n++
	if err := s.appends.afterEarlier(ctx, a); err != nil {
		return Reply{}, err
	}
	if _, err := s.attempts(ctx, a, q.try); err != nil {
		return Reply{}, err
	}
	return w.ans.reply(), nil
}
