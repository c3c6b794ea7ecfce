// Package workers runs short jobs on goroutines that outlive one job. A
// command's way through the ledger (decoding, deciding, encoding, hashing,
// the group commit's hand-off) grows its goroutine's stack to tens of KiB,
// and a fresh goroutine per command paid that growth every time
// (runtime.newstack was 4.5% of the process's CPU under load at the NATS
// intake, and newstack with copystack 19% of the samples in ledger bench's
// batch phase: BENCHMARKS.md, "Batches"). An idle worker takes the next job,
// else one is started (while fewer than the bound run); a worker idle for
// the pool's idle time ends, and every idle one once the pool is closed.
package workers

import (
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a set of workers. Its zero value is not usable: see New.
type Pool struct {
	jobs   chan func()   // unbuffered: a send succeeds only into an idle worker
	slots  chan struct{} // one per running worker; nil: no bound
	idle   time.Duration
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	// keep bounds the workers parked deep (parkedFrame) at once; deep counts
	// them.
	keep int32
	deep atomic.Int32
}

// KeptStacks bounds the workers of an unbounded pool that keep their stacks
// while parked (4096 times 32 KiB: 128 MiB); a bounded pool keeps every
// worker's. The workers parked beyond it wait in a shallow frame, and the
// collector shrinks their stacks as it did before parkedFrame: a burst of
// batch elements (up to the intake's 64 batches of 1,000 in flight) would
// otherwise hold 64,000 stacks of 32 KiB, 2 GiB, for the idle time.
const KeptStacks = 4096

// New returns a pool of at most max workers (max <= 0: no bound but the jobs
// in flight at once), each ending once idle for idle (> 0).
func New(max int, idle time.Duration) *Pool {
	p := &Pool{jobs: make(chan func()), idle: idle, closed: make(chan struct{}), keep: KeptStacks}
	if max > 0 {
		p.slots = make(chan struct{}, max)
		p.keep = int32(max)
	}
	return p
}

// Go runs f on an idle worker, or on a new one while fewer than the bound
// run; at the bound it waits for a worker to take f, or for done to close
// (then f is not run, and Go reports false). done may be nil.
func (p *Pool) Go(done <-chan struct{}, f func()) bool {
	select {
	case p.jobs <- f: // an idle worker took it
		return true
	default:
	}
	if p.slots == nil {
		p.start(f)
		return true
	}
	select {
	case p.jobs <- f:
	case p.slots <- struct{}{}:
		p.start(f)
	case <-done:
		return false
	}
	return true
}

func (p *Pool) start(f func()) {
	p.wg.Add(1)
	go p.loop(f)
}

// loop runs f, then the jobs handed to it, until it has been idle for p.idle
// or the pool is closed.
func (p *Pool) loop(f func()) {
	defer func() {
		if p.slots != nil {
			<-p.slots
		}
		p.wg.Done()
	}()
	idle := time.NewTimer(p.idle)
	defer idle.Stop()
	for ok := true; ok; f, ok = p.next(idle) {
		f()
	}
}

// parkedFrame is the stack a worker keeps in use while it waits for a job,
// so that the garbage collector, which halves the stack of a goroutine using
// less than a quarter of it, leaves a parked worker up to 4*parkedFrame
// (32 KiB): a job grows a worker's stack to tens of KiB (a batch element's
// decision, the intake's request), and a worker parked in a shallow frame
// was shrunk by every collection and grew again with its next job
// (runtime.copystack, newstack and shrinkstack 25% of the samples of
// BenchmarkBatchesHotAndSpread: BENCHMARKS.md "Issue 24: parked workers keep
// their stacks"). A larger stack still shrinks to 4*parkedFrame. What it
// costs: a worker's stack is held while it is idle, at most the pool's
// bound (or KeptStacks) times 32 KiB, for the pool's idle time at most.
const parkedFrame = 8 << 10

// next waits for the worker's next job, deep in its frame (parkedFrame)
// while fewer than p.keep workers are parked so, else in a shallow one; ok
// false: the worker has been idle for p.idle or the pool is closed.
func (p *Pool) next(idle *time.Timer) (f func(), ok bool) {
	defer p.deep.Add(-1)
	if p.deep.Add(1) <= p.keep {
		return p.nextDeep(idle)
	}
	return p.wait(idle)
}

// nextDeep waits for the next job below a parkedFrame of its own.
//
//go:noinline
func (p *Pool) nextDeep(idle *time.Timer) (f func(), ok bool) {
	var frame [parkedFrame]byte
	inUse(&frame)
	return p.wait(idle)
}

// wait waits for the next job, the idle time or the pool's close.
//
//go:noinline
func (p *Pool) wait(idle *time.Timer) (f func(), ok bool) {
	idle.Reset(p.idle)
	select {
	case f = <-p.jobs:
		return f, true
	case <-idle.C:
	case <-p.closed:
	}
	return nil, false
}

// inUse keeps frame on its caller's stack: the compiler drops a local that
// nothing reads, and with it the frame.
//
//go:noinline
func inUse(frame *[parkedFrame]byte) { frame[0] = 1 }

// Close ends the idle workers, and each busy one once its job is done. It
// may be called more than once.
func (p *Pool) Close() { p.once.Do(func() { close(p.closed) }) }

// Wait waits until every worker has ended (after Close, or idle).
func (p *Pool) Wait() { p.wg.Wait() }
