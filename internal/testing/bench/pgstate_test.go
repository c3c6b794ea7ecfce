package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

// TestPGWatchSeesACheckpoint: a phase through which rows are written and a
// CHECKPOINT taken shows the checkpoint requested and ended, its buffers
// and the WAL written (its bytes and fsyncs are not asserted: the test
// cluster runs without fsync, and a backend's own counts reach pg_stat_wal
// only once it is idle a while). It fails when the counters at the phase's start are
// read again at its end (no difference: shown failing so).
func TestPGWatchSeesACheckpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	w := watchPG(ctx, url, t.Logf)
	if w == nil {
		t.Fatal("no watch")
	}
	for _, sql := range []string{
		`CREATE TABLE watched (n int, pad text)`,
		`INSERT INTO watched SELECT n, repeat('x', 200) FROM generate_series(1, 20000) n`,
		`CHECKPOINT`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// The statistics reach pg_stat_bgwriter within a second or so (the
	// checkpointer flushes its counts after the checkpoint): wait for them.
	for c, err := readPGCounters(ctx, conn); c.req <= w.c0.req; c, err = readPGCounters(ctx, conn) {
		if err != nil || ctx.Err() != nil {
			t.Fatalf("the CHECKPOINT never counted: %v (%v)", err, ctx.Err())
		}
		time.Sleep(50 * time.Millisecond) // a poll of the counters, not an order
	}
	timeline := []SecondStat{{Second: 0}}
	p := w.end(ctx, timeline)
	if p == nil {
		t.Fatal("no figures")
	}
	if p.CheckpointsRequested < 1 || !p.CheckpointEnded || p.BuffersCheckpoint <= 0 || p.WALWrites <= 0 {
		t.Fatalf("after rows and a CHECKPOINT: %s", p)
	}
}
