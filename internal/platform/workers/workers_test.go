package workers

import (
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
