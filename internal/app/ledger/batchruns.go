package ledger

import (
	"context"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Runs of a batch: the consecutive commands of one account that come each
// after the one before it and after nothing else (a hot batch's deposits),
// decided in a loop on one element worker, in order. Each command of a run
// is still decided alone (handleElement: decided and queued on the pending
// state its predecessor left, or answered) and its reply made once its commit
// is known; what the run saves is the hand-off between them: alone, each
// command waited for the one before it on a goroutine of its own, woken when
// that one was decided (markDecided), and was handed to a worker of its own
// (BENCHMARKS.md "Issue 24: a hot account's run on one worker"). The next
// command of a run starts only once the one before it returned from
// handleElement, which is once it is decided (queued or answered), so its
// turn (waitStart) is already there and takes no wait but for a slot.

// batchRun is a run's elements' indexes in the batch, in order.
type batchRun []int

// batchRuns groups the valid commands of a batch into runs: a command joins
// the run of the one before it when it is an account command (handleElement's
// account path) of the same account, comes after that command alone, and
// that command ends its run; any other command begins a run of its own.
func batchRuns(cmds []domain.BatchCommand, elems []*batchElement) []batchRun {
	var runs []batchRun
	runOf := make(map[*batchElement]int, len(cmds)) // an element ending a run -> the run
	for i, c := range cmds {
		if c.Invalid != nil {
			continue
		}
		e := elems[i]
		if r, ok := runOf[soleAfter(e)]; ok && sameAccountRun(cmds, runs[r], c) {
			delete(runOf, soleAfter(e))
			runs[r] = append(runs[r], i)
			runOf[e] = r
			continue
		}
		runOf[e] = len(runs)
		runs = append(runs, batchRun{i})
	}
	return runs
}

// soleAfter is the one command e waits to be decided, or nil: nil too where
// e waits for one to finish (a refund's wait, or its key's: afterKey), which
// a run, deciding each command on the one before it, would not wait for.
func soleAfter(e *batchElement) *batchElement {
	if len(e.after) != 1 || e.afterAnswers || e.afterKey != nil {
		return nil
	}
	return e.after[0]
}

// sameAccountRun reports whether c may end run: both are account commands of
// one account, decided on its pending state one after another.
func sameAccountRun(cmds []domain.BatchCommand, run batchRun, c domain.BatchCommand) bool {
	last := cmds[run[len(run)-1]]
	return runnable(last.Command) && runnable(c.Command) && last.AccountID == c.AccountID
}

// runnable: a client's command of one account (handleElement's account path).
func runnable(c domain.Command) bool {
	return c.Type.IsClient() && isAccountCommand(c) && c.AccountID != ""
}

// decideRun decides the elements of run in order: the first waits for its
// turn on the calling goroutine, whose shallow frames never grow, and the
// run is decided on one element worker once it may start (a worker parked in
// waitStart was shrunk by every collection and grew again with its command).
// done(i, r) answers the batch's element i.
func (s *Service) decideRun(ctx context.Context, cmds []domain.BatchCommand, elems []*batchElement, run batchRun, slots chan struct{}, done func(int, Reply)) {
	s.decideRunOn(ctx, cmds, elems, run, slots, done, elems[run[0]].waitStart(ctx, slots))
}

// decideRunOn decides run on an element worker, its first command started
// (err: why it could not be).
func (s *Service) decideRunOn(ctx context.Context, cmds []domain.BatchCommand, elems []*batchElement, run batchRun, slots chan struct{}, done func(int, Reply), err error) {
	s.elements.Go(nil, func() {
		for k, i := range run {
			if k > 0 {
				err = elems[i].waitStart(ctx, slots) // decided before: only a slot to take
			}
			c := cmds[i]
			if err == nil && elems[i].earlierFailed() {
				err = ErrEarlierUndecided
			}
			if err != nil {
				done(i, reply.Error(c.IdempotencyKey, err))
				continue
			}
			s.handleElement(context.WithValue(ctx, batchElementKey{}, elems[i]), c.Command, func(r Reply) { done(i, r) }) // done perhaps once its commit resolves (queued.go)
		}
	})
}
