package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestRebuildSwitchesToEqualGenerations: on a ledger whose live read models
// are current, `projector rebuild` given its projections and index memory by
// the environment (LEDGER_PROJECTOR_PROJECTIONS=accounts,entries,
// LEDGER_PROJECTOR_REBUILD_INDEX_MEMORY=64) builds, checks and switches a
// new generation of those two only, their indexes built with 64 MiB; then
// one of every projection. Each time the generations switched are newer,
// the others unchanged, none left being built, and every read-model row as
// it was before (the views' rows compared table by table).
func TestRebuildSwitchesToEqualGenerations(t *testing.T) {
	env, conn := currentLedger(t)
	penv := storeEnv(env.URL)
	rows := projtest.Snapshot(t, env.Pool)
	if n := len(rows["accounts"]); n != 12 {
		t.Fatalf("the live accounts read model holds %d rows, want the workload's 12", n)
	}
	for _, step := range []struct {
		what     string
		env      []string
		switched []string
	}{
		{"accounts and entries, by the environment", []string{"LEDGER_PROJECTOR_PROJECTIONS=accounts,entries", "LEDGER_PROJECTOR_REBUILD_INDEX_MEMORY=64"}, []string{projections.Accounts, projections.Entries}},
		{"every projection", nil, projections.Names},
	} {
		before := liveGenerations(t, conn)
		stdout, stderr, code := runProjector(t, slices.Concat(penv, step.env), "rebuild", "--progress=false")
		if code != 0 {
			t.Fatalf("rebuild of %s: exit %d:\n%s%s", step.what, code, stdout, stderr)
		}
		after := liveGenerations(t, conn)
		switched := rebuildLines(t, stdout)
		for _, name := range projections.Names {
			got, ok := switched[name]
			if !slices.Contains(step.switched, name) {
				if ok || after[name] != before[name] {
					t.Fatalf("rebuild of %s switched %s (generation %d -> %d):\n%s", step.what, name, before[name], after[name], stdout)
				}
				continue
			}
			if !ok || got != [2]int{before[name], after[name]} || after[name] <= before[name] {
				t.Fatalf("rebuild of %s: %s live at generation %d, then %d; it printed %v:\n%s", step.what, name, before[name], after[name], got, stdout)
			}
			if step.env != nil && !strings.Contains(stderr, fmt.Sprintf(`msg="rebuild: indexes built" projection=%s generation=%d `, name, after[name])) ||
				step.env != nil && !regexp.MustCompile(`projection=`+name+` generation=\d+ took=\S+ memory_mib=64\n`).MatchString(stderr) {
				t.Fatalf("rebuild of %s: %s's indexes not built with LEDGER_PROJECTOR_REBUILD_INDEX_MEMORY's 64 MiB:\n%s", step.what, name, stderr)
			}
		}
		var building int
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM readmodel.checkpoints WHERE state <> 'live'`).Scan(&building); err != nil || building != 0 {
			t.Fatalf("rebuild of %s left %d generations not live (%v)", step.what, building, err)
		}
		projtest.SameSnapshot(t, "rebuild of "+step.what, rows, projtest.Snapshot(t, env.Pool))
	}
}

// TestStatusShowsTheCheckpoints: `projector status`, in text and with
// --json, shows every checkpoint of readmodel.checkpoints (and the
// publisher's) with its generation, state, position and events, the store's
// head and the lag: none for the projections caught up, every event for the
// publisher, which no test ran.
func TestStatusShowsTheCheckpoints(t *testing.T) {
	env, conn := currentLedger(t)
	if stdout, stderr, code := runProjector(t, storeEnv(env.URL), "rebuild", "--progress=false", "--projection", projections.Accounts); code != 0 {
		t.Fatalf("rebuild: exit %d:\n%s%s", code, stdout, stderr)
	}
	head, err := env.Store.Head(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := checkpointRows(t, conn)
	if len(want) < len(projections.Names) {
		t.Fatalf("%d checkpoints, fewer than the %d projections: %v", len(want), len(projections.Names), want)
	}
	events := int64(len(devtest.ReadAll(t, env.Store)))
	for _, c := range want {
		c.Head = head.String()
		if c.Position == head.String() {
			continue // caught up: no lag
		}
		if c.Position != "0/0" || !strings.HasPrefix(c.Projection, "publisher:") {
			t.Fatalf("checkpoint %+v is neither at the head %s nor the publisher's at the start", c, head)
		}
		c.LagEvents = events // the test runs no publisher: every event is its lag
	}

	stdout, stderr, code := runProjector(t, storeEnv(env.URL), "status", "--json")
	if code != 0 {
		t.Fatalf("status --json: exit %d:\n%s%s", code, stdout, stderr)
	}
	var got []projections.Status
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("status --json: %v:\n%s", err, stdout)
	}
	if len(got) != len(want) {
		t.Fatalf("status --json shows %d checkpoints, the tables hold %d:\n%s", len(got), len(want), stdout)
	}
	seen := map[*projections.Status]bool{}
	for i, s := range got {
		w := want[checkpointKey(s.Projection, s.Generation)]
		if w == nil || seen[w] {
			t.Fatalf("status --json shows %s generation %d, which the tables do not hold, or twice:\n%s", s.Projection, s.Generation, stdout)
		}
		seen[w] = true
		if s.Projection != w.Projection || s.Generation != w.Generation || s.State != w.State || s.Position != w.Position ||
			s.Events != w.Events || !s.UpdatedAt.Equal(w.UpdatedAt) || s.Head != w.Head || s.LagEvents != w.LagEvents || s.LagCapped || (s.LagSeconds > 0) != (w.LagEvents > 0) {
			t.Errorf("status --json's checkpoint %d: %+v, the table's %+v (head %s)", i, s, w, head)
		}
	}

	stdout, stderr, code = runProjector(t, storeEnv(env.URL), "status")
	if code != 0 {
		t.Fatalf("status: exit %d:\n%s%s", code, stdout, stderr)
	}
	seen = map[*projections.Status]bool{}
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != len(want)+1 || !strings.HasPrefix(lines[0], "PROJECTION") {
		t.Fatalf("status shows %d lines, want a header and the tables' %d checkpoints:\n%s", len(lines), len(want), stdout)
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) < 2 {
			t.Fatalf("status line %q", line)
		}
		gen, _ := strconv.Atoi(f[1])
		w := want[checkpointKey(f[0], gen)]
		if w == nil || seen[w] {
			t.Fatalf("status shows %q, which the tables do not hold, or twice:\n%s", line, stdout)
		}
		lagSeconds := "0.0"
		if w.LagEvents > 0 && len(f) > 6 {
			lagSeconds = f[6] // the first event's age as the status ran: over 0
			if secs, err := strconv.ParseFloat(lagSeconds, 64); err != nil || secs <= 0 {
				t.Errorf("status line %q: a lag of %d events, %q seconds", line, w.LagEvents, lagSeconds)
			}
		}
		wantFields := []string{w.Projection, strconv.Itoa(w.Generation), w.State, w.Position, w.Head, strconv.FormatInt(w.LagEvents, 10), lagSeconds, strconv.FormatInt(w.Events, 10), w.UpdatedAt.Format(time.RFC3339)}
		seen[w] = true
		if !slices.Equal(f, wantFields) {
			t.Errorf("status line %q, want the table's %q", line, wantFields)
		}
	}
}

// currentLedger is a ledger with a workload of 12 accounts written and its
// live read models caught up, and a connection to its database.
func currentLedger(t *testing.T) (*projtest.Env, *pgx.Conn) {
	t.Helper()
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Accounts: 12, Commands: 300, Seed: 23})
	runner, err := projections.NewRunner(env.Pool, env.Store, projections.Options{})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, runner)
	return env, connect(t, env.URL)
}

// liveGenerations is each projection's live generation, by name.
func liveGenerations(t *testing.T, conn *pgx.Conn) map[string]int {
	t.Helper()
	gens := map[string]int{}
	rows, _ := conn.Query(context.Background(), `SELECT name, generation FROM readmodel.checkpoints WHERE state = 'live'`)
	var (
		name string
		gen  int
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &gen}, func() error { gens[name] = gen; return nil }); err != nil {
		t.Fatal(err)
	}
	return gens
}

// rebuildLine is what `projector rebuild` prints of a generation switched.
var rebuildLine = regexp.MustCompile(`^(\w+) +generation (\d+) -> (\d+): \d+ events, checked and live at \d+/\d+$`)

// rebuildLines reads a rebuild's output: by projection, the generations it
// switched from and to; a line of another shape but its last fails t.
func rebuildLines(t *testing.T, stdout string) map[string][2]int {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], "rebuilt in ") {
		t.Fatalf("the rebuild does not end with its time:\n%s", stdout)
	}
	out := map[string][2]int{}
	for _, l := range lines[:len(lines)-1] {
		m := rebuildLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("the rebuild printed %q", l)
		}
		from, _ := strconv.Atoi(m[2])
		to, _ := strconv.Atoi(m[3])
		out[m[1]] = [2]int{from, to}
	}
	return out
}

// checkpointRows reads every checkpoint from the tables, the projections'
// and the publisher's ("publisher:<name>", generation 0, live), by
// projection and generation (checkpointKey), as status shows them but for
// the head and lag.
func checkpointRows(t *testing.T, conn *pgx.Conn) map[string]*projections.Status {
	t.Helper()
	out := map[string]*projections.Status{}
	for _, q := range []string{
		`SELECT name, generation, state, commit_position, prepare_position, events, updated_at FROM readmodel.checkpoints`,
		`SELECT 'publisher:' || name, 0, 'live', commit_position, prepare_position, events, updated_at FROM readmodel.publisher_checkpoints`,
	} {
		rows, _ := conn.Query(context.Background(), q)
		var (
			s    projections.Status
			c, p int64
		)
		if _, err := pgx.ForEachRow(rows, []any{&s.Projection, &s.Generation, &s.State, &c, &p, &s.Events, &s.UpdatedAt}, func() error {
			s.Position = fmt.Sprintf("%d/%d", c, p)
			row := s
			out[checkpointKey(s.Projection, s.Generation)] = &row
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func checkpointKey(projection string, generation int) string {
	return projection + " " + strconv.Itoa(generation)
}
