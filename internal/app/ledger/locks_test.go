package ledger

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestStreamLocksExclusiveAndReleased: one holder per stream at a time, entries
// reused from the pool keep that, a waiter whose context ends gives its reference
// back, and the map is empty when no one holds or waits.
func TestStreamLocksExclusiveAndReleased(t *testing.T) {
	l := newStreamLocks()
	streams := []string{"a", "b", "c"}
	holders := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				s := streams[(g+i)%len(streams)]
				unlock, err := l.lock(context.Background(), s)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				holders[s]++
				if holders[s] != 1 {
					t.Errorf("%d holders of %s", holders[s], s)
				}
				mu.Unlock()
				mu.Lock()
				holders[s]--
				mu.Unlock()
				unlock()
			}
		}()
	}
	wg.Wait()

	unlock, err := l.lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.lock(ctx, "a"); err == nil {
		t.Fatal("took a held lock")
	}
	unlock()
	l.mu.Lock()
	n := len(l.locks)
	l.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d entries left with no holder", n)
	}
}
