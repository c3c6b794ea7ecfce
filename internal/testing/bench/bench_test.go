package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/platform/devenv"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A tiny run end to end: both systems through every phase, the key check and the
// projector. It checks the report's shape and, in the baseline's own tables, that
// every new command was applied exactly once and every resend wrote nothing. No
// figure is asserted: timings on a shared machine prove nothing.
func TestRunTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS servers and PostgreSQL databases")
	}
	// A bound, not a timing: generous, since the machine is shared.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	baselineURL := pgtest.URL(t)
	cfg := Config{
		Clients:              4,
		Accounts:             25,
		DuplicateRatio:       0.3,
		Skew:                 1.1,
		Duration:             time.Second,
		Warmup:               200 * time.Millisecond,
		JetStreamMessages:    40,
		KeyCheckEvents:       keyCheckRecentKeys + 100, // longer than the keys an aggregate remembers
		KeyCheckSamples:      10,
		ProjectionTimeout:    time.Minute,
		HistoryEvents:        1500,
		HistorySnapshotEvery: 20, // a history of ~40 events an account: snapshots for the audit to check
		Capture:              true,
		Grace:                500 * time.Millisecond,
		DataDir:              t.TempDir(),
		LedgerDatabaseURL:    pgtest.URL(t),
		BaselineDatabaseURL:  baselineURL,
		NoFsync:              true,
	}
	cfg.HistoryMemoryLimit, cfg.HistoryMemoryLimitSet = "1GiB", true
	limitBefore := debug.SetMemoryLimit(-1) // -1 reads it
	rep, text, lines := runTiny(ctx, t, cfg)
	checkHistory(t, rep.History, lines)
	if r, a := rep.History.Rebuild.MemoryLimitMB, rep.History.Audit.MemoryLimitMB; r != 1024 || a != 1024 {
		t.Errorf("history ran under memory limits of %v and %v MiB, want HistoryMemoryLimit's 1024", r, a)
	}
	if l := debug.SetMemoryLimit(-1); l != limitBefore {
		t.Errorf("the memory limit after the run is %d, was %d before", l, limitBefore)
	}
	last := lines[len(lines)-1]
	if !regexp.MustCompile(`^ratio ledger/baseline commands/s: [0-9]+\.[0-9]{2}$`).MatchString(last) || last != rep.RatioLine() {
		t.Fatalf("last line %q", last)
	}
	if b := lines[len(lines)-2]; !regexp.MustCompile(`^ratio batch/single commands/s: [0-9]+\.[0-9]{2}$`).MatchString(b) || b != rep.BatchRatioLine() {
		t.Fatalf("line before the last %q", b)
	}
	if hot := lines[len(lines)-3]; !regexp.MustCompile(`^ratio hot/uniform commands/s: [0-9]+\.[0-9]{2}$`).MatchString(hot) || hot != rep.HotRatioLine() {
		t.Fatalf("third line from the end %q", hot)
	}
	if l, b := rep.Phase(SystemLedger, PhaseLoad), rep.Phase(SystemLedger, PhaseBatch); rep.BatchRatio <= 0 || rep.BatchRatio != b.CommandsPerSec/l.CommandsPerSec {
		t.Fatalf("batch ratio %v: batch %+v, load %+v", rep.BatchRatio, b, l)
	}
	if b, h := rep.Phase(SystemLedger, PhaseBatch), rep.Phase(SystemLedger, PhaseHotBatch); rep.HotBatchRatio <= 0 || rep.HotBatchRatio != h.CommandsPerSec/b.CommandsPerSec {
		t.Fatalf("hot batch ratio %v: hot batch %+v, batch %+v", rep.HotBatchRatio, h, b)
	}
	if l, h := rep.Phase(SystemLedger, PhaseLoad), rep.Phase(SystemLedger, PhaseHot); rep.HotRatio <= 0 || rep.HotRatio != h.CommandsPerSec/l.CommandsPerSec {
		t.Fatalf("hot ratio %v: hot %+v, load %+v", rep.HotRatio, h, l)
	}
	if rep.Ratio <= 0 {
		t.Fatalf("ratio %v", rep.Ratio)
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	if !strings.Contains(md.String(), "| ledger | load |") || !strings.Contains(md.String(), rep.RatioLine()) {
		t.Errorf("markdown:\n%s", md.String())
	}

	phases := []string{PhaseLoad, PhaseHot, PhaseBatch, PhaseHotBatch, PhaseDuplicates, PhaseHalfLoad, PhaseCapture, PhaseJSPublish, PhaseJSConsume}
	if len(rep.Phases) != 2*len(phases) {
		t.Fatalf("%d phases: %+v", len(rep.Phases), rep.Phases)
	}
	var rrNew, jsNew int64 // new commands the baseline got, by request-reply and by JetStream
	for _, sys := range []string{SystemLedger, SystemBaseline} {
		for _, name := range phases {
			p := rep.Phase(sys, name)
			if p == nil {
				t.Fatalf("no %s/%s", sys, name)
			}
			if p.Commands <= 0 || p.CommandsPerSec <= 0 || p.Seconds <= 0 || p.Errors != 0 || p.Anomalies != 0 || p.Mode == "" {
				t.Errorf("%s/%s: %+v", sys, name, *p)
			}
			switch name {
			case PhaseLoad, PhaseHot, PhaseBatch, PhaseHotBatch, PhaseDuplicates, PhaseHalfLoad:
				if p.P50Ms <= 0 || p.P50Ms > p.P99Ms || p.P99Ms > p.P999Ms || p.P999Ms > p.MaxMs {
					t.Errorf("%s/%s latencies: %+v", sys, name, *p)
				}
				if sys == SystemBaseline {
					rrNew += p.NewAnswered + p.WarmupNewAnswered
				}
			case PhaseJSPublish, PhaseJSConsume:
				if sys == SystemBaseline {
					jsNew += p.NewAnswered
				}
			}
		}
		if d := rep.Phase(sys, PhaseDuplicates); d.Duplicates != d.Commands || d.NewApplied != 0 {
			t.Errorf("%s duplicates phase: %+v", sys, *d)
		}
		if l := rep.Phase(sys, PhaseLoad); l.Duplicates == 0 || l.NewApplied == 0 || l.Duplicates+l.NewApplied != l.Commands ||
			l.NewApplied+l.EarlyDuplicates != l.NewAnswered {
			t.Errorf("%s load phase: %+v", sys, *l)
		}
		if h := rep.Phase(sys, PhaseHalfLoad); h.TargetRate <= 0 {
			t.Errorf("%s half-load phase: %+v", sys, *h)
		}
	}
	if k := rep.KeyCheck; k == nil || k.Short.Events != 10 || k.Long.Events != cfg.KeyCheckEvents || k.Long.ColdLoadMs <= 0 || k.Long.PeakHeapMB <= 0 || k.Long.HeldHeapMB <= 0 ||
		k.Long.Duplicate10Ns <= 0 || k.Long.DuplicateSpreadNs <= 0 || k.Long.DecideP50Us <= 0 || k.Long.DecideOnly10Ns <= 0 ||
		k.Long.DecideOnlySpreadNs <= 0 || k.LikeForLike() <= 0 || k.Spread() <= 0 || k.Long.SpreadKeys != 10 {
		t.Errorf("key check: %+v", rep.KeyCheck)
	}
	checkFirstResends(t, rep.KeyCheck, text)
	if p := rep.Projection; p == nil || !p.CaughtUp || p.Events <= 0 || p.EventsPerSec <= 0 {
		t.Errorf("projection: %+v", rep.Projection)
	}

	// The baseline's tables: every account opened once; every new deposit or
	// withdrawal (request-reply or JetStream) completed with exactly one entry;
	// no resend wrote anything; balances are the sums of their entries.
	count := counter(ctx, t, baselineURL)
	if n := count(`SELECT count(*) FROM accounts`); n != int64(cfg.Accounts) {
		t.Errorf("%d accounts, want %d", n, cfg.Accounts)
	}
	if n := count(`SELECT count(*) FROM idempotency_keys WHERE status <> 'completed'`); n != 0 {
		t.Errorf("%d keys not completed", n)
	}
	want := rrNew + jsNew
	if n := count(`SELECT count(*) FROM entries`); n != want {
		t.Errorf("%d entries, want %d (%d by request-reply, %d by JetStream)", n, want, rrNew, jsNew)
	}
	if n := count(`SELECT count(*) FROM idempotency_keys k WHERE k.response->>'account' IS NOT NULL AND k.key NOT LIKE 'open-%'`); n != want {
		t.Errorf("%d completed money keys, want %d", n, want)
	}
	if n := count(`SELECT count(*) FROM (SELECT idempotency_key FROM entries GROUP BY 1 HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d keys with more than one entry", n)
	}
	if n := count(`SELECT count(*) FROM entries e LEFT JOIN idempotency_keys k ON k.key = e.idempotency_key WHERE k.key IS NULL OR k.status <> 'completed'`); n != 0 {
		t.Errorf("%d entries without a completed key", n)
	}
	if n := count(`SELECT count(*) FROM accounts a WHERE a.balance <> coalesce((SELECT sum(amount) FROM entries e WHERE e.account_id = a.account_id), 0)`); n != 0 {
		t.Errorf("%d accounts whose balance is not the sum of their entries", n)
	}
}

// TestRunTinyTransactions: with a transaction ratio the ledger's phases send
// post_transaction too (in the hot phase, touching the hot account), every one
// answered without an error or an anomaly and posted; a ratio with the
// baseline among the systems is refused. The run has the many-accounts phases
// too (over 2,500 accounts, decided in three batches, the last one short, and
// loaded in one COPY):
// every account opened once in the store, both phases answered without an
// error or an anomaly, the ledger's heap found in the heap profile, and the
// many/few ratio printed just before the last line.
func TestRunTinyTransactions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS servers and PostgreSQL databases")
	}
	if _, err := Run(context.Background(), Config{TransactionRatio: 0.5, Systems: []string{SystemLedger, SystemBaseline}}); err == nil || !strings.Contains(err.Error(), "--systems ledger") {
		t.Fatalf("a transaction ratio with the baseline: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ledgerURL := pgtest.URL(t)
	const many = 2500
	rep, _, lines := runTiny(ctx, t, Config{
		Clients: 4, Accounts: 25, DuplicateRatio: 0.2, TransactionRatio: 0.5, Duration: time.Second, Warmup: 200 * time.Millisecond,
		Grace: 500 * time.Millisecond, DataDir: t.TempDir(), ManyAccounts: many,
		LedgerDatabaseURL: ledgerURL, Systems: []string{SystemLedger}, NoFsync: true,
	})
	for _, name := range []string{PhaseLoad, PhaseHot, PhaseMany, PhaseManyHalfLoad} {
		if p := rep.Phase(SystemLedger, name); p == nil || p.Commands <= 0 || p.Errors != 0 || p.Anomalies != 0 {
			t.Fatalf("%s: %+v", name, p)
		}
	}
	checkMany(t, rep, lines, many)
	conn, err := pgx.Connect(ctx, ledgerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var posted, rejected, opened, openedStreams int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE type = 'TransactionPosted'), count(*) FILTER (WHERE type = 'TransactionRejected') FROM events`).Scan(&posted, &rejected); err != nil {
		t.Fatal(err)
	}
	if posted == 0 || rejected != 0 {
		t.Fatalf("%d transactions posted, %d rejected", posted, rejected)
	}
	prefix := "account-" + rep.Many.AccountPrefix
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT stream) FROM events WHERE type = 'AccountOpened' AND starts_with(stream, $1)`, prefix).Scan(&opened, &openedStreams); err != nil {
		t.Fatal(err)
	}
	if opened != many || openedStreams != many {
		t.Fatalf("%d accounts opened on %d streams named %s*, want %d", opened, openedStreams, prefix, many)
	}
}

// checkMany: the many-accounts report, its ratio and its line.
func checkMany(t *testing.T, rep *Report, lines []string, accounts int) {
	t.Helper()
	l, m := rep.Phase(SystemLedger, PhaseLoad), rep.Phase(SystemLedger, PhaseMany)
	if rep.ManyRatio <= 0 || rep.ManyRatio != m.CommandsPerSec/l.CommandsPerSec {
		t.Fatalf("many ratio %v: many %+v, load %+v", rep.ManyRatio, m, l)
	}
	if mr := rep.Many; mr == nil || mr.Accounts != accounts || mr.OpenSeconds <= 0 || mr.LedgerHeapMB <= 0 || mr.ProcessPeakHeapMB < mr.LedgerHeapMB {
		t.Fatalf("many report %+v", rep.Many)
	}
	// Warmed once opened (Config.ManyCold unset), the accounts load cold
	// no more; left cold, every first command reads its account.
	if mr := rep.Many; mr.Warmed != int64(accounts) || mr.WarmSeconds <= 0 || m.ColdLoadsPerCommand != 0 {
		t.Fatalf("many accounts warmed %d in %vs, %v cold loads a command, want %d and none: %+v", mr.Warmed, mr.WarmSeconds, m.ColdLoadsPerCommand, accounts, m)
	}
	// Settled once warmed (Config.ManyUnsettled unset), as after a bulk
	// load; PostgreSQL's part of each phase sampled.
	if mr := rep.Many; mr.SettleSeconds <= 0 || mr.SettleError != "" || !strings.Contains(strings.Join(lines, "\n"), "settled by VACUUM (ANALYZE) and CHECKPOINT") {
		t.Fatalf("many accounts not settled: %+v", mr)
	}
	if h := rep.Phase(SystemLedger, PhaseManyHalfLoad); m.PG == nil || h.PG == nil {
		t.Fatalf("many phases without PostgreSQL's figures: %+v, %+v", m.PG, h.PG)
	}
	if m.PoolAcquiresPerCommand <= 0 || !strings.Contains(strings.Join(lines, "\n"), "the ledger's PostgreSQL pool per answered command") {
		t.Fatalf("many phase without its pool's figures: %+v", m)
	}
	if h := rep.Phase(SystemLedger, PhaseManyHalfLoad); h.TargetRate != m.CommandsPerSec/2 {
		t.Fatalf("many half-load at %v, the many phase at %v", h.TargetRate, m.CommandsPerSec)
	}
	if b := lines[len(lines)-2]; !regexp.MustCompile(`^ratio many/few accounts commands/s: [0-9]+\.[0-9]{2}$`).MatchString(b) || b != rep.ManyRatioLine() {
		t.Fatalf("line before the last %q", b)
	}
	if last := lines[len(lines)-1]; last != rep.RatioLine() {
		t.Fatalf("last line %q", last)
	}
}

// TestRunTinyKurrentTest: the ledger on the in-process KurrentDB test server
// (--event-store kurrenttest) through the load, hot, duplicates and half-load
// phases, the key check on a stream longer than the aggregate's recent keys,
// and the projector into PostgreSQL's read models. It checks the report's
// lines, that the duplicates of old keys were answered through the store (their
// records recalled), and, in the read models, that every new command was
// applied exactly once. No figure is asserted.
func TestRunTinyKurrentTest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS server, a KurrentDB test server and a PostgreSQL database")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ledgerURL := pgtest.URL(t)
	cfg := Config{
		EventStore:        EventStoreKurrentTest,
		Systems:           []string{SystemLedger},
		Clients:           4,
		Accounts:          10,
		DuplicateRatio:    0.3,
		Duration:          time.Second,
		Warmup:            200 * time.Millisecond,
		KeyCheckEvents:    keyCheckRecentKeys + 100, // longer than the keys an aggregate remembers
		KeyCheckSamples:   10,
		ProjectionTimeout: time.Minute,
		Grace:             500 * time.Millisecond,
		DataDir:           t.TempDir(),
		LedgerDatabaseURL: ledgerURL,
		NoFsync:           true,
	}
	rep, text, lines := runTiny(ctx, t, cfg)
	if last := lines[len(lines)-1]; last != "ratio ledger/baseline commands/s: 0.00" { // no baseline driven
		t.Errorf("last line %q", last)
	}
	if b := lines[len(lines)-2]; b != rep.BatchRatioLine() || rep.BatchRatio <= 0 {
		t.Errorf("line before the last %q (batch ratio %v)", b, rep.BatchRatio)
	}
	if hot := lines[len(lines)-3]; hot != rep.HotRatioLine() || rep.HotRatio <= 0 {
		t.Errorf("third line from the end %q (hot ratio %v)", hot, rep.HotRatio)
	}
	for _, want := range []string{
		"ledger event store: the KurrentDB test server",
		"NOT a real KurrentDB's",
		"ledger group commit none (KurrentDB",
		"calls to the KurrentDB test server per answered command: ledger/load ",
		"key check (ledger.Service on the KurrentDB test server store;",
		"recalled through the key's claim stream key-<K>",
		fmt.Sprintf("over %d keys older than the aggregate's %d recent keys, every one recalled from the store", rep.KeyCheck.Long.FirstResendKeys, keyCheckRecentKeys),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report without %q:\n%s", want, text)
		}
	}
	if rep.Config.EventStore != EventStoreKurrentTest || rep.Config.GroupCommit {
		t.Errorf("config %+v", rep.Config)
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	if !strings.Contains(md.String(), "ledger event store: the KurrentDB test server") || !strings.Contains(md.String(), "| ledger | hot |") {
		t.Errorf("markdown:\n%s", md.String())
	}

	var newAnswered int64 // new commands the ledger answered, warm-ups included
	for _, name := range []string{PhaseLoad, PhaseHot, PhaseBatch, PhaseHotBatch, PhaseDuplicates, PhaseHalfLoad} {
		p := rep.Phase(SystemLedger, name)
		if p == nil {
			t.Fatalf("no ledger/%s", name)
		}
		if p.Commands <= 0 || p.Errors != 0 || p.Anomalies != 0 || p.P50Ms <= 0 {
			t.Errorf("%s: %+v", name, *p)
		}
		// A new key the JetStream consumer decided before the request-reply
		// path (a reply slower than the capture's grace, as under a loaded
		// machine) is answered duplicate: true: it was applied all the same.
		if name != PhaseDuplicates && (p.NewApplied+p.EarlyDuplicates <= 0 || p.StoreAppendsPerCommand <= 0) {
			t.Errorf("%s: nothing applied, or no appends counted: %+v", name, *p)
		}
		newAnswered += p.NewAnswered + p.WarmupNewAnswered
	}
	if d := rep.Phase(SystemLedger, PhaseDuplicates); d.Duplicates != d.Commands || d.NewApplied != 0 || d.StoreAppendsPerCommand != 0 {
		t.Errorf("duplicates phase: %+v", *d)
	}
	if k := rep.KeyCheck; k == nil || k.Long.Events != cfg.KeyCheckEvents {
		t.Fatalf("key check: %+v", k)
	}
	checkFirstResends(t, rep.KeyCheck, text)
	if p := rep.Projection; p == nil || !p.CaughtUp || p.Events <= 0 {
		t.Fatalf("projection: %+v", rep.Projection)
	}

	// The read models, projected from the test server: every account opened,
	// each new deposit or withdrawal one entry, no key applied twice, balances
	// the sums of their entries. The key check's accounts (kc…): their seeded
	// deposits and its new ones.
	count := counter(ctx, t, ledgerURL)
	if n := count(`SELECT count(*) FROM readmodel.accounts WHERE account_id NOT LIKE 'kc%'`); n != int64(cfg.Accounts) {
		t.Errorf("%d accounts, want %d", n, cfg.Accounts)
	}
	if n := count(`SELECT count(*) FROM readmodel.entries WHERE account_id NOT LIKE 'kc%'`); n != newAnswered {
		t.Errorf("%d entries, want %d", n, newAnswered)
	}
	seeded := int64(10 - 1 + cfg.KeyCheckEvents - 1 + 2*cfg.KeyCheckSamples) // deposits of both streams, then the timed new ones
	if n := count(`SELECT count(*) FROM readmodel.entries WHERE account_id LIKE 'kc%'`); n != seeded {
		t.Errorf("%d entries on the key check's accounts, want %d", n, seeded)
	}
	if n := count(`SELECT count(*) FROM (SELECT idempotency_key FROM readmodel.entries GROUP BY 1 HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d keys with more than one entry", n)
	}
	if n := count(`SELECT count(*) FROM readmodel.accounts a WHERE a.balance <> coalesce((SELECT sum(amount) FROM readmodel.entries e WHERE e.account_id = a.account_id), 0)`); n != 0 {
		t.Errorf("%d accounts whose balance is not the sum of their entries", n)
	}
}

// runTiny runs cfg, its progress on stderr with -v, and returns the report and
// its printed text, whole and in lines.
func runTiny(ctx context.Context, t *testing.T, cfg Config) (*Report, string, []string) {
	t.Helper()
	if testing.Verbose() {
		cfg.Progress = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.Print(&out)
	return rep, out.String(), strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
}

// checkFirstResends: a key check's first resends on its long stream (longer
// than the aggregate's recent keys) were duplicates of old keys, each record
// recalled from the store, and the report's targets hold their p99; the short
// stream's keys were all remembered.
func checkFirstResends(t *testing.T, k *KeyCheckReport, report string) {
	t.Helper()
	if k == nil {
		t.Fatal("no key check")
	}
	if l := k.Long; !l.FirstResendOld || l.FirstResendKeys == 0 || l.FirstResendRecalled != l.FirstResendKeys || l.FirstResendP99Us <= 0 ||
		k.Short.FirstResendOld || k.Short.FirstResendRecalled != 0 {
		t.Errorf("first resends: short %+v, long %+v", k.Short, l)
	}
	if want := fmt.Sprintf("p99 of a duplicate of an old key, %d events (ms)", k.Long.Events); !strings.Contains(report, want) {
		t.Errorf("report without %q:\n%s", want, report)
	}
}

// counter connects to a database for the rest of the test and returns a
// function that runs a query of one count.
func counter(ctx context.Context, t *testing.T, url string) func(q string) int64 {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return func(q string) int64 {
		t.Helper()
		var n int64
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
}

// checkHistory: the history phase seeded what it was asked, rebuilt and audited
// the whole store without an error (the audit finding no violation), and
// printed its two rates just before the ratio lines.
func checkHistory(t *testing.T, h *HistoryReport, lines []string) {
	t.Helper()
	if h == nil {
		t.Fatal("no history phase")
	}
	if h.Seeded < 1500 || h.Rebuild.Error != "" || h.Audit.Error != "" || h.Audit.Events < h.Seeded || h.Rebuild.Events != h.Audit.Events || h.Snapshots == 0 {
		t.Fatalf("history %+v", h)
	}
	if r, a := lines[len(lines)-6], lines[len(lines)-5]; !regexp.MustCompile(`^rebuild events/s: [0-9]+$`).MatchString(r) || !regexp.MustCompile(`^audit events/s: [0-9]+$`).MatchString(a) {
		t.Fatalf("lines before the ratios: %q, %q", r, a)
	}
}

// TestRunTinyPairAndLone: on a pair (Standby), the ledger's load phase runs
// again alternately with the standby not required and required, on the same
// cluster: each lone phase ran with synchronous_standby_names cleared and no
// backend seen waiting for the standby, the pair phases with '*' and backends
// seen waiting (sampled over both rounds), and the report prints the pair/lone
// ratio of their commands/s before the existing ratio lines. No figure is
// asserted.
func TestRunTinyPairAndLone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS server and a PostgreSQL primary with its standby")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, _, lines := runTiny(ctx, t, Config{
		Systems: []string{SystemLedger}, Standby: true, NoFsync: true,
		Clients: 4, Accounts: 25, DuplicateRatio: 0.2, Duration: time.Second, Warmup: 200 * time.Millisecond,
		Grace: 500 * time.Millisecond, DataDir: t.TempDir(),
	})
	var pairWaits int64
	for round := 1; round <= pairRounds; round++ {
		for _, c := range []struct {
			phase, names string
		}{{PhaseLoadLone, ""}, {PhaseLoadPair, "*"}} {
			name := fmt.Sprintf("%s-%d", c.phase, round)
			p := rep.Phase(SystemLedger, name)
			if p == nil || p.Commands <= 0 || p.Errors != 0 || p.Anomalies != 0 || p.SyncStandbyNames == nil || *p.SyncStandbyNames != c.names {
				t.Fatalf("%s: %+v", name, p)
			}
			if p.SyncRepSamples <= 0 {
				t.Errorf("%s: no sample of the backends waiting for the standby", name)
			}
			if c.phase == PhaseLoadLone && p.SyncRepWaits != 0 {
				t.Errorf("%s: %d backends waiting for the standby with none required", name, p.SyncRepWaits)
			}
			if c.phase == PhaseLoadPair {
				pairWaits += p.SyncRepWaits
			}
		}
	}
	if pairWaits == 0 {
		t.Errorf("no backend seen waiting for the standby in the pair phases")
	}
	if rep.PairRatio <= 0 {
		t.Fatalf("pair ratio %v", rep.PairRatio)
	}
	if l := lines[len(lines)-4]; !regexp.MustCompile(`^ratio pair/lone commands/s: [0-9]+\.[0-9]{2}$`).MatchString(l) || l != rep.PairRatioLine() {
		t.Fatalf("fourth line from the end %q", l)
	}
	if hot := lines[len(lines)-3]; hot != rep.HotRatioLine() {
		t.Fatalf("third line from the end %q", hot)
	}
}

// TestRunTarget: with TargetNATSURL the bench starts nothing and drives the
// ledger it is given (here one started beside it, as `ledger dev` in another
// process would be): the accounts are opened through it and the load phase
// alone is reported, its new commands applied in that ledger's store, with
// no error. No figure is asserted.
func TestRunTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS and a ledger")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dbURL := pgtest.URL(t)
	env, err := devenv.Start(ctx, devenv.Options{DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", DatabaseURL: dbURL, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop(context.WithoutCancel(ctx))
	cfg := Config{Clients: 4, Accounts: 20, DuplicateRatio: 0.2, Duration: time.Second, Warmup: 100 * time.Millisecond, TargetNATSURL: env.NATSURL}
	rep, text, _ := runTiny(ctx, t, cfg)
	if len(rep.Phases) != 1 || rep.Phases[0].Phase != PhaseLoad || rep.Phases[0].Errors != 0 || rep.Phases[0].NewApplied == 0 {
		t.Fatalf("phases %+v", rep.Phases)
	}
	if !strings.Contains(text, "target: a ledger in another process at "+env.NATSURL) {
		t.Fatalf("the report does not name its target:\n%s", text)
	}
	var md bytes.Buffer // the Markdown report names the target, and none of this process's settings, which did not describe it
	rep.Markdown(&md)
	if !strings.Contains(md.String(), "target: a ledger in another process at "+env.NATSURL) || strings.Contains(md.String(), "JetStream capture") || strings.Contains(md.String(), "event store:") || strings.Contains(md.String(), "PostgreSQL") {
		t.Fatalf("the Markdown report does not name its target alone:\n%s", md.String())
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var opened int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE type = 'AccountOpened'`).Scan(&opened); err != nil {
		t.Fatal(err)
	}
	if opened != cfg.Accounts {
		t.Fatalf("%d accounts opened in the target's store, want %d", opened, cfg.Accounts)
	}
}

// TestRunHistoryOnly: --systems none --accounts N --history M leaves a history
// over exactly N accounts in the ledger's event store (the load phase, which
// opens N of its own, is not run), and the report says which they are and
// how many others the run opened (the key check's, on here); its last lines
// keep their protocol.
func TestRunHistoryOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS server and a PostgreSQL database")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ledgerURL := pgtest.URL(t)
	const accounts = 30
	rep, text, lines := runTiny(ctx, t, Config{
		Systems: []string{SystemNone}, Accounts: accounts, HistoryEvents: 1500, HistorySnapshotEvery: 20,
		KeyCheckEvents: 20, KeyCheckSamples: 5,
		DataDir: t.TempDir(), LedgerDatabaseURL: ledgerURL, NoFsync: true,
	})
	checkHistory(t, rep.History, lines)
	if len(rep.Phases) != 0 || !strings.Contains(text, "\nno system driven: no phase of the systems\n") || strings.Contains(text, "commands/s  p50 ms") {
		t.Fatalf("phases %+v, or a table of phases in the report: a system was driven\n%s", rep.Phases, text)
	}
	conn, err := pgx.Connect(ctx, ledgerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var opened, streams, history, theirs int64
	first, last := rep.History.FirstAccount, rep.History.LastAccount
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT stream),
		count(*) FILTER (WHERE stream LIKE 'account-' || $3 || '%'),
		count(*) FILTER (WHERE stream IN ('account-' || $1, 'account-' || $2)) FROM events WHERE type = 'AccountOpened'`,
		first, last, strings.TrimSuffix(first, "0")).Scan(&opened, &streams, &history, &theirs); err != nil {
		t.Fatal(err)
	}
	if history != accounts || theirs != 2 || opened != streams || opened != accounts+int64(rep.History.OtherAccounts) {
		t.Fatalf("%d accounts opened on %d streams, %d of them the history's (%d of them %s and %s), the report's others %d: want %d the history's, its first and last among them, and the others as many as the report says",
			opened, streams, history, theirs, first, last, rep.History.OtherAccounts, accounts)
	}
	want := fmt.Sprintf("over %d accounts in ", accounts)
	others := fmt.Sprintf("the store also holds the %d accounts this run's other phases opened", rep.History.OtherAccounts)
	if !strings.Contains(text, want) || !strings.Contains(text, first+" to "+last+"; "+others) {
		t.Fatalf("report without %q and the history's accounts:\n%s", want, text)
	}
	if last := lines[len(lines)-1]; last != rep.RatioLine() {
		t.Fatalf("last line %q", last)
	}
}
