package workers

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitOrFail waits for ch, failing the test if it has not closed after a bound
// far beyond what the work needs (a hang, not a timing assertion).
func waitOrFail(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: still waiting after 30s", what)
	}
}

// At the bound, Go waits for a worker and gives up when done closes; every
// job handed over runs, on at most max workers at once.
func TestPoolBoundsItsWorkers(t *testing.T) {
	const max = 2
	p := New(max, time.Hour)
	release := make(chan struct{})
	var running, most atomic.Int32
	var ran sync.WaitGroup
	job := func() {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		running.Add(-1)
		ran.Done()
	}
	ran.Add(max)
	for range max {
		if !p.Go(nil, job) {
			t.Fatal("Go under the bound refused a job")
		}
	}
	done := make(chan struct{})
	close(done)
	if p.Go(done, func() { t.Error("a job beyond the bound ran while every worker was busy") }) {
		t.Fatal("Go at the bound took a job with no worker free")
	}
	close(release)
	ran.Add(5)
	for range 5 {
		if !p.Go(nil, job) {
			t.Fatal("Go refused a job with a nil done")
		}
	}
	ran.Wait()
	if m := most.Load(); m > max {
		t.Fatalf("%d jobs ran at once on a pool of %d", m, max)
	}
	p.Close()
	ended := make(chan struct{})
	go func() { p.Wait(); close(ended) }()
	waitOrFail(t, ended, "the idle workers after Close")
}

// An unbounded pool never waits: each job is taken by an idle worker or a new
// one; Close ends the idle workers and each busy one once its job is done.
func TestPoolUnboundedAndClose(t *testing.T) {
	p := New(0, time.Hour)
	release := make(chan struct{})
	var ran atomic.Int32
	for range 8 {
		p.Go(nil, func() { <-release; ran.Add(1) })
	}
	p.Close()
	close(release)
	ended := make(chan struct{})
	go func() { p.Wait(); close(ended) }()
	waitOrFail(t, ended, "busy workers after Close")
	if n := ran.Load(); n != 8 {
		t.Fatalf("%d of 8 jobs ran", n)
	}
}

// Beyond the pool's keep, parked workers wait shallow and the collector
// shrinks their stacks: n workers, each grown to tens of KiB by its job, hold
// far less stack parked when only a tenth of them keep theirs than when every
// one does.
func TestPoolKeepsBoundedStacks(t *testing.T) {
	const n = 1000
	all := parkedStacks(t, n, n)
	capped := parkedStacks(t, n, n/10)
	t.Logf("stack in use with %d workers parked: %d KiB, all kept; %d KiB, %d kept", n, all>>10, capped>>10, n/10)
	if capped*2 > all {
		t.Fatalf("%d workers parked, %d of them keeping their stacks, hold %d KiB of stack; all keeping theirs, %d KiB", n, n/10, capped>>10, all>>10)
	}
}

// parkedStacks starts n workers on a pool keeping keep stacks, grows each
// one's stack, parks them all, collects, and returns the stack in use.
func parkedStacks(t *testing.T, n int, keep int32) uint64 {
	t.Helper()
	p := New(0, time.Hour)
	p.keep = keep
	defer func() { p.Close(); p.Wait() }()
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	for range n {
		p.Go(nil, func() { started.Done(); growStack(24 << 10); <-release })
	}
	started.Wait()
	close(release)
	parked := make(chan struct{})
	go func() {
		for p.deep.Load() < int32(n) {
			time.Sleep(time.Millisecond) // a poll of the count, not an order
		}
		close(parked)
	}()
	waitOrFail(t, parked, "every worker parked")
	for range 3 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}

// growStack uses about bytes of stack.
//
//go:noinline
func growStack(bytes int) byte {
	var frame [1 << 10]byte
	frame[bytes%len(frame)] = byte(bytes)
	if bytes <= len(frame) {
		return frame[0]
	}
	return growStack(bytes-len(frame)) + frame[bytes%len(frame)]
}
