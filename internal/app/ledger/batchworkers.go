package ledger

import (
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

// elementWorkerIdle is how long an element worker waits for another element.
const elementWorkerIdle = 10 * time.Second

func newElementWorkers() *workers.Pool { return workers.New(0, elementWorkerIdle) }
