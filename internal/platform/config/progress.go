package config

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
)

// progressThrottle bounds how often the bar is redrawn.
const progressThrottle = 100 * time.Millisecond

// EventsProgress draws a progress bar on w for a tool that reads the store's
// events from where its work starts (the start, an audit checkpoint, a
// stopped rebuild's checkpoint): the events read so far out of those left
// (PostgreSQL's count less the events before the start; open-ended
// elsewhere), events/s and the time left. progress takes the events this run
// has read and the events before its start, which it does not read
// (carried); finish ends the bar, drawn full only when the work completed,
// else left where it stopped.
func EventsProgress(ctx context.Context, w io.Writer, store eventstore.Store, what string) (progress func(done, carried int64), finish func(completed bool)) {
	total := int64(-1)
	if ps, ok := store.(*postgres.Store); ok {
		if err := ps.Pool().QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&total); err != nil {
			total = -1
		}
	}
	b := newEventsBar(w, total, what, progressThrottle)
	return b.progress, b.finish
}

// eventsBar is EventsProgress's bar over a store of total events (-1:
// unknown).
type eventsBar struct {
	bar     *progressbar.ProgressBar
	total   int64
	carried int64 // -1 until the first call
}

func newEventsBar(w io.Writer, total int64, what string, throttle time.Duration) *eventsBar {
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("events"),
		progressbar.OptionThrottle(throttle), progressbar.OptionSetPredictTime(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
	return &eventsBar{bar: bar, total: total, carried: -1}
}

// progress sets the bar at done of the events after the work's start: the
// store's total less carried, raised when live traffic added events.
func (b *eventsBar) progress(done, carried int64) {
	if b.carried != carried {
		b.carried = carried
		if b.total >= 0 {
			b.bar.ChangeMax64(max(b.total-carried, 0))
		}
	}
	if b.total >= 0 && done > b.bar.GetMax64() {
		b.bar.ChangeMax64(done) // live traffic added events
	}
	_ = b.bar.Set64(done)
}

// finish draws the bar full when the work completed; a stopped one keeps the
// count it reached, and its line is ended.
func (b *eventsBar) finish(completed bool) {
	if completed {
		_ = b.bar.Finish()
		return
	}
	_ = b.bar.Exit()
}
