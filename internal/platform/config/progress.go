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

// EventsProgress draws a progress bar on w for a tool that reads the whole
// store: events done out of the store's count (PostgreSQL; an open-ended count
// elsewhere), events/s and the time left. progress takes the events done so
// far; finish ends the bar.
func EventsProgress(ctx context.Context, w io.Writer, store eventstore.Store, what string) (progress func(int64), finish func()) {
	total := int64(-1)
	if ps, ok := store.(*postgres.Store); ok {
		if err := ps.Pool().QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&total); err != nil {
			total = -1
		}
	}
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("events"),
		progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionSetPredictTime(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
	return func(n int64) {
			if bar.GetMax64() >= 0 && n > bar.GetMax64() {
				bar.ChangeMax64(n) // live traffic added events
			}
			_ = bar.Set64(n)
		}, func() {
			_ = bar.Finish()
		}
}
