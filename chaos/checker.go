package main

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/projections"
)

// Checks C1..C8 (issue 8) and C9 (events out, issue 14).
const nChecks = 9

var checkNames = [nChecks + 1]string{"", "C1 acked keys have one set of events", "C2 no duplicate key or event ID",
	"C3 no events for unsent or failed keys", "C4 money and balances", "C5 streams and replay",
	"C6 read models and checkpoints", "C7 request hashes", "C8 faults happened", "C9 every event published once, in order"}

// EventsOut is what the audit's events-out check found on LEDGER_EVENTS
// (internal/app/audit.EventsOut, the one home of C9's rule).
type EventsOut = audit.EventsOutResult

// checkPublished is C9 (PROTOCOL.md §4.1): the audit's events-out check finds
// every stored event up to the publisher's checkpoint on the stream once, in
// order, none unstored; and, the system being quiet, none stored after it.
func checkPublished(out *EventsOut, r *Report) {
	for _, v := range out.Violations {
		r.fail(9, "%s (%s: %s@%d %s)", v.Message, v.Kind, v.Stream, v.Revision, v.EventID)
	}
	if n := out.Report.Pending; n > 0 {
		r.fail(9, "%d stored events after the publisher's checkpoint %s are not on %s", n, out.Report.Checkpoint, out.Report.Stream)
	}
}

// Evidence of the faults a scenario injected (C8).
type Evidence struct {
	Required     bool // false for scenarios that inject nothing (0, 9)
	Redeliveries int
	Indefinite   int
	Reconnects   int
	Kills        int
	Restarts     int
	Other        int // e.g. held transactions, proxy faults, DLQ entries
}

func (e Evidence) any() bool {
	return e.Redeliveries+e.Indefinite+e.Reconnects+e.Kills+e.Restarts+e.Other > 0
}

// Report is the checker's verdict.
type Report struct {
	Failures [nChecks + 1][]string
	Events   int
	Keys     int
}

func (r *Report) fail(c int, format string, args ...any) {
	if len(r.Failures[c]) < 20 {
		r.Failures[c] = append(r.Failures[c], fmt.Sprintf(format, args...))
	} else if len(r.Failures[c]) == 20 {
		r.Failures[c] = append(r.Failures[c], "...")
	}
}

// Failed lists the checks that failed.
func (r *Report) Failed() []int {
	var out []int
	for c := 1; c <= nChecks; c++ {
		if len(r.Failures[c]) > 0 {
			out = append(out, c)
		}
	}
	return out
}

func (r *Report) OK() bool { return len(r.Failed()) == 0 }

func (r *Report) has(c int) bool { return len(r.Failures[c]) > 0 }

func (r *Report) String() string {
	var b strings.Builder
	for c := 1; c <= nChecks; c++ {
		for _, f := range r.Failures[c] {
			fmt.Fprintf(&b, "    C%d: %s\n", c, f)
		}
	}
	return b.String()
}

// stored is one row of the events table with its metadata.
type stored struct {
	eventstore.RecordedEvent
	meta  domain.Metadata
	mErr  error
	index int // in "all" order
}

// clientKey is the client key an event belongs to.
func (e *stored) clientKey() string {
	if k, ok := strings.CutPrefix(e.Stream, domain.KeyStreamPrefix); ok {
		return k
	}
	if e.meta.Origin != "" {
		return e.meta.Origin
	}
	return e.meta.Key
}

// ledgerStream reports whether the event is in an account, transfer, transaction or key stream.
func (e *stored) ledgerStream() bool {
	for _, p := range []string{domain.AccountStreamPrefix, domain.TransferStreamPrefix, domain.TransactionStreamPrefix, domain.KeyStreamPrefix} {
		if strings.HasPrefix(e.Stream, p) {
			return true
		}
	}
	return false
}

// own reports whether the event was written by a client's own command (not a step).
func (e *stored) own() bool {
	return e.meta.Origin == "" && domain.CommandType(e.meta.Command).IsClient() && !strings.HasPrefix(e.Stream, domain.KeyStreamPrefix)
}

// checkAtomicKey is C1 for an atomic batch's key (PROTOCOL.md v1.2 §2.2):
// its one event is the batch's decision (BatchDecided), and every definite
// reply is the reply that decision renders (reply.BatchDecided, the ledger's
// own renderer: sameBatchReply); refused (by a rejected or an invalid
// element), nothing else; applied, every element's key has its events (all
// of it; nothing of a refused one is C3's: its elements are never noted as
// sent).
func checkAtomicKey(r *Report, ks *keyState, byKey map[string][]*stored) {
	es := byKey[ks.key]
	if len(es) != 1 || es[0].Type != domain.EvBatchDecided {
		r.fail(1, "atomic batch %q: acknowledged, and its key has %d events, want its one decision", ks.key, len(es))
		return
	}
	var d domain.BatchDecided
	if err := json.Unmarshal(es[0].Data, &d); err != nil {
		r.fail(1, "atomic batch %q: undecodable decision: %v", ks.key, err)
		return
	}
	want, err := reply.BatchDecided(&d)
	if err != nil {
		r.fail(1, "atomic batch %q: its decision: %v", ks.key, err)
		return
	}
	for _, rep := range ks.acked {
		if diff := sameBatchReply(rep, &want); diff != "" {
			r.fail(1, "atomic batch %q: %s", ks.key, diff)
		}
	}
	if d.Status != domain.StatusApplied {
		return
	}
	for _, k := range d.Keys {
		if len(byKey[k]) == 0 {
			r.fail(1, "atomic batch %q applied, its element %q has no events", ks.key, k)
		}
	}
}

// sameBatchReply names how an atomic batch's reply (got) differs from the
// reply its decision renders (want: refused, in full; applied, one stub per
// element, its key): "" when it does not. Duplicate marks are a resend's.
func sameBatchReply(got, want *reply.Reply) string {
	if got.Status != want.Status || got.Code != want.Code || indexName(got.Index) != indexName(want.Index) || len(got.Replies) != len(want.Replies) {
		return fmt.Sprintf("answered %s %s by element %s with %d replies, decided %s %s by element %s with %d elements",
			got.Status, got.Code, indexName(got.Index), len(got.Replies), want.Status, want.Code, indexName(want.Index), len(want.Replies))
	}
	for i, w := range want.Replies {
		g := got.Replies[i]
		if g.IdempotencyKey != w.IdempotencyKey || (want.Status != domain.StatusApplied && (g.Status != w.Status || g.Code != w.Code)) {
			return fmt.Sprintf("element %d answered %s %s (key %q), decided %s %s (key %q)", i, g.Status, g.Code, g.IdempotencyKey, w.Status, w.Code, w.IdempotencyKey)
		}
	}
	return ""
}

// indexName is a refusing element's index as a report names it.
func indexName(i *int) string {
	if i == nil {
		return "none"
	}
	return strconv.Itoa(*i)
}

// Querier is what the checker reads through (a transaction in the self-test, so
// that corruptions can be rolled back).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readEvents(ctx context.Context, q Querier) ([]*stored, error) {
	rows, err := q.Query(ctx, `SELECT position, transaction_id::text AS xid, stream, revision, event_id, type, data, metadata, created
		FROM events ORDER BY transaction_id, position`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*stored
	for rows.Next() {
		var (
			e   stored
			pos int64
			xid string
			rev int64
		)
		if err := rows.Scan(&pos, &xid, &e.Stream, &rev, &e.ID, &e.Type, &e.Data, &e.Metadata, &e.Created); err != nil {
			return nil, err
		}
		c, err := strconv.ParseUint(xid, 10, 64)
		if err != nil {
			return nil, err
		}
		e.Position = eventstore.Position{Commit: c, Prepare: uint64(pos)}
		e.Revision = uint64(rev)
		e.meta, e.mErr = domain.DecodeMetadata(e.Metadata)
		e.index = len(out)
		out = append(out, &e)
	}
	return out, rows.Err()
}

type liveGen struct {
	name string
	pos  eventstore.Position
}

func readCheckpoints(ctx context.Context, q Querier) ([]liveGen, error) {
	live, err := projections.Checkpoints.Live(ctx, q)
	if err != nil {
		return nil, err
	}
	out := make([]liveGen, len(live))
	for i, l := range live {
		out[i] = liveGen{name: l.Name, pos: l.Position}
	}
	return out, nil
}

// Check runs C1..C9 over the history, the event store and the read models, all
// read through q (one snapshot when q is a repeatable-read transaction), and
// what the events-out check found on LEDGER_EVENTS (out; nil when no publisher
// ran: C9 is not checked).
func Check(ctx context.Context, q Querier, h *History, ev Evidence, out *EventsOut) (*Report, error) {
	r := &Report{}
	events, err := readEvents(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	if out != nil {
		checkPublished(out, r)
	}
	c := newChecked(r, events, h.Keys())
	c.checkDuplicates()
	c.checkRevisions()
	lives, err := readCheckpoints(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	f, expected, totals := c.fold(lives)
	c.checkAcked()
	c.checkStray()
	if err := c.checkMoney(ctx, q, f, totals); err != nil {
		return nil, err
	}
	// C5 (second half): a pure replay of the domain reproduces every decision.
	replay(events, c.keys, r)
	if err := c.checkReadModels(ctx, q, lives, expected, f); err != nil {
		return nil, err
	}
	c.checkRequestHashes()

	// C8: the faults really happened.
	if ev.Required && !ev.any() {
		r.fail(8, "vacuous: no redelivery, indefinite outcome, reconnect, kill or restart happened")
	}
	return r, nil
}

// checked is what Check reads once and its checks share: the events, the
// history's keys, and the events by ID and by client key.
type checked struct {
	r      *Report
	events []*stored
	keys   map[string]*keyState
	byID   map[uuid.UUID][]*stored
	// byKey holds the events of each client key, homes its own decisions:
	// key -> home stream -> index-0 events.
	byKey map[string][]*stored
	homes map[string]map[string]int
}

// newChecked indexes the events, and fails C5 for undecodable metadata.
func newChecked(r *Report, events []*stored, keys map[string]*keyState) *checked {
	c := &checked{r: r, events: events, keys: keys, byID: map[uuid.UUID][]*stored{}, byKey: map[string][]*stored{}, homes: map[string]map[string]int{}}
	r.Events = len(events)
	r.Keys = len(keys)
	for _, e := range events {
		c.byID[e.ID] = append(c.byID[e.ID], e)
		if e.mErr != nil {
			r.fail(5, "event %s in %s@%d: undecodable metadata: %v", e.ID, e.Stream, e.Revision, e.mErr)
		}
	}
	for _, e := range events {
		if !e.ledgerStream() {
			continue // the transfer process's own checkpoints: no client key (the fold checks them)
		}
		k := e.clientKey()
		c.byKey[k] = append(c.byKey[k], e)
		if e.own() && e.meta.Index == 0 {
			if c.homes[k] == nil {
				c.homes[k] = map[string]int{}
			}
			c.homes[k][e.Stream]++
		}
	}
	return c
}

// checkDuplicates is C2: duplicates, counted directly over the rows (never
// trusting constraints).
func (c *checked) checkDuplicates() {
	r := c.r
	groups := map[[3]string]int{} // (stream, key, index) -> rows
	for id, es := range c.byID {
		if len(es) > 1 {
			r.fail(2, "event ID %s stored %d times (%s@%d)", id, len(es), es[0].Stream, es[0].Revision)
		}
	}
	for _, e := range c.events {
		groups[[3]string{e.Stream, e.meta.Key, strconv.Itoa(e.meta.Index)}]++
	}
	for g, n := range groups {
		if n > 1 {
			r.fail(2, "key %q wrote event %s of %s %d times", g[1], g[2], g[0], n)
		}
	}
}

// checkRevisions is C5's first half: every stream's revisions run 0..n-1,
// each once.
func (c *checked) checkRevisions() {
	revs := map[string][]uint64{}
	for _, e := range c.events {
		revs[e.Stream] = append(revs[e.Stream], e.Revision)
	}
	for stream, rs := range revs {
		sort.Slice(rs, func(i, j int) bool { return rs[i] < rs[j] })
		for i, rv := range rs {
			if rv != uint64(i) {
				c.r.fail(5, "stream %s: revision %d where %d was due (revisions %v...)", stream, rv, i, head(rs, 8))
				break
			}
		}
	}
}

// fold runs the fold of the audit library over the events: its invariants
// (reported under their checks), the read models' expected rows as of each
// live checkpoint, and the totals.
func (c *checked) fold(lives []liveGen) (*audit.Fold, []map[string]map[string]string, []audit.Totals) {
	f := audit.NewFold()
	expected := make([]map[string]map[string]string, len(lives))
	snap := func(next *eventstore.Position) {
		for i, l := range lives {
			if expected[i] == nil && (next == nil || next.Compare(l.pos) > 0) {
				expected[i] = f.Expected(l.name, "")
			}
		}
	}
	for _, e := range c.events {
		snap(&e.Position)
		f.Apply(e.RecordedEvent)
	}
	snap(nil)
	totals := f.Finish()
	for _, v := range f.Violations {
		switch v.Invariant {
		case audit.InvKeyOnce:
			c.r.fail(1, "audit: %s", v)
		case audit.InvConservation, audit.InvBalance:
			c.r.fail(4, "audit: %s", v)
		case audit.InvStreams:
			if v.Kind == "duplicate_event_id" {
				c.r.fail(2, "audit: %s", v)
			} else {
				c.r.fail(5, "audit: %s", v)
			}
		default:
			c.r.fail(5, "audit: %s", v)
		}
	}
	return f, expected, totals
}

// checkAcked is C1: every acked key has exactly one set of events: every
// definite reply names the same events, each stored where the reply says, and
// an applied or recorded outcome has its events.
func (c *checked) checkAcked() {
	for _, ks := range c.keys {
		if len(ks.acked) == 0 {
			continue
		}
		if ks.typ == string(domain.CmdBatch) {
			checkAtomicKey(c.r, ks, c.byKey)
			continue
		}
		c.checkAckedKey(ks)
	}
}

// checkAckedKey is C1 for a key of one command.
func (c *checked) checkAckedKey(ks *keyState) {
	r := c.r
	var want string
	for i, rep := range ks.acked {
		ids := make([]string, 0, len(rep.Events))
		for _, ref := range rep.Events {
			ids = append(ids, ref.ID.String())
			es := c.byID[ref.ID]
			if len(es) == 0 {
				r.fail(1, "key %q: acknowledged event %s (%s@%d, %s) is not in the store", ks.key, ref.ID, ref.Stream, ref.Revision, ref.Type)
				continue
			}
			if es[0].Stream != ref.Stream || es[0].Revision != ref.Revision || es[0].Type != ref.Type {
				r.fail(1, "key %q: acknowledged event %s was %s@%d %s, the store holds %s@%d %s", ks.key, ref.ID, ref.Stream, ref.Revision, ref.Type, es[0].Stream, es[0].Revision, es[0].Type)
			}
			if es[0].clientKey() != ks.key {
				r.fail(1, "key %q: acknowledged event %s belongs to key %q in the store", ks.key, ref.ID, es[0].clientKey())
			}
		}
		sort.Strings(ids)
		set := strings.Join(ids, ",")
		if i == 0 {
			want = set
		} else if set != want {
			r.fail(1, "key %q: replies name different events: [%s] and [%s]", ks.key, want, set)
		}
		if rep.Status == domain.StatusApplied && len(rep.Events) == 0 {
			r.fail(1, "key %q: applied without events", ks.key)
		}
	}
	if ks.acked[0].Status == domain.StatusApplied && len(c.homes[ks.key]) != 1 {
		r.fail(1, "key %q: applied, decided in %d streams", ks.key, len(c.homes[ks.key]))
	}
}

// checkStray is C3: no events for keys never sent; none for failed keys;
// every key (the indefinite ones included) decided at most once.
func (c *checked) checkStray() {
	r := c.r
	for k, es := range c.byKey {
		ks := c.keys[k]
		if ks == nil {
			r.fail(3, "%d events (first %s@%d %s) for key %q, which no client sent", len(es), es[0].Stream, es[0].Revision, es[0].Type, k)
			continue
		}
		if ks.failed > 0 && len(ks.acked) == 0 && ks.indefinite == 0 {
			r.fail(3, "key %q failed (invalid) yet has %d events", k, len(es))
		}
		if n := len(c.homes[k]); n > 1 {
			r.fail(3, "key %q decided in %d streams", k, n)
		}
		for stream, n := range c.homes[k] {
			if n > 1 {
				r.fail(3, "key %q decided %d times in %s", k, n, stream)
			}
		}
	}
}

// checkMoney is C4: money conserved (the fold), every read-model balance
// equals its entries and the fold, none below its overdraft limit.
func (c *checked) checkMoney(ctx context.Context, q Querier, f *audit.Fold, totals []audit.Totals) error {
	for _, t := range totals {
		if t.PendingSaga > 0 {
			c.r.fail(4, "%s: %d transfer sagas still pending after the run settled (%d in flight)", t.Currency, t.PendingSaga, t.InFlight)
		}
	}
	if err := checkBalances(ctx, q, f, c.r); err != nil {
		return err
	}
	checkMoved(c.keys, c.byKey, c.r)
	return nil
}

// checkReadModels is C6: each read model equals a rebuild (the fold as of its
// checkpoint), and every checkpoint reached the head.
func (c *checked) checkReadModels(ctx context.Context, q Querier, lives []liveGen, expected []map[string]map[string]string, f *audit.Fold) error {
	r := c.r
	if len(lives) != len(projections.Names) {
		r.fail(6, "%d live projections, want %d", len(lives), len(projections.Names))
	}
	for i, l := range lives {
		if l.pos.Compare(f.Last) != 0 {
			r.fail(6, "projection %s checkpoint %s is not the head %s", l.name, l.pos, f.Last)
		}
		for _, table := range audit.ProjectionTables[l.name] {
			actual, err := audit.ReadTable(ctx, q, table, 0, "")
			if err != nil {
				return err
			}
			if d := audit.CompareTable(table, expected[i][table], actual); !d.OK() {
				r.fail(6, "read model %s (checkpoint %s) differs from a rebuild: %s", table, l.pos, d.Describe(3))
			}
		}
	}
	return nil
}

// checkRequestHashes is C7: every stored request hash is the hash of the
// key's first request.
func (c *checked) checkRequestHashes() {
	r := c.r
	for _, e := range c.events {
		ks := c.keys[e.clientKey()]
		if ks == nil || ks.firstHash == "" {
			continue
		}
		if strings.HasPrefix(e.Stream, domain.KeyStreamPrefix) {
			var kc domain.KeyClaimed
			if json.Unmarshal(e.Data, &kc) == nil && kc.RequestHash != ks.firstHash {
				r.fail(7, "key %q claimed for request hash %.12s, its first request has %.12s", ks.key, kc.RequestHash, ks.firstHash)
			}
			continue
		}
		if e.own() && e.meta.RequestHash != ks.firstHash {
			r.fail(7, "key %q: event %s@%d carries request hash %.12s, the first request has %.12s", ks.key, e.Stream, e.Revision, e.meta.RequestHash, ks.firstHash)
		}
	}
}

func head(rs []uint64, n int) []uint64 {
	if len(rs) > n {
		return rs[:n]
	}
	return rs
}

// checkBalances compares the accounts read model with its entries and with the fold.
func checkBalances(ctx context.Context, q Querier, f *audit.Fold, r *Report) error {
	rows, err := q.Query(ctx, `SELECT a.account_id, a.balance, a.held, a.available,
		coalesce((SELECT sum(e.amount) FROM readmodel.entries e WHERE e.account_id = a.account_id), 0)::bigint,
		coalesce((SELECT e.balance_after FROM readmodel.entries e WHERE e.account_id = a.account_id ORDER BY e.revision DESC LIMIT 1), 0)::bigint
		FROM readmodel.accounts a`)
	if err != nil {
		return fmt.Errorf("read balances: %w", err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	for rows.Next() {
		var id string
		var bal, held, avail, sum, last int64
		if err := rows.Scan(&id, &bal, &held, &avail, &sum, &last); err != nil {
			return err
		}
		seen[id] = true
		if bal != sum {
			r.fail(4, "account %s: balance %d, its entries sum to %d", id, bal, sum)
		}
		if bal != last {
			r.fail(4, "account %s: balance %d, its last entry says %d", id, bal, last)
		}
		if avail != bal-held {
			r.fail(4, "account %s: available %d != balance %d - held %d", id, avail, bal, held)
		}
		if a := f.Accounts[id]; a == nil {
			r.fail(4, "account %s is in the read model, not in the event store", id)
		} else {
			if a.Balance != bal {
				r.fail(4, "account %s: read model balance %d, the events fold to %d", id, bal, a.Balance)
			}
			if a.Balance < -a.OverdraftLimit {
				r.fail(4, "account %s: balance %d below its overdraft limit %d", id, a.Balance, a.OverdraftLimit)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for id, a := range f.Accounts {
		if a.Opened && !seen[id] {
			r.fail(4, "account %s is in the event store, not in the read model", id)
		}
	}
	return checkEffectiveBalances(ctx, q, f, r)
}

// checkEffectiveBalances (C4, v1.2 §2.3): every account's balance by effective
// time at the end of time, as query.balance with effective_at reads it,
// equals its balance and held amount by record time (the fold).
func checkEffectiveBalances(ctx context.Context, q Querier, f *audit.Fold, r *Report) error {
	n := 0
	err := projections.EffectiveBalances(ctx, q, "", projections.EndOfTime, func(b projections.EffectiveBalance) error {
		n++
		switch a := f.Accounts[b.AccountID]; {
		case a == nil:
			r.fail(4, "account %s: by effective time, not in the event store", b.AccountID)
		case a.Balance != b.Balance || a.Held != b.Held:
			r.fail(4, "account %s: by effective time at the end of time balance %d held %d, the events fold to balance %d held %d", b.AccountID, b.Balance, b.Held, a.Balance, a.Held)
		}
		return nil
	})
	if opened := countOpened(f); err == nil && n != opened {
		r.fail(4, "%d accounts by effective time, %d opened in the event store", n, opened)
	}
	return err
}

// countOpened counts the opened accounts of the fold.
func countOpened(f *audit.Fold) int {
	n := 0
	for _, a := range f.Accounts {
		if a.Opened {
			n++
		}
	}
	return n
}

// replay re-decides every client command of every account stream with the
// domain's pure DecideAccount on the state folded so far and compares the events
// it yields with the stored ones, and its outcome with the history's replies.
func replay(events []*stored, keys map[string]*keyState, r *Report) {
	streams := map[string][]*stored{}
	var order []string
	for _, e := range events {
		if !strings.HasPrefix(e.Stream, domain.AccountStreamPrefix) || e.mErr != nil {
			continue
		}
		if streams[e.Stream] == nil {
			order = append(order, e.Stream)
		}
		streams[e.Stream] = append(streams[e.Stream], e)
	}
	for _, stream := range order {
		es := streams[stream]
		sort.SliceStable(es, func(i, j int) bool { return es[i].Revision < es[j].Revision })
		a := domain.NewAccount(strings.TrimPrefix(stream, domain.AccountStreamPrefix))
		for i := 0; i < len(es); {
			e := es[i]
			n := e.meta.Count
			if n < 1 || i+n > len(es) {
				n = 1
			}
			group := es[i : i+n]
			if e.own() && e.meta.Index == 0 && len(e.meta.Request) > 0 {
				replayGroup(a, group, keys, r)
			}
			broken := false
			for _, g := range group {
				if err := domain.EvolveAccount(a, domain.StoredEvent{ID: g.ID, Stream: g.Stream, Revision: g.Revision, Position: g.Position.String(), Type: g.Type, Data: g.Data, Metadata: g.meta}); err != nil {
					r.fail(5, "replay of %s@%d: %v", g.Stream, g.Revision, err)
					broken = true
					break
				}
			}
			if broken {
				break
			}
			i += n
		}
	}
}

func replayGroup(a *domain.Account, group []*stored, keys map[string]*keyState, r *Report) {
	e := group[0]
	req, err := domain.ParseRequest(e.meta.Request)
	if err != nil {
		r.fail(5, "%s@%d: stored request: %v", e.Stream, e.Revision, err)
		return
	}
	fields := map[string]any{}
	for k, v := range req {
		if k != "type" {
			fields[k] = v
		}
	}
	fields["idempotency_key"] = e.meta.Key
	b, _ := json.Marshal(fields)
	cmd, inv := domain.DecodeCommand(domain.CommandType(e.meta.Command), b)
	if inv != nil {
		r.fail(5, "%s@%d: stored request of %q does not decode: %v", e.Stream, e.Revision, e.meta.Key, inv)
		return
	}
	cmd.At = e.meta.At
	d := domain.DecideAccount(a, cmd)
	if len(d.Events) != len(group) {
		r.fail(5, "%s@%d: replaying %s %q yields %d events, the store has %d", e.Stream, e.Revision, cmd.Type, cmd.IdempotencyKey, len(d.Events), len(group))
		return
	}
	for i, ne := range d.Events {
		g := group[i]
		want, _ := json.Marshal(ne.Data)
		var x, y any
		json.Unmarshal(want, &x)
		json.Unmarshal(g.Data, &y)
		if ne.Type != g.Type || !reflect.DeepEqual(x, y) {
			r.fail(5, "%s@%d: replaying %s %q yields %s %s, the store has %s %s", g.Stream, g.Revision, cmd.Type, cmd.IdempotencyKey, ne.Type, want, g.Type, g.Data)
		}
	}
	// The history's definite replies agree with the replayed decision.
	ks := keys[e.meta.Key]
	if ks == nil || len(ks.acked) == 0 {
		return
	}
	rep := ks.acked[0]
	wantStatus, wantCode := domain.StatusApplied, domain.CodeOK
	if d.Rejection != nil {
		wantStatus, wantCode = domain.StatusRejected, d.Rejection.Code
	}
	if rep.Status != wantStatus || rep.Code != wantCode {
		r.fail(5, "key %q: the client was told %s/%s, a replay decides %s/%s", ks.key, rep.Status, rep.Code, wantStatus, wantCode)
	}
}
