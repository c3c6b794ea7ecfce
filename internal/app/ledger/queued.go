package ledger

import (
	"context"

	"github.com/ledgerworks/ledger/domain"
)

// Batch elements decided apart from their commit (runBatch). An element
// worker that decided a command of one account and queued its append on the
// account's pipeline (pipeline.go) does not wait for the group commit: the
// committer hands the outcome on (appendReq.onAnswer), with no goroutine
// waiting for it, and what follows the commit (the pipeline learns the outcome, the key's record
// is read under the stream's lock, or the command decided again when the
// commit failed) runs on an element worker once the commit has resolved. So
// a worker decides the next command, of the same hot account on the pending
// state or of another, while the commit is in flight, and the deep frames of
// a decision (about 9 KiB down to the group commit's wait, BENCHMARKS.md
// "runtime.copystack") are not held, one stack per command in flight, for
// the length of a commit.
//
// Nothing changes in what a client is told: the reply is made only after the
// commit is known, exactly as Handle would make it. A commit that failed, or
// was refused because a command decided before it in its pipeline failed,
// makes the pending state stale (finishHot), and the command is answered an
// error or decided again, as alone (afterAccountAppend, then the attempts
// that remain, waited for in place).

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
	// No goroutine waits for the commit: the committer hands its outcome to
	// an element worker (the pool has no bound, so Go never blocks it).
	q.w.queued.hot.r.onAnswer(func(resp appendResp) {
		s.elements.Go(nil, func() {
			r, err := q.finish(ctx, resp)
			done(s.replyOf(ctx, cmd, r, err))
		})
	})
}

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
// (resp): the pipeline learns it, the stream's lock is taken again, and the
// command is answered from its record, or decided again in place (its
// remaining attempts, after the earlier commands of its batch it shares
// something with: attempts, afterEarlier) when its write was refused.
func (q *queuedCommand) finish(ctx context.Context, resp appendResp) (Reply, error) {
	s, w, a := q.s, q.w, q.a
	defer a.locks.unlock()
	qw := w.queued
	w.queued, w.apart = nil, false // any attempt after this one waits in place
	res, err := s.finishPipelined(ctx, w, qw, resp)
	again, err := s.afterAccountAppend(w, res, err)
	if err != nil {
		return Reply{}, err
	}
	if again {
		a.n++
		if err := s.appends.afterEarlier(ctx, a); err != nil {
			return Reply{}, err
		}
		if _, err := s.attempts(ctx, a, q.try); err != nil {
			return Reply{}, err
		}
	}
	return w.ans.reply(), nil
}
