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
	w := watchPG(ctx, url, 0, t.Logf)
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

// TestPGWatchSeesABackendsWait: a sample finds a client backend in its
// wait event (pg_sleep's Timeout:PgSleep), in the phase and in its second,
// and not the watch's own connection. Shown failing with the sample's SQL
// reading only idle backends (no wait counted).
func TestPGWatchSeesABackendsWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.URL(t)
	conns := make([]*pgx.Conn, 3)
	for i := range conns {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.WithoutCancel(ctx))
		conns[i] = c
	}
	sleeper, poller, watched := conns[0], conns[1], conns[2]
	sleepCtx, stopSleep := context.WithCancel(ctx)
	slept := make(chan error, 1)
	go func() {
		_, err := sleeper.Exec(sleepCtx, `SELECT pg_sleep(60)`)
		slept <- err
	}()
	for n := 0; n == 0; {
		if err := poller.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	w := newPGWatch(watched, pgCounters{})
	w.sampleOnce(ctx)
	stopSleep()
	<-slept
	if got := w.phase.BackendWaits["Timeout:PgSleep"]; got != 1 || w.phase.Samples != 1 {
		t.Fatalf("one sample of a sleeping backend: %d sleeping in %d samples (%v)", got, w.phase.Samples, w.phase.BackendWaits)
	}
	if got := w.perSec[0].BackendWaits["Timeout:PgSleep"]; got != 1 {
		t.Fatalf("its second: %v", w.perSec[0].BackendWaits)
	}
	// The poller is idle and the watch's own connection is left out: the
	// sleeper is the only client backend in a statement.
	if n := len(w.phase.BackendWaits); n != 1 {
		t.Fatalf("backends other than the sleeper counted: %v", w.phase.BackendWaits)
	}
}
