package audit_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// stopAt runs a full audit stopped by its context at the end of its page
// pages (a hook at a page's end: Progress) and returns the stop point it
// stored.
func stopAt(t *testing.T, env *projtest.Env, opts audit.Options, pages int) *audit.StopRef {
	t.Helper()
	return stopAtOn(t, env, env.Store, opts, pages)
}

// stopAtOn is stopAt of an audit of store (env's sets and read models).
func stopAtOn(t *testing.T, env *projtest.Env, store audit.Store, opts audit.Options, pages int) *audit.StopRef {
	t.Helper()
	opts.ReadModels = env.Pool
	stop := stopWith(t, env, store, opts, pages)
	if s := runSchemas(t, env.Pool); len(s) != 1 {
		t.Fatalf("run schemas after the stop: %v, want its one", s)
	}
	return stop
}

// comparable blanks what differs between two audits of one history by
// design: the checkpoint each stored, the stop point resumed from.
func comparable(t *testing.T, rep *audit.Report) string {
	t.Helper()
	r := *rep
	r.Checkpoint, r.Resumed = nil, nil
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStoppedAuditResumedEqualsOneRunThrough: an audit stopped half-way by
// its context and resumed gives the report of one run through (violations,
// counts, digests, read-model comparisons), on a history with corruptions
// planted before the stop (an edited event, a balance off by one) and after
// it (a duplicated event, a key decided again that was decided before the
// stop), each found, the corrupted one's resume stopped and resumed again;
// a clean history resumed stores the checkpoint a run through stores (its
// state and account rows).
func TestStoppedAuditResumedEqualsOneRunThrough(t *testing.T) {
	for _, corrupt := range []bool{false, true} {
		t.Run(map[bool]string{false: "clean", true: "corrupted"}[corrupt], func(t *testing.T) {
			env := projected(t, projtest.Workload{Commands: 80, Seed: 11})
			opts := audit.Options{BatchSize: 7, VerifyChain: true, SaveCheckpoint: !corrupt}
			snapshotEveryAccount(t, env)
			d1, d2 := twoDeposits(t, env)
			if corrupt {
				plantAcrossTheStop(t, env, d1, d2)
			}
			through := run(t, env, opts)
			if through.Snapshots == 0 {
				t.Fatal("no snapshot checked")
			}
			stop := stopAt(t, env, opts, 8)
			if before := eventsUpTo(t, env, d2.id); stop.Events <= before || stop.Events >= through.Events {
				t.Fatalf("stopped after %d events, not after the plants before the stop (%d) and before the head (%d)", stop.Events, before, through.Events)
			}
			opts.Resume, opts.ExpectDigest = true, stop.Digest
			if corrupt { // stopped again while resumed: its stop point replaces the first, in the same sets
				again := stopAt(t, env, opts, 4)
				if again.ID == stop.ID || again.Events <= stop.Events || again.Events >= through.Events {
					t.Fatalf("stopped again at %+v, after %+v, before the head (%d)", again, stop, through.Events)
				}
				stop, opts.ExpectDigest = again, again.Digest
			}
			resumed := run(t, env, opts)
			if resumed.Resumed == nil || resumed.Resumed.ID != stop.ID {
				t.Fatalf("resumed from %+v, want stop point %d", resumed.Resumed, stop.ID)
			}
			if a, b := comparable(t, through), comparable(t, resumed); a != b {
				t.Fatalf("resumed:\n%s\nrun through:\n%s", b, a)
			}
			if corrupt {
				for _, w := range []struct {
					inv  int
					kind string
				}{{audit.InvChain, "chain_mismatch"}, {audit.InvReadModel, "read_model_mismatch"}, {audit.InvStreams, "duplicate_event_id"}, {audit.InvKeyOnce, "key_decided_twice"}} {
					if !resumed.Has(w.inv, w.kind) {
						t.Errorf("resumed: invariant %d %s not found: %v", w.inv, w.kind, resumed.Violations)
					}
				}
			} else {
				if !through.OK() || through.Checkpoint == nil || resumed.Checkpoint == nil {
					t.Fatalf("clean: checkpoints %+v and %+v, %v", through.Checkpoint, resumed.Checkpoint, resumed.Violations)
				}
				sameCheckpoints(t, env, through.Checkpoint.ID, resumed.Checkpoint.ID)
			}
			if _, err := projections.Checkpoints.LoadAuditStop(context.Background(), env.Pool); !errors.Is(err, projections.ErrNoAuditStop) {
				t.Fatalf("the stop point after the resume: %v", err)
			}
			if s := runSchemas(t, env.Pool); len(s) != 0 {
				t.Fatalf("run schemas after the resume: %v", s)
			}
		})
	}
}

// twoDeposits are the first two deposits of two streams.
func twoDeposits(t *testing.T, env *projtest.Env) (d1, d2 deposit) {
	t.Helper()
	err := env.Pool.QueryRow(context.Background(), `WITH d AS (SELECT event_id::text AS id, stream, revision, position FROM events
			WHERE type = 'Credited' AND convert_from(data, 'UTF8')::jsonb->>'reason' = 'deposit')
		SELECT a.id, a.stream, a.revision, b.id, b.stream, b.revision FROM d a JOIN d b ON b.stream <> a.stream AND b.position > a.position
		ORDER BY a.position, b.position LIMIT 1`).Scan(&d1.id, &d1.stream, &d1.rev, &d2.id, &d2.stream, &d2.rev)
	if err != nil {
		t.Fatal(err)
	}
	return d1, d2
}

// eventsUpTo counts the events of "all" up to and including id.
func eventsUpTo(t *testing.T, env *projtest.Env, id string) int64 {
	t.Helper()
	var n int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE position <= (SELECT position FROM events WHERE event_id = $1)`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// plantAcrossTheStop edits d2's event and d1's balance-history row (before
// the stop), then appends, after the stop, d1's event again (its ID twice)
// and a copy of it under an ID of its own at its stream's next revision (its
// key decided again).
func plantAcrossTheStop(t *testing.T, env *projtest.Env, d1, d2 deposit) {
	t.Helper()
	exec(t, env, `UPDATE events SET data = convert_to(replace(convert_from(data, 'UTF8'), '"amount":', '"amount":1'), 'UTF8') WHERE event_id = $1`, d2.id)
	exec(t, env, `UPDATE readmodel.balance_history SET balance = balance + 1 WHERE event_id = $1`, d1.id)
	exec(t, env, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
		SELECT stream, (SELECT max(revision) + 1 FROM events WHERE stream = $1), gen_random_uuid(), type, data, metadata
		FROM events WHERE event_id = $2`, d1.stream, d1.id)
	duplicateEvent(t, env, d1, d2)
}

// sameCheckpoints checks that two audit checkpoints carry the same state and
// account rows.
func sameCheckpoints(t *testing.T, env *projtest.Env, a, b int64) {
	t.Helper()
	var same bool
	err := env.Pool.QueryRow(context.Background(), `SELECT x.state = y.state AND x.accounts_sha256 = y.accounts_sha256 AND x.events = y.events
		FROM readmodel.audit_checkpoints x, readmodel.audit_checkpoints y WHERE x.id = $1 AND y.id = $2`, a, b).Scan(&same)
	if err != nil || !same {
		t.Fatalf("checkpoints %d (run through) and %d (resumed) differ (%v)", a, b, err)
	}
}

// snapshotEveryAccount writes a snapshot of each account: every other one
// at its first event (before the stop), the others at their last.
func snapshotEveryAccount(t *testing.T, env *projtest.Env) {
	t.Helper()
	rows, err := env.Pool.Query(context.Background(), `SELECT DISTINCT substr(stream, length($1) + 1) FROM events WHERE starts_with(stream, $1) ORDER BY 1`, domain.AccountStreamPrefix)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		a := accountAt(t, env, id, 0)
		if i%2 == 1 {
			a = accountAt(t, env, id, 1)
		}
		writeSnapshot(t, env, a, uint64(a.Revision), nil)
	}
}

// resumeErr runs a resume and returns its error, which it must have.
func resumeErr(t *testing.T, env *projtest.Env, digest string) error {
	t.Helper()
	rep, err := audit.Run(context.Background(), env.Store, audit.Options{BatchSize: 7, ReadModels: env.Pool, Resume: true, ExpectDigest: digest})
	if err == nil {
		t.Fatalf("resumed: %+v", rep)
	}
	return err
}

// TestResumeRefusesWhatItCannotFoldOn: without a stop point --resume says so;
// it refuses (start over) a stop point whose digest is not the one
// expected, one whose event at the stop position the store no longer holds,
// and one edited since; a live read model whose checkpoint is before the
// stop position refuses the resume until its projector has passed it.
func TestResumeRefusesWhatItCannotFoldOn(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 30, Seed: 3})
	if err := resumeErr(t, env, ""); !errors.Is(err, audit.ErrNoStopPoint) {
		t.Fatalf("without a stop point: %v", err)
	}
	projectedEvents := eventsUpTo(t, env, lastEventID(t, env))
	env.Run(t, projtest.Workload{Commands: 120, Seed: 4}) // not projected
	if all := eventsUpTo(t, env, lastEventID(t, env)); all < projectedEvents+30 {
		t.Fatalf("%d events, %d projected", all, projectedEvents)
	}
	stop := stopAt(t, env, audit.Options{BatchSize: 7}, int(projectedEvents/7)+2)
	if stop.Events <= projectedEvents {
		t.Fatalf("stopped at %d events, not after the read models' %d", stop.Events, projectedEvents)
	}
	if err := resumeErr(t, env, "0123"); !errors.Is(err, audit.ErrStartOver) || !strings.Contains(err.Error(), "not the 0123 expected") {
		t.Fatalf("another digest expected: %v", err)
	}
	if err := resumeErr(t, env, stop.Digest); !errors.Is(err, audit.ErrStartOver) || !strings.Contains(err.Error(), "before the stop point's position") {
		t.Fatalf("read models behind the stop: %v", err)
	}
	catchUp(t, env)
	if rep := run(t, env, audit.Options{BatchSize: 7, Resume: true, ExpectDigest: stop.Digest}); !rep.OK() || rep.Resumed == nil {
		t.Fatalf("resumed once the read models passed the stop: %+v, %v", rep.Resumed, rep.Violations)
	}
	stop = stopAt(t, env, audit.Options{BatchSize: 7}, 3)
	exec(t, env, `UPDATE events SET event_id = gen_random_uuid() WHERE position = (SELECT position FROM events ORDER BY position OFFSET $1 - 1 LIMIT 1)`, stop.Events)
	if err := resumeErr(t, env, ""); !errors.Is(err, audit.ErrStartOver) || !strings.Contains(err.Error(), "does not hold its event at the stop position") {
		t.Fatalf("another event at the stop position: %v", err)
	}
	exec(t, env, `UPDATE readmodel.audit_checkpoints SET events = events + 1 WHERE id = $1`, stop.ID)
	if err := resumeErr(t, env, ""); !errors.Is(err, audit.ErrStartOver) || !errors.Is(err, projections.ErrAuditStopEdited) && !strings.Contains(err.Error(), "its state is at") {
		t.Fatalf("an edited stop point: %v", err)
	}
}

func lastEventID(t *testing.T, env *projtest.Env) string {
	t.Helper()
	var id string
	if err := env.Pool.QueryRow(context.Background(), `SELECT event_id::text FROM events ORDER BY position DESC LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestStoppedAuditWithTempSetsStoresNoStopPoint: a role without CREATE
// keeps TEMP sets, which a stop loses: it stores no stop point.
func TestStoppedAuditWithTempSetsStoresNoStopPoint(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 30, Seed: 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := audit.Options{BatchSize: 7, ReadModels: env.Pool, Sets: poolAsRoleWithoutCreate(t, env), Progress: func(int64, int64) { cancel() }}
	rep, err := audit.Run(ctx, env.Store, opts)
	if !errors.Is(err, context.Canceled) || errors.Is(err, audit.ErrStopped) || rep != nil {
		t.Fatalf("stopped with TEMP sets: %v, %+v", err, rep)
	}
	if _, err := projections.Checkpoints.LoadAuditStop(context.Background(), env.Pool); !errors.Is(err, projections.ErrNoAuditStop) {
		t.Fatalf("a stop point stored: %v", err)
	}
}

// TestResumeRefusesAnotherBuild: a stop point whose state names another
// build, edited with its digests recomputed, is refused (start over); with
// the digest the stop printed, the edit itself is named.
func TestResumeRefusesAnotherBuild(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 30, Seed: 3})
	stop := stopAt(t, env, audit.Options{BatchSize: 7}, 3)
	editStopState(t, env, stop.ID, `"build":"`, `"build":"another `)
	if err := resumeErr(t, env, ""); !errors.Is(err, audit.ErrStartOver) || !strings.Contains(err.Error(), `stored by build "another `) {
		t.Fatalf("another build's stop point: %v", err)
	}
	if err := resumeErr(t, env, stop.Digest); !errors.Is(err, audit.ErrStartOver) || !strings.Contains(err.Error(), "not the "+stop.Digest+" expected") {
		t.Fatalf("the edited stop point, its digest expected: %v", err)
	}
}

// TestResumeRefusesSetsOfAnotherLayout: a stop point whose sets are of
// another layout than this build's (an earlier build's, which stored none:
// its groups held no home's hash), of the same build ID (builds with no
// VCS stamp are all "(devel)"), is refused (start over) before its sets are
// read or written. (Review r493: such a resume failed part-way, on a
// missing column, after copying into audit_ids.)
func TestResumeRefusesSetsOfAnotherLayout(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 30, Seed: 3})
	stop := stopAt(t, env, audit.Options{BatchSize: 7}, 3)
	editStopState(t, env, stop.ID, `"sets_layout":"`, `"earlier_layout":"`)
	if err := resumeErr(t, env, ""); !errors.Is(err, audit.ErrStartOver) || !strings.Contains(err.Error(), `its sets are of another layout ("", this build's "`) {
		t.Fatalf("a stop point of an earlier layout: %v", err)
	}
}

// editStopState replaces old (which it must hold) with new in the state of
// stop point id, its digest recomputed.
func editStopState(t *testing.T, env *projtest.Env, id int64, old, new string) {
	t.Helper()
	ctx := context.Background()
	var state []byte
	if err := env.Pool.QueryRow(ctx, `SELECT state FROM readmodel.audit_checkpoints WHERE id = $1`, id).Scan(&state); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(state))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil || !bytes.Contains(plain, []byte(old)) {
		t.Fatalf("the stop point's state holds no %s (%v): %.200s", old, err, plain)
	}
	plain = bytes.Replace(plain, []byte(old), []byte(new), 1)
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(plain); err != nil || zw.Close() != nil {
		t.Fatal(err)
	}
	exec(t, env, `UPDATE readmodel.audit_checkpoints SET state = $2::bytea, state_digest = md5($2::bytea) WHERE id = $1`, id, b.Bytes())
}
