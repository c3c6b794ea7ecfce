package bench

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestTimelineSplitsResends: a second's resends and new commands get their
// own p99. Shown failing with the resends' split dropped (every latency
// counted as new: second 0's new p99 90 ms).
func TestTimelineSplitsResends(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	w := &worker{}
	for _, c := range []struct {
		end int
		lat time.Duration
		dup bool
	}{
		{100, 5 * time.Millisecond, false}, {200, 90 * time.Millisecond, true}, {300, 5 * time.Millisecond, true},
		{400, 7 * time.Millisecond, false}, {1200, 3 * time.Millisecond, false},
	} {
		w.lats, w.ends, w.dups = append(w.lats, c.lat), append(w.ends, at(c.end)), append(w.dups, c.dup)
	}
	got := timeline(start, []*worker{w})
	if len(got) != 2 {
		t.Fatalf("seconds: %+v", got)
	}
	if s := got[0]; s.Commands != 4 || s.Resends != 2 || s.ResendP99Ms != 90 || s.NewP99Ms != 7 || s.P99Ms != 90 {
		t.Fatalf("second 0: %+v, want 4 commands, 2 resends (p99 90 ms), new p99 7 ms", s)
	}
	if s := got[1]; s.Commands != 1 || s.Resends != 0 || s.ResendP99Ms != 0 || s.NewP99Ms != 3 {
		t.Fatalf("second 1: %+v", s)
	}
}

// TestCloseSchedCountsRunnableWaits: goroutines that yield to each other
// on one P wait runnable, and closeSched counts those waits since the last
// call, not the process's whole history. Shown failing with the counts not
// kept between calls (the second call then finds nothing new).
func TestCloseSchedCountsRunnableWaits(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	w := &pgWatch{}
	_, w.sched = schedLatencies()
	yield := func() {
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 1000 {
					runtime.Gosched()
				}
			}()
		}
		wg.Wait()
	}
	yield()
	var s PGSecond
	w.closeSched(&s)
	if s.SchedWaitMs <= 0 || s.SchedP99Ms <= 0 {
		t.Fatalf("after goroutines yielded to each other: %+v, want their waits", s)
	}
	var quiet PGSecond
	w.closeSched(&quiet)
	if quiet.SchedWaitMs >= s.SchedWaitMs {
		t.Fatalf("a second call with nothing yielding between: %+v, not below the first's %+v", quiet, s)
	}
}
