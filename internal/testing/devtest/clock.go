package devtest

import (
	"sync"
	"time"
)

// Epoch is when the tests' clocks start: 2026-11-22 10:00 UTC.
var Epoch = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// Clock is the tests' controllable clock (a ledger's Options.Clock is its Now).
// A clock from NewClock stands at Epoch until the test moves it (Advance, Set);
// one from NewTickingClock moves on by its step every time it is read. It is
// safe for concurrent use.
type Clock struct {
	mu   sync.Mutex
	now  time.Time
	tick time.Duration
}

// NewClock returns a clock standing at Epoch.
func NewClock() *Clock { return &Clock{now: Epoch} }

// NewTickingClock returns a clock at Epoch that moves on by step before each
// reading: every reading is later than the one before.
func NewTickingClock(step time.Duration) *Clock { return &Clock{now: Epoch, tick: step} }

// Now reads the clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.tick)
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
