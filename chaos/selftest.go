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
// the checker read through it. says, when set, is what the check's report must
// name (so that the check made for it, not another, caught it).
type corruption struct {
	name  string
	check int // the check that must catch it
	says  string
	apply func(ctx context.Context, tx pgx.Tx) error
}

// checkFunc runs the checker (with ev) on the store as corrupt leaves it, and
// on out.
type checkFunc func(ev Evidence, corrupt func(context.Context, pgx.Tx) error, out *EventsOut) (*Report, error)

// txCheck is the self-test's checkFunc: it corrupts inside a transaction of
// sys's store, checks h through it, and rolls it back.
func txCheck(ctx context.Context, sys *system, h *History) checkFunc {
	return func(ev Evidence, corrupt func(context.Context, pgx.Tx) error, out *EventsOut) (*Report, error) {
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
func exec1(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	ct, err := tx.Exec(ctx, sql, args...)
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
	if err := sendAtomics(ctx, c, w.accounts[0]); err != nil {
		return err
	}
	if err := sys.quiesce(ctx, 60*time.Second); err != nil {
		return err
	}
	res.stats = h.Stats()
	out, err := sys.eventsOut(ctx)
	if err != nil {
		return err
	}
	check := txCheck(ctx, sys, h)
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
	d1, d2, err := pickDeposits(h)
	if err != nil {
		return err
	}
	res.notes = append(res.notes, "the duplicated, deleted and phantom events are beside a deposit sent as a batch element")
	caught, planted := 0, 0 // planted: the corruptions judged so far
	for _, cr := range slices.Concat(eventCorruptions(d1, d2), modelCorruptions(d1), atomicCorruptions(), hashCorruptions(d1)) {
		rep, err := check(Evidence{}, cr.apply, out)
		if err != nil {
			return fmt.Errorf("%s: %w", cr.name, err)
		}
		caught, planted = caught+selfVerdict(res, cr, rep), planted+1
	}
	// A vacuous run: the clean history, but faults were required.
	rep, err := check(Evidence{Required: true}, nil, out)
	if err != nil {
		return err
	}
	caught, planted = caught+selfVerdict(res, corruption{name: "a vacuous run (no fault happened)", check: 8}, rep), planted+1
	rep, err = checkpointPast(ctx, sys, c, d1, check)
	if err != nil {
		return err
	}
	caught, planted = caught+selfVerdict(res, corruption{name: "a checkpoint past an unapplied event", check: 6}, rep), planted+1
	n, err := eventsOutPlants(ctx, sys, check, res)
	if err != nil {
		return err
	}
	res.notes = append(res.notes, fmt.Sprintf("%d of %d corruptions caught by the right check", caught+n, planted+2))
	res.stats = h.Stats()
	return nil
}

// pickDeposits picks two acknowledged deposits of different accounts and
// amounts, the first sent as a batch element.
func pickDeposits(h *History) (d1, d2 depositRef, err error) {
	deps := ackedDeposits(h)
	if len(deps) < 2 {
		return d1, d2, errors.New("self-test: too few acknowledged deposits")
	}
	d1, d2 = deps[0], deps[1]
	if !d1.batch {
		return d1, d2, errors.New("self-test: no acknowledged deposit sent in a batch")
	}
	for _, d := range deps[1:] {
		if d.stream != d1.stream && d.amount != d1.amount {
			d2 = d
			break
		}
	}
	return d1, d2, nil
}

// The atomic batches of the self-test's corruptions (C1's checkAtomicKey):
// one applied (two deposits), one refused by its second element (a
// withdrawal of more than the account holds), one refused by its second
// element invalid (a deposit of nothing), recorded as the rejected one is.
const (
	atomicApplied = "s0-atomic-applied"
	atomicRefused = "s0-atomic-refused"
	atomicInvalid = "s0-atomic-invalid"
)

// sendAtomics sends the self-test's atomic batches on account a.
func sendAtomics(ctx context.Context, c *client, a account) error {
	el := func(key, typ string, amount int64) element {
		return element{key, typ, body(key, map[string]any{"account_id": a.id, "amount": amount, "currency": a.currency})}
	}
	c.atomicBatch(ctx, atomicApplied, []element{el(atomicApplied+"-0", "deposit", 7), el(atomicApplied+"-1", "deposit", 8)}, 10*c.timeout)
	c.atomicBatch(ctx, atomicRefused, []element{el(atomicRefused+"-0", "deposit", 9), el(atomicRefused+"-1", "withdraw", 1<<40)}, 10*c.timeout)
	c.atomicBatch(ctx, atomicInvalid, []element{el(atomicInvalid+"-0", "deposit", 9), el(atomicInvalid+"-1", "deposit", 0)}, 10*c.timeout)
	keys := c.h.Keys()
	for key, want := range map[string]domain.Status{atomicApplied: domain.StatusApplied, atomicRefused: domain.StatusRejected, atomicInvalid: domain.StatusInvalid} {
		if ks := keys[key]; ks == nil || len(ks.acked) == 0 || ks.acked[0].Status != want {
			return fmt.Errorf("self-test: atomic batch %s was not answered %s", key, want)
		}
	}
	return nil
}

// atomicCorruptions are faults of the self-test's atomic batches that only
// checkAtomicKey sees: an applied batch missing an element's events, a
// refused batch's decision naming another element or another code than its
// refusing element's reply or another key for an element before it, and the
// invalid one's decision forged whole into a rejection (consistent in itself,
// not what its elements decided).
func atomicCorruptions() []corruption {
	decisionOf := func(batch string, sets ...[]string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			for _, set := range sets { // a path, then its value
				if err := exec1(ctx, tx, `UPDATE events SET data = convert_to(jsonb_set(convert_from(data, 'UTF8')::jsonb, $2::text[], $3::jsonb)::text, 'UTF8')
				WHERE stream = $1`, domain.KeyStream(batch), set[:len(set)-1], set[len(set)-1]); err != nil {
					return err
				}
			}
			return nil
		}
	}
	decision := func(path, value string) func(ctx context.Context, tx pgx.Tx) error {
		return decisionOf(atomicRefused, []string{path, value})
	}
	return []corruption{
		{"an atomic batch applied in part", 1, "its element \"" + atomicApplied + "-1\" has no events", func(ctx context.Context, tx pgx.Tx) error {
			k := atomicApplied + "-1"
			ct, err := tx.Exec(ctx, `DELETE FROM events WHERE stream = $1 OR convert_from(metadata, 'UTF8')::jsonb->>'key' = $2`, domain.KeyStream(k), k)
			if err == nil && ct.RowsAffected() == 0 {
				err = fmt.Errorf("element %s has no events", k)
			}
			return err
		}},
		{"a refused atomic batch decided at another element", 1, "its element 0 has key \"" + atomicRefused + "-0\"", decision("index", "0")},
		{"a refused atomic batch decided with another code", 1, "decided rejected account_not_found, its element 1 answered rejected insufficient_funds", decision("code", `"account_not_found"`)},
		{"an invalid element's refusal forged into a rejection", 1, "decided rejected invalid_request by element 1",
			decisionOf(atomicInvalid, []string{"status", `"rejected"`}, []string{"reply", "status", `"rejected"`})},
		// Only sameBatchReply's comparison of each element's key sees it: the
		// refusing element (1) keeps its key, so refusedBy passes, and no other
		// record holds a refused batch's element keys (the batch's canonical
		// request carries no element's key).
		{"a refused atomic batch's element key forged", 1, `(key "forged")`, decisionOf(atomicRefused, []string{"keys", "0", `"forged"`})},
	}
}

// eventCorruptions are faults of the event store beside deposits d1 and d2.
func eventCorruptions(d1, d2 depositRef) []corruption {
	return []corruption{
		{"a duplicated event", 2, " stored 2 times (", func(ctx context.Context, tx pgx.Tx) error {
			// The constraints would refuse it: drop them (rolled back), so that the
			// check has to count.
			if _, err := tx.Exec(ctx, `ALTER TABLE events DROP CONSTRAINT events_event_id_key, DROP CONSTRAINT events_stream_revision_key`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
				SELECT stream, revision, event_id, type, data, metadata FROM events WHERE event_id = $1`, d1.id)
			return err
		}},
		{"a deleted acknowledged event", 1, "", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM events WHERE event_id = $1`, d1.id)
			return err
		}},
		{"a phantom event", 3, "", func(ctx context.Context, tx pgx.Tx) error {
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
		{"a revision skipped", 5, " was due (revisions ", func(ctx context.Context, tx pgx.Tx) error {
			return exec1(ctx, tx, `UPDATE events SET revision = revision + 1
				WHERE stream = $1 AND revision = (SELECT max(revision) FROM events WHERE stream = $1)`, d2.stream)
		}},
		{"a swapped payload", 5, "", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE events e SET data = o.data FROM events o
				WHERE (e.event_id, o.event_id) IN (($1::uuid, $2::uuid), ($2::uuid, $1::uuid))`, d1.id, d2.id)
			return err
		}},
	}
}

// hashCorruptions are faults of the request hashes (C7): d1's key claimed,
// and decided, for another request than the client's first. The claim and the
// decision's metadata agree with each other (the audit's claim check holds), so
// that only C7, which compares them with the history, can catch it.
func hashCorruptions(d1 depositRef) []corruption {
	const setHash = `convert_to(jsonb_set(convert_from(%[1]s, 'UTF8')::jsonb, '{request_hash}', to_jsonb($2::text))::text, 'UTF8')`
	return []corruption{
		{"a key claimed for another request", 7, "claimed for request hash", func(ctx context.Context, tx pgx.Tx) error {
			var key string
			if err := tx.QueryRow(ctx, `SELECT convert_from(metadata, 'UTF8')::jsonb->>'key' FROM events WHERE event_id = $1`, d1.id).Scan(&key); err != nil {
				return err
			}
			other := domain.Request{"type": "deposit", "account_id": strings.TrimPrefix(d1.stream, domain.AccountStreamPrefix), "amount": d1.amount + 1, "currency": d1.currency}.Hash()
			if err := exec1(ctx, tx, `UPDATE events SET data = `+fmt.Sprintf(setHash, "data")+` WHERE stream = $1 AND type = $3`,
				domain.KeyStream(key), other, domain.EvKeyClaimed); err != nil {
				return fmt.Errorf("the claim of %q: %w", key, err)
			}
			_, err := tx.Exec(ctx, `UPDATE events SET metadata = `+fmt.Sprintf(setHash, "metadata")+`
				WHERE convert_from(metadata, 'UTF8')::jsonb->>'key' = $1`, key, other)
			return err
		}},
	}
}

// modelCorruptions are faults of a balance (d1's account's read models:
// C4, and the commands read model's own fold of it: C6) and of the sweeps'
// events (C4).
func modelCorruptions(d1 depositRef) []corruption {
	return []corruption{
		{"a balance off by one", 4, "", func(ctx context.Context, tx pgx.Tx) error {
			t, err := liveTable(ctx, tx, projections.Accounts, "accounts")
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE `+t+` SET balance = balance + 1 WHERE account_id = $1`,
				strings.TrimPrefix(d1.stream, domain.AccountStreamPrefix))
			return err
		}},
		// The commands read model's own fold of the account, from which its
		// later replies are built (issue 23: compared since cmdacct).
		{"a reply's account balance off by one", 6, "command_accounts", func(ctx context.Context, tx pgx.Tx) error {
			t, err := liveTable(ctx, tx, projections.Commands, "command_accounts")
			if err != nil {
				return err
			}
			return exec1(ctx, tx, `UPDATE `+t+` SET balance = balance + 1 WHERE account_id = $1`,
				strings.TrimPrefix(d1.stream, domain.AccountStreamPrefix))
		}},
		{"a balance by effective time off by one", 4, "by effective time at the end of time", func(ctx context.Context, tx pgx.Tx) error {
			t, err := liveTable(ctx, tx, projections.Balances, "balance_history")
			if err != nil {
				return err
			}
			return exec1(ctx, tx, `UPDATE `+t+` SET balance = balance + 1
				WHERE account_id = $1 AND revision = (SELECT max(revision) FROM `+t+` WHERE account_id = $1)`, strings.TrimPrefix(d1.stream, domain.AccountStreamPrefix))
		}},
		// v1.2 §2.3: a withdrawal with up_to whose event says it asked less than
		// it moved, and a transfer with up_to whose completion records another
		// amount than its reply's moved.
		{"a sweep that moved more than it asked", 4, "", func(ctx context.Context, tx pgx.Tx) error {
			return exec1(ctx, tx, `UPDATE events SET data = convert_to(jsonb_set(convert_from(data, 'UTF8')::jsonb, '{requested}',
				to_jsonb((convert_from(data, 'UTF8')::jsonb->>'amount')::bigint - 1))::text, 'UTF8')
				WHERE position = (SELECT min(position) FROM events WHERE type = 'Debited' AND convert_from(data, 'UTF8')::jsonb ? 'requested')`)
		}},
		{"a sweep's completion of another amount than its reply", 4, "", func(ctx context.Context, tx pgx.Tx) error {
			return exec1(ctx, tx, `UPDATE events c SET data = convert_to(jsonb_set(convert_from(c.data, 'UTF8')::jsonb, '{amount}',
				to_jsonb((convert_from(c.data, 'UTF8')::jsonb->>'amount')::bigint - 1))::text, 'UTF8')
				WHERE c.position = (SELECT min(d.position) FROM events d JOIN events r ON r.stream = d.stream AND r.type = 'TransferRequested'
					WHERE d.type = 'TransferCompleted' AND convert_from(r.data, 'UTF8')::jsonb ? 'up_to'
					AND (convert_from(d.data, 'UTF8')::jsonb->>'amount')::bigint > 1)`)
		}},
	}
}

// liveTable names the table base of projection name's live generation.
func liveTable(ctx context.Context, tx pgx.Tx, name, base string) (string, error) {
	var g int
	err := tx.QueryRow(ctx, `SELECT generation FROM readmodel.checkpoints WHERE name = $1 AND state = 'live'`, name).Scan(&g)
	return projections.Table(base, g), err
}

// checkpointPast checks a checkpoint past an unapplied event: it stops the
// projector, lets the ledger write once more (a deposit on d1's account), then
// moves the checkpoints to the head.
func checkpointPast(ctx context.Context, sys *system, c *client, d1 depositRef, check checkFunc) (*Report, error) {
	sys.projectors[0].stop(10 * time.Second)
	key := "s0-after-projector"
	if a := c.settle(ctx, key, "deposit", body(key, map[string]any{"account_id": strings.TrimPrefix(d1.stream, domain.AccountStreamPrefix), "amount": 5, "currency": d1.currency}), 10); a.Outcome != OK {
		return nil, fmt.Errorf("deposit with the projector stopped: %s %s", a.Outcome, a.Err)
	}
	return check(Evidence{}, func(ctx context.Context, tx pgx.Tx) error {
		var xid string
		var pos int64
		if err := tx.QueryRow(ctx, `SELECT transaction_id::text AS xid, position FROM events ORDER BY transaction_id DESC, position DESC LIMIT 1`).Scan(&xid, &pos); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE readmodel.checkpoints SET commit_position = $1::text::bigint, prepare_position = $2 WHERE state = 'live'`, xid, pos)
		return err
	}, nil)
}

// eventsOutPlants plants, in LEDGER_EVENTS, a message deleted, then also a
// message of an event the store does not hold (the stream changed for good:
// the last checks), and returns how many of the two C9 caught, naming each by
// its kind.
func eventsOutPlants(ctx context.Context, sys *system, check checkFunc, res *result) (int, error) {
	js, err := jetstream.New(sys.nc)
	if err != nil {
		return 0, err
	}
	caught := 0
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
			return caught, fmt.Errorf("self-test: %s: %w", bad.name, err)
		}
		bout, err := sys.eventsOut(ctx)
		if err != nil {
			return caught, err
		}
		rep, err := check(Evidence{}, nil, bout)
		if err != nil {
			return caught, err
		}
		caught += selfVerdict(res, corruption{name: bad.name, check: 9, says: "(" + bad.kind + ":"}, rep)
	}
	return caught, nil
}

// selfVerdict records whether rep caught corruption cr with the check made
// for it (and, when cr says what, naming it so).
func selfVerdict(res *result, cr corruption, rep *Report) int {
	failed := rep.Failed()
	var names []string
	for _, c := range failed {
		names = append(names, fmt.Sprintf("C%d", c))
	}
	i := slices.IndexFunc(rep.Failures[cr.check], func(f string) bool { return strings.Contains(f, cr.says) })
	if i >= 0 {
		first := rep.Failures[cr.check][i]
		if len(first) > 140 {
			first = first[:140] + "..."
		}
		res.notes = append(res.notes, fmt.Sprintf("%-38s caught by C%d (fired: %s): %s", cr.name+":", cr.check, strings.Join(names, " "), first))
		return 1
	}
	if cr.says != "" && rep.has(cr.check) {
		res.report.fail(8, "self-test: %s was caught by C%d without naming it %q (fired: %v)\n%s", cr.name, cr.check, cr.says, names, rep)
		return 0
	}
	res.report.fail(8, "self-test: %s was not caught by C%d (fired: %v)\n%s", cr.name, cr.check, names, rep)
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
