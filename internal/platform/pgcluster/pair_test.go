package pgcluster

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"
)

func startPair(t *testing.T) *Pair {
	t.Helper()
	dir := testDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := StartPair(ctx, PairOptions{
		Dirs:   [2]string{filepath.Join(dir, "a"), filepath.Join(dir, "b")},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, p.Stop)
	return p
}

// rows is what table t holds, read through url, in order ("1,3").
func rows(t *testing.T, url string) string {
	t.Helper()
	return query(t, url, "SELECT coalesce(string_agg(n::text, ',' ORDER BY n), '') FROM t")
}

// eventuallyRows waits until url shows want (a standby applies what it
// confirmed a moment later).
func eventuallyRows(t *testing.T, url string, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := rows(t, url)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows %q, want %q", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func settings(t *testing.T, c *Cluster, want map[string]string) {
	t.Helper()
	for name, v := range want {
		if got := query(t, c.URLFor("postgres"), "SHOW "+name); got != v {
			t.Errorf("port %d: %s = %q, want %q", c.Port(), name, got, v)
		}
	}
}

// TestPairFailsOverAndBack fails the pair over and back as a platform does,
// through the one multi-host URL every client holds: a commit confirmed by the
// standby survives the primary's death; a commit the standby never saw (the
// standby stopped, the commit made with synchronous_commit = local, as when
// the wait for it is cancelled) is lost by the promotion and thrown away by
// pg_rewind on the old primary, which then follows the new one.
func TestPairFailsOverAndBack(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url := p.URL()
	first := p.Primary()
	settings(t, first, map[string]string{"synchronous_standby_names": "*", "synchronous_commit": "on",
		"wal_log_hints": "on", "full_page_writes": "on"})
	if got := query(t, p.Standby().URL(), "SELECT pg_is_in_recovery()::text"); got != "true" {
		t.Fatalf("standby in recovery = %s", got)
	}
	exec1(t, url, "CREATE TABLE t (n int PRIMARY KEY)")
	exec1(t, url, "INSERT INTO t VALUES (1)")
	eventuallyRows(t, p.Standby().URL(), "1")

	if err := p.Promote(ctx); err == nil {
		t.Fatal("Promote with the primary alive succeeded: two primaries")
	}

	// A commit the standby never sees.
	if err := p.Standby().Stop(ctx); err != nil {
		t.Fatal(err)
	}
	exec1(t, first.URL(), "SET synchronous_commit = local; INSERT INTO t VALUES (2)")
	if err := p.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.startNode(ctx, 1-p.primary, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	second := p.Primary()
	if second.Port() == first.Port() {
		t.Fatal("the primary did not change")
	}
	settings(t, second, map[string]string{"synchronous_standby_names": ""})
	exec1(t, url, "INSERT INTO t VALUES (3)")
	if got := rows(t, url); got != "1,3" {
		t.Fatalf("promoted: rows %q, want 1,3", got)
	}

	if err := p.Rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	if got := query(t, first.URL(), "SELECT pg_is_in_recovery()::text"); got != "true" {
		t.Fatalf("rejoined old primary in recovery = %s", got)
	}
	settings(t, second, map[string]string{"synchronous_standby_names": "*"})
	eventuallyRows(t, first.URL(), "1,3") // row 2 rewound away

	// And back.
	if err := p.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	exec1(t, url, "INSERT INTO t VALUES (4)")
	if err := p.Rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Primary().Port() != first.Port() {
		t.Fatal("the pair did not fail back")
	}
	eventuallyRows(t, url, "1,3,4")
	eventuallyRows(t, second.URL(), "1,3,4")
}

// TestPairRestartsInItsRoles stops a pair whose old primary was never
// rejoined (both nodes are primaries on disk) and starts it again: the node
// on the later timeline stays primary, the other is rewound into its standby.
func TestPairRestartsInItsRoles(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	exec1(t, p.URL(), "CREATE TABLE t (n int PRIMARY KEY); INSERT INTO t VALUES (1)")
	if err := p.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	exec1(t, p.URL(), "INSERT INTO t VALUES (2)")
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := StartPair(ctx, PairOptions{
		Dirs:   [2]string{p.opts[0].Dir, p.opts[1].Dir},
		Ports:  [2]int{p.opts[0].Port, p.opts[1].Port},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop(context.Background())
	if got, want := again.Primary().Port(), p.opts[1].Port; got != want {
		t.Fatalf("primary on port %d, want the promoted node's %d", got, want)
	}
	if got := query(t, again.Standby().URL(), "SELECT pg_is_in_recovery()::text"); got != "true" {
		t.Fatalf("the other node in recovery = %s", got)
	}
	eventuallyRows(t, again.Standby().URL(), "1,2")
	eventuallyRows(t, again.URL(), "1,2")
}
