package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/projections"
)

// TestAuditResumeFlag: `ledger audit --resume` without a stop point says so
// and exits 2, as does --resume with --from or --account (invalid), and
// --expect-digest without --from or --resume; LEDGER_AUDIT_RESUME sets it.
func TestAuditResumeFlag(t *testing.T) {
	env, _ := auditedLedger(t, 1)
	for _, c := range []struct {
		env  []string
		args []string
		said string
	}{
		{nil, []string{"audit", "--resume"}, "no stop point is stored"},
		{[]string{"LEDGER_AUDIT_RESUME=true"}, []string{"audit"}, "no stop point is stored"},
		{nil, []string{"audit", "--resume", "--from", "last"}, "not with --from or --account"},
		{nil, []string{"audit", "--resume", "--account", "a"}, "not with --from or --account"},
		{nil, []string{"audit", "--expect-digest", "ab"}, "give the checkpoint (--from) or --resume"},
	} {
		out, stderr, code := runLedger(t, append(env, c.env...), nil, append(c.args, "--log-level", "warn")...)
		if code != 2 || !strings.Contains(stderr, c.said) {
			t.Errorf("%v %v: exit %d, want 2 saying %q:\n%s%s", c.env, c.args, code, c.said, out, stderr)
		}
	}
}

// auditPage is the events of a page of `ledger audit` (audit.Options'
// BatchSize by default); historyEvents the history the SIGTERM test audits:
// six such pages.
const (
	auditPage     = 5000
	historyEvents = 6 * auditPage
)

// TestAuditStoppedBySIGTERMAndResumed: `ledger audit` on a seeded history
// (snapshots, read models rebuilt at the head), sent SIGTERM once it has
// copied its first page's sets, exits 3 and prints its stop point, stored
// as a row of kind stop whose run schema is kept; --resume with another
// digest is refused (exit 1), the stop point kept; --resume --expect-digest
// with the printed one exits 0 with the JSON report of a plain audit run
// through, and leaves no stop point nor run schema. Then the same with an
// event edited before the stop position and one after it: the resume names
// both and exits 1, as the run through does.
func TestAuditStoppedBySIGTERMAndResumed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	env, conn, lenv := seededLedger(t, historyEvents, seed.HistoryOptions{Accounts: 100, SnapshotEvery: 40})
	if _, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{}); err != nil {
		t.Fatal(err)
	}

	stop := stopAuditBySIGTERM(t, conn, lenv)
	wrong := "0" + stop.Digest[1:]
	if wrong == stop.Digest {
		wrong = "1" + stop.Digest[1:]
	}
	out, stderr, code := runLedger(t, lenv, nil, "audit", "--resume", "--expect-digest", wrong, "--log-level", "warn")
	if code != 1 || !strings.Contains(stderr, "not the "+wrong+" expected") {
		t.Fatalf("--resume with another digest: exit %d, want 1 naming the digest expected:\n%s%s", code, out, stderr)
	}
	stopStored(t, conn, stop)
	resumedEqualsRunThrough(t, conn, lenv, stop, 0)

	before := editDeposit(t, conn, `ORDER BY position LIMIT 1`)
	stop = stopAuditBySIGTERM(t, conn, lenv)
	after := editDeposit(t, conn, `ORDER BY position DESC LIMIT 1`)
	if b, a := eventsThrough(t, conn, before), eventsThrough(t, conn, after); b > stop.Events || a <= stop.Events {
		t.Fatalf("edited events %d and %d of the history, stopped after %d: not one before the stop and one after", b, a, stop.Events)
	}
	resumed := resumedEqualsRunThrough(t, conn, lenv, stop, 1)
	for _, id := range []string{before, after} {
		if !names(resumed, id) {
			t.Errorf("the resumed audit does not name event %s: %v", id, resumed.Violations)
		}
	}
}

// stopLine is what a stopped audit prints of its stop point (auditStopped).
var stopLine = regexp.MustCompile(`stop point (\d+) stored at (\S+) after (\d+) events \(digest ([0-9a-f]+)\)`)

// stopAuditBySIGTERM runs `ledger audit --verify-chain`, holds its run
// schema's audit_groups from the schema's creation until the audit waits on
// it (its first page's COPY), sends SIGTERM, and lets go. The fold has then
// ended its first page and waits for its second (being read), or is in its
// second page, or waits at that page's end for the first page's COPY: the
// stop point stands at the first page's end or the second's (a page the
// stop lands in ends: its reads are not cancelled, audit.pageReads), never
// at the head. It checks the exit status 3, the stop point printed and
// stored there, and returns it.
func stopAuditBySIGTERM(t *testing.T, conn *pgx.Conn, env []string) audit.StopRef {
	t.Helper()
	ctx := context.Background()
	app := fmt.Sprintf("auditstop-%d", stops.Add(1))
	var tx pgx.Tx
	defer func() {
		if tx != nil {
			tx.Rollback(ctx)
		}
	}()
	out := stopWhenThen(t, ledgerBinary(t), append(env[:len(env):len(env)], "PGAPPNAME="+app), []string{"audit", "--verify-chain", "--log-level", "warn"}, config.ExitStopped, func() error {
		if tx == nil {
			return holdSets(ctx, conn, &tx)
		}
		return waitsOnLock(ctx, tx, app)
	}, func() { tx.Rollback(ctx); tx = nil })
	m := stopLine.FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "audit stopped") {
		t.Fatalf("the stopped audit does not print its stop point:\n%s", out)
	}
	id, _ := strconv.ParseInt(m[1], 10, 64)
	events, _ := strconv.ParseInt(m[3], 10, 64)
	stop := audit.StopRef{ID: id, Position: m[2], Events: events, Digest: m[4]}
	var head int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	if (stop.Events != auditPage && stop.Events != 2*auditPage) || stop.Events >= head {
		t.Fatalf("stopped after %d events: not at the first page's end (%d) or the second's before the head (%d)", stop.Events, auditPage, head)
	}
	stopStored(t, conn, stop)
	return stop
}

// holdSets takes, in *tx, the run schema's audit_groups as soon as the
// schema exists: the first page's COPY then waits on it, so the audit,
// found waiting, has folded its first page and cannot reach the head before
// the signal; until then it says why not.
func holdSets(ctx context.Context, conn *pgx.Conn, tx *pgx.Tx) error {
	var schema string
	if err := conn.QueryRow(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 'audit\_sets\_%'`).Scan(&schema); err != nil {
		return fmt.Errorf("no run schema yet: %w", err)
	}
	held, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := held.Exec(ctx, `LOCK TABLE `+schema+`.audit_groups IN ACCESS EXCLUSIVE MODE`); err != nil {
		held.Rollback(ctx)
		return err
	}
	*tx = held
	return fmt.Errorf("%s held: the audit does not wait on it yet", schema)
}

// stopStored checks that stop is stored: a row of kind stop whose run
// schema exists, the only stop point.
func stopStored(t *testing.T, conn *pgx.Conn, stop audit.StopRef) {
	t.Helper()
	var kind string
	var schema bool
	err := conn.QueryRow(context.Background(), `SELECT c.kind, EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = c.sets)
		FROM readmodel.audit_checkpoints c WHERE c.id = $1`, stop.ID).Scan(&kind, &schema)
	if err != nil || kind != "stop" || !schema {
		t.Fatalf("stop point %d: kind %q, its run schema present %v (%v)", stop.ID, kind, schema, err)
	}
	if n := stopsLeft(t, conn); n != 1 {
		t.Fatalf("%d stop points stored, want 1", n)
	}
}

// stopsLeft counts the stop points and run schemas.
func stopsLeft(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var stops, schemas int
	err := conn.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM readmodel.audit_checkpoints WHERE kind = 'stop'),
		(SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'audit\_sets\_%')`).Scan(&stops, &schemas)
	if err != nil || stops != schemas {
		t.Fatalf("%d stop points, %d run schemas (%v)", stops, schemas, err)
	}
	return stops
}

// resumedEqualsRunThrough resumes from stop (exit want), checks that its
// JSON report is a plain audit's run through (exit want too), what each
// stored and resumed from aside, and that no stop point nor run schema is
// left; it returns the resumed report.
func resumedEqualsRunThrough(t *testing.T, conn *pgx.Conn, env []string, stop audit.StopRef, want int) *audit.Report {
	t.Helper()
	resumed, resumedJSON := auditJSON(t, env, want, "--resume", "--expect-digest", stop.Digest)
	if resumed.Resumed == nil || *resumed.Resumed != stop {
		t.Fatalf("resumed from %+v, want %+v", resumed.Resumed, stop)
	}
	if n := stopsLeft(t, conn); n != 0 {
		t.Fatalf("%d stop points left after the resume", n)
	}
	_, throughJSON := auditJSON(t, env, want)
	if resumedJSON != throughJSON {
		t.Fatalf("resumed:\n%s\nrun through:\n%s", resumedJSON, throughJSON)
	}
	return resumed
}

// auditJSON runs `ledger audit --json --verify-chain args`, checks its exit
// status, and returns its report and the report's JSON without what two
// audits of one history differ in by design: the checkpoint each stored,
// the stop point resumed from.
func auditJSON(t *testing.T, env []string, want int, args ...string) (*audit.Report, string) {
	t.Helper()
	out, stderr, code := runLedger(t, env, nil, append([]string{"audit", "--json", "--verify-chain", "--log-level", "warn"}, args...)...)
	var rep audit.Report
	var fields map[string]json.RawMessage
	if err := errors.Join(json.Unmarshal(out, &rep), json.Unmarshal(out, &fields)); err != nil || code != want {
		t.Fatalf("ledger audit --json %v: exit %d, want %d (%v):\n%s%s", args, code, want, err, out, stderr)
	}
	delete(fields, "checkpoint")
	delete(fields, "resumed_from")
	b, err := json.MarshalIndent(fields, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return &rep, string(b)
}

// editDeposit edits the amount in the data of the deposit that order picks
// (its hash chain, fold and read models no longer match it) and returns its
// event ID.
func editDeposit(t *testing.T, conn *pgx.Conn, order string) string {
	t.Helper()
	var id string
	err := conn.QueryRow(context.Background(), `UPDATE events SET data = convert_to(replace(convert_from(data, 'UTF8'), '"amount":', '"amount":1'), 'UTF8')
		WHERE event_id = (SELECT event_id FROM events WHERE type = 'Credited' AND convert_from(data, 'UTF8')::jsonb->>'reason' = 'deposit' `+order+`)
		RETURNING event_id::text`).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// eventsThrough counts the events of "all" up to and including id.
func eventsThrough(t *testing.T, conn *pgx.Conn, id string) int64 {
	t.Helper()
	var n int64
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE position <= (SELECT position FROM events WHERE event_id = $1::uuid)`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// names says whether rep names the event id in a violation.
func names(rep *audit.Report, id string) bool {
	for _, v := range rep.Violations {
		if v.EventID == id {
			return true
		}
	}
	return false
}
