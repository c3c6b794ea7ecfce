package ledger

import (
	"github.com/ledgerworks/ledger/domain"
	"time"

	"github.com/ledgerworks/ledger/internal/platform/workers"
)

// The commands of batches that are not atomic (runBatch) run on the
// service's element workers, goroutines that outlive one command, as the NATS
// intake's request workers do for single commands (internal/platform/workers:
// a fresh goroutine per element paid its stack's growth every time,
// runtime.newstack and copystack 19% of the process's samples in ledger
// bench's batch phase, BENCHMARKS.md "Batches"). They are bounded by the
// elements in flight at once; one idle for elementWorkerIdle ends, and every
// idle one once the service is closed.

//
// A batch's commands of one account are decided on deciders instead, when
// the store pipelines (group commit): a bounded pool whose workers decide
// and queue a command and return at once, its commit's outcome taken by the
// transaction's continuation (queued.go). Bounded, they stay busy, so few
// stacks are grown and few are shrunk by the collector between two commands
// (an unbounded pool held as many workers as commands were ready at once,
// most idle at every collection: BENCHMARKS.md "Issue 24's remaining cuts").
// Elsewhere a decider waits for its command's write in place, so the
// deciders are the element workers.

// elementWorkerIdle is how long an element worker waits for another element.
const elementWorkerIdle = 10 * time.Second

// maxDeciders bounds the deciders: enough that the key lookups and cold
// loads a decision waits for still share their round trips (lookups.go),
// few enough to stay busy.
const maxDeciders = 64

func newElementWorkers() *workers.Pool { return workers.New(0, elementWorkerIdle) }

// decidersFor is the pool that decides a batch's commands of one account:
// bounded when the store pipelines (s.batch, group commit), else elements.
func decidersFor(s *Service, elements *workers.Pool) *workers.Pool {
	if s.batch == nil {
		return elements
	}
	return workers.New(maxDeciders, elementWorkerIdle)
}

// workersFor is the pool a batch's command c runs on (runBatch).
func (s *Service) workersFor(c domain.Command) *workers.Pool {
	if isAccountCommand(c) {
		return s.deciders
	}
	return s.elements
}
