package ledger

import (
	"sync"
	"time"
)

// elementWorkers run the commands of batches that are not atomic (runBatch)
// on goroutines that outlive one command. A command's way through the write
// path (deciding, encoding, hashing, the group commit's hand-off) grows its
// goroutine's stack to tens of KiB, and a fresh goroutine per element paid
// that growth every time: runtime.newstack and copystack were 19% of the
// process's samples in ledger bench's batch phase (BENCHMARKS.md, "Batches").
// As the NATS intake's request workers do for single commands, an idle worker
// takes the next element, else one is started; a worker idle for
// elementWorkerIdle ends, and every idle one once the service is closed.
// There are never more workers than elements in flight at once.
type elementWorkers struct {
	jobs      chan func() // unbuffered: a send succeeds only into an idle worker
	closed    chan struct{}
	closeOnce sync.Once
}

// elementWorkerIdle is how long an element worker waits for another element.
const elementWorkerIdle = 10 * time.Second

func newElementWorkers() *elementWorkers {
	return &elementWorkers{jobs: make(chan func()), closed: make(chan struct{})}
}

// run runs f on an idle worker, or on a new one.
func (w *elementWorkers) run(f func()) {
	select {
	case w.jobs <- f:
	default:
		go w.loop(f)
	}
}

// loop runs f, then the elements handed to it, until it has been idle for
// elementWorkerIdle or the workers are closed.
func (w *elementWorkers) loop(f func()) {
	idle := time.NewTimer(elementWorkerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(elementWorkerIdle)
		select {
		case f = <-w.jobs:
		case <-idle.C:
			return
		case <-w.closed:
			return
		}
	}
}

// close ends the idle workers, and each busy one once its element is done.
func (w *elementWorkers) close() { w.closeOnce.Do(func() { close(w.closed) }) }
