package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// corruption is one injected fault of the checker self-test: it alters the
// event store or the read models inside a transaction that is rolled back after
// the checker read through it.
type corruption struct {
	name  string
	check int // the check that must catch it
	apply func(ctx context.Context, tx pgx.Tx) error
}

// upOne starts a system of one ledger and one projector named by prefix, and a
// client recording into a fresh history. The caller stops the system.
func upOne(ctx context.Context, s *suite, prefix string) (*system, *client, error) {
	sys, err := newSystem(ctx, s, prefix)
	if err != nil {
		return nil, nil, err
	}
	if err := sys.up(ctx, 1, 1); err != nil {
		sys.down()
		return nil, nil, err
	}
	return sys, newClient(sys.nc, newHistory(), 5*time.Second), nil
}

// exec1 runs a corruption that must change exactly one row.
func exec1(ctx context.Context, tx pgx.Tx, sql string) error {
	ct, err := tx.Exec(ctx, sql)
	if err == nil && ct.RowsAffected() != 1 {
		err = fmt.Errorf("changed %d rows, want 1 (is there no such event in the workload?)", ct.RowsAffected())
	}
	return err
}

// scenarioSelfTest shows that the checker fails: a clean history passes, and each
// corruption is caught by the check made for it.
func scenarioSelfTest(ctx context.Context, s *suite, res *result) error {
	sys, c, err := upOne(ctx, s, "s0")
	if err != nil {
		return err
	}
	defer sys.down()
	h := c.h
	w := &workload{prefix: "s0", accounts: hotAccounts("s0", 6), producers: 4, commands: s.size(400, 200), resend: 0.1, reuse: 0.02, batch: 0.15, retries: 8, seed: s.seed}
	if err := w.open(ctx, c); err != nil {
		return err
	}
	w.run(ctx, c)
	if err := sys.quiesce(ctx, 60*time.Second); err != nil {
		return err
	}
	res.stats = h.Stats()
	out, err := sys.eventsOut(ctx)
	if err != nil {
		return err
	}

	check := func(ev Evidence, corrupt func(context.Context, pgx.Tx) error, out *EventsOut) (*Report, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		tx, err := sys.pool.BeginTx(cctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(context.Background())
		if corrupt != nil {
			if err := corrupt(cctx, tx); err != nil {
				return nil, fmt.Errorf("corrupt: %w", err)
			}
		}
		return Check(cctx, tx, h, ev, out)
	}

	clean, err := check(Evidence{}, nil, out)
	if err != nil {
		return err
	}
	res.report = &Report{Events: clean.Events, Keys: clean.Keys}
	if !clean.OK() {
		res.report.fail(8, "the clean history fails the checker:\n%s", clean)
		return nil
	}
	res.notes = append(res.notes, fmt.Sprintf("clean history (%d keys, %d events): passes", clean.Keys, clean.Events))

	// Two acknowledged deposits of different accounts and amounts.
	deps := ackedDeposits(h)
	if len(deps) < 2 {
		return errors.New("self-test: too few acknowledged deposits")
	}
	d1, d2 := deps[0], deps[1]
	if !d1.batch {
		return errors.New("self-test: no acknowledged deposit sent in a batch")
	}
	res.notes = append(res.notes, "the duplicated, deleted and phantom events are beside a deposit sent as a batch element")
	for _, d := range deps[1:] {
		if d.stream != d1.stream && d.amount != d1.amount {
			d2 = d
			break
		}
	}
	gen := func(ctx context.Context, tx pgx.Tx, name string) (int, error) {
		var g int
		err := tx.QueryRow(ctx, `SELECT generation FROM readmodel.checkpoints WHERE name = $1 AND state = 'live'`, name).Scan(&g)
		return g, err
	}
	cs := []corruption{
		{"a duplicated event", 2, func(ctx context.Context, tx pgx.Tx) error {
			// The constraints would refuse it: drop them (rolled back), so that the
			// check has to count.
			if _, err := tx.Exec(ctx, `ALTER TABLE events DROP CONSTRAINT events_event_id_key, DROP CONSTRAINT events_stream_revision_key`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
				SELECT stream, revision, event_id, type, data, metadata FROM events WHERE event_id = $1`, d1.id)
			return err
		}},
		{"a deleted acknowledged event", 1, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM events WHERE event_id = $1`, d1.id)
			return err
		}},
		{"a phantom event", 3, func(ctx context.Context, tx pgx.Tx) error {
			var rev int64
			if err := tx.QueryRow(ctx, `SELECT max(revision) FROM events WHERE stream = $1`, d1.stream).Scan(&rev); err != nil {
				return err
			}
			key := "phantom-key"
			req := domain.Request{"type": "deposit", "account_id": strings.TrimPrefix(d1.stream, domain.AccountStreamPrefix), "amount": int64(777), "currency": d1.currency}
			m := domain.Metadata{Key: key, Command: "deposit", RequestHash: req.Hash(), Index: 0, Count: 1, At: time.Now().UTC(), Request: req.CanonicalJSON(), Schema: 1}
			mb, _ := json.Marshal(m)
			db, _ := json.Marshal(domain.Credited{Amount: 777, Currency: d1.currency, Reason: domain.ReasonDeposit, BalanceAfter: 0})
			_, err := tx.Exec(ctx, `INSERT INTO events (stream, revision, event_id, type, data, metadata) VALUES ($1, $2, $3, $4, $5, $6)`,
				d1.stream, rev+1, domain.EventID(key, d1.stream, 0), domain.EvCredited, db, mb)
			return err
		}},
		{"a balance off by one", 4, func(ctx context.Context, tx pgx.Tx) error {
			g, err := gen(ctx, tx, projections.Accounts)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE `+projections.Table("accounts", g)+` SET balance = balance + 1 WHERE account_id = $1`,
				strings.TrimPrefix(d1.stream, domain.AccountStreamPrefix))
			return err
		}},
		{"a swapped payload", 5, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE events e SET data = o.data FROM events o
				WHERE (e.event_id, o.event_id) IN (($1::uuid, $2::uuid), ($2::uuid, $1::uuid))`, d1.id, d2.id)
			return err
		}},
		// v1.2 §2.3: a withdrawal with up_to whose event says it asked less than
		// it moved, and a transfer with up_to whose completion records another
		// amount than its reply's moved.
		{"a sweep that moved more than it asked", 4, func(ctx context.Context, tx pgx.Tx) error {
			return exec1(ctx, tx, `UPDATE events SET data = convert_to(jsonb_set(convert_from(data, 'UTF8')::jsonb, '{requested}',
				to_jsonb((convert_from(data, 'UTF8')::jsonb->>'amount')::bigint - 1))::text, 'UTF8')
				WHERE position = (SELECT min(position) FROM events WHERE type = 'Debited' AND convert_from(data, 'UTF8')::jsonb ? 'requested')`)
		}},
		{"a sweep's completion of another amount than its reply", 4, func(ctx context.Context, tx pgx.Tx) error {
			return exec1(ctx, tx, `UPDATE events c SET data = convert_to(jsonb_set(convert_from(c.data, 'UTF8')::jsonb, '{amount}',
				to_jsonb((convert_from(c.data, 'UTF8')::jsonb->>'amount')::bigint - 1))::text, 'UTF8')
				WHERE c.position = (SELECT min(d.position) FROM events d JOIN events r ON r.stream = d.stream AND r.type = 'TransferRequested'
					WHERE d.type = 'TransferCompleted' AND convert_from(r.data, 'UTF8')::jsonb ? 'up_to'
					AND (convert_from(d.data, 'UTF8')::jsonb->>'amount')::bigint > 1)`)
		}},
	}
	caught, planted := 0, 0 // planted: the corruptions judged so far
	for _, cr := range cs {
		rep, err := check(Evidence{}, cr.apply, out)
		if err != nil {
			return fmt.Errorf("%s: %w", cr.name, err)
		}
		caught, planted = caught+selfVerdict(res, cr.name, cr.check, rep), planted+1
	}
	// A vacuous run: the clean history, but faults were required.
	rep, err := check(Evidence{Required: true}, nil, out)
	if err != nil {
		return err
	}
	caught, planted = caught+selfVerdict(res, "a vacuous run (no fault happened)", 8, rep), planted+1

	// A checkpoint past an unapplied event: stop the projector, let the ledger
	// write once more, then move the checkpoints to the head.
	sys.projectors[0].stop(10 * time.Second)
	key := "s0-after-projector"
	if a := c.settle(ctx, key, "deposit", body(key, map[string]any{"account_id": strings.TrimPrefix(d1.stream, domain.AccountStreamPrefix), "amount": 5, "currency": d1.currency}), 10); a.Outcome != OK {
		return fmt.Errorf("deposit with the projector stopped: %s %s", a.Outcome, a.Err)
	}
	rep, err = check(Evidence{}, func(ctx context.Context, tx pgx.Tx) error {
		var xid string
		var pos int64
		if err := tx.QueryRow(ctx, `SELECT transaction_id::text AS xid, position FROM events ORDER BY transaction_id DESC, position DESC LIMIT 1`).Scan(&xid, &pos); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE readmodel.checkpoints SET commit_position = $1::text::bigint, prepare_position = $2 WHERE state = 'live'`, xid, pos)
		return err
	}, nil)
	if err != nil {
		return err
	}
	caught, planted = caught+selfVerdict(res, "a checkpoint past an unapplied event", 6, rep), planted+1

	// LEDGER_EVENTS with a message deleted, then also with a message of an
	// event the store does not hold (the stream changed for good: the last
	// checks). The audit names each by its kind.
	js, err := jetstream.New(sys.nc)
	if err != nil {
		return err
	}
	for _, bad := range []struct {
		name, kind string
		plant      func(context.Context, jetstream.Stream, jetstream.StreamInfo) error
	}{
		{"a gap in LEDGER_EVENTS", "missing", func(ctx context.Context, st jetstream.Stream, info jetstream.StreamInfo) error {
			return st.DeleteMsg(ctx, info.State.FirstSeq+info.State.Msgs/2)
		}},
		{"an unstored event in LEDGER_EVENTS", "unstored", func(ctx context.Context, _ jetstream.Stream, _ jetstream.StreamInfo) error {
			phantom := eventstore.RecordedEvent{ID: uuid.New(), Stream: "account-s0-phantom", Type: "Credited", Data: []byte(`{}`), Metadata: []byte(`{}`),
				Position: eventstore.Position{Commit: 1 << 40}}
			msg, err := projections.EventMsg(phantom)
			if err != nil {
				return err
			}
			_, err = js.PublishMsg(ctx, msg, jetstream.WithMsgID(phantom.ID.String()))
			return err
		}},
	} {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := js.Stream(pctx, projections.EventsStream)
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = st.Info(pctx); err == nil && info.State.Msgs < 4 {
				err = errors.New("too few published events")
			} else if err == nil {
				err = bad.plant(pctx, st, *info)
			}
		}
		cancel()
		if err != nil {
			return fmt.Errorf("self-test: %s: %w", bad.name, err)
		}
		bout, err := sys.eventsOut(ctx)
		if err != nil {
			return err
		}
		rep, err := check(Evidence{}, nil, bout)
		if err != nil {
			return err
		}
		if !strings.Contains(strings.Join(rep.Failures[9], "\n"), "("+bad.kind+":") {
			res.report.fail(8, "self-test: %s was not named %s by C9:\n%s", bad.name, bad.kind, rep)
			continue
		}
		caught, planted = caught+selfVerdict(res, bad.name, 9, rep), planted+1
	}
	res.notes = append(res.notes, fmt.Sprintf("%d of %d corruptions caught by the right check", caught, planted))
	res.stats = h.Stats()
	return nil
}

// selfVerdict records whether rep caught a corruption with the expected check.
func selfVerdict(res *result, name string, want int, rep *Report) int {
	failed := rep.Failed()
	var names []string
	for _, c := range failed {
		names = append(names, fmt.Sprintf("C%d", c))
	}
	if rep.has(want) {
		first := rep.Failures[want][0]
		if len(first) > 140 {
			first = first[:140] + "..."
		}
		res.notes = append(res.notes, fmt.Sprintf("%-38s caught by C%d (fired: %s): %s", name+":", want, strings.Join(names, " "), first))
		return 1
	}
	res.report.fail(8, "self-test: %s was not caught by C%d (fired: %v)\n%s", name, want, names, rep)
	return 0
}

type depositRef struct {
	id       uuid.UUID
	stream   string
	currency string
	amount   int64
	batch    bool // sent as an element of a batch
}

// ackedDeposits lists the Credited events of acknowledged applied deposits.
func ackedDeposits(h *History) []depositRef {
	var out []depositRef
	keys := h.Keys()
	// The elements of batches first: the corruptions of the first deposit (a
	// double apply, a deletion, a phantom beside it) are then a batch element's.
	attempts := h.Attempts()
	slices.SortStableFunc(attempts, func(a, b Attempt) int { return cmp.Compare(btoi(a.Via != "batch"), btoi(b.Via != "batch")) })
	for _, a := range attempts {
		if a.Type != "deposit" || a.Outcome != OK || a.Reply.Status != domain.StatusApplied || a.Reply.Duplicate || a.Reply.Account == nil {
			continue
		}
		if ks := keys[a.Key]; ks == nil || string(ks.firstBody) != string(a.Body) {
			continue
		}
		var f struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		json.Unmarshal(a.Body, &f)
		for _, e := range a.Reply.Events {
			if e.Type == domain.EvCredited {
				out = append(out, depositRef{id: e.ID, stream: e.Stream, currency: f.Currency, amount: f.Amount, batch: a.Via == "batch"})
			}
		}
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
