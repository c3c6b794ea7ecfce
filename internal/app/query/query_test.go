package query_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/adapters/httpapi"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type fixture struct {
	env    *projtest.Env
	runner *projections.Runner
	nc     *nats.Conn
	http   *httptest.Server
	// maxWait is the service's bound on waiting for min_position: a request
	// waits that long and a margin more before it gives up.
	maxWait time.Duration
}

func setup(t *testing.T, maxWait time.Duration) *fixture {
	t.Helper()
	env := projtest.New(t)
	ns := devtest.NATSWith(t, &natsserver.Options{})
	nc := devtest.Connect(t, ns)
	svc := query.New(env.Pool, query.Options{MaxWait: maxWait})
	resp, err := natsapi.ServeReadQueries(nc, svc, natsapi.ReadQueryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(resp.Stop)
	mux := http.NewServeMux()
	httpapi.QueryRoutes(mux, svc)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	r, err := projections.NewRunner(env.Pool, env.Store, projections.Options{PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{env: env, runner: r, nc: nc, http: hs, maxWait: maxWait}
}

// start runs the projector until the test ends.
func (f *fixture) start(t *testing.T) { devtest.Go(t, f.runner.Run) }

func (f *fixture) ask(t *testing.T, q string, body any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	msg, err := f.nc.Request(natsapi.QuerySubjectPrefix+q, b, f.maxWait+20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(msg.Data, &out); err != nil {
		t.Fatalf("%s: %s: %v", q, msg.Data, err)
	}
	return out
}

func (f *fixture) get(t *testing.T, path string) (int, map[string]any, []byte) {
	t.Helper()
	res, err := http.Get(f.http.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("GET %s: %s: %v", path, b, err)
	}
	return res.StatusCode, out, b
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestQueriesOverNATSAndHTTP(t *testing.T) {
	f := setup(t, 5*time.Second)
	f.start(t)
	env := f.env
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o1", "account_id": "alice", "currency": "EUR"})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o2", "account_id": "bob", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d1", "account_id": "alice", "amount": 1000, "currency": "EUR"})
	env.MustApply(t, "place_hold", map[string]any{"idempotency_key": "h1", "account_id": "alice", "hold_id": "h1", "amount": 100, "currency": "EUR"})
	tr := env.MustApply(t, "transfer", map[string]any{"idempotency_key": "t1", "transfer_id": "t1", "from": "alice", "to": "bob", "amount": 300, "currency": "EUR"})
	if tr.Transfer == nil || tr.Transfer.Status != "completed" {
		t.Fatalf("transfer: %+v", tr)
	}
	min := tr.Position

	// account
	acc := f.ask(t, "account", map[string]any{"account_id": "alice", "min_position": min})
	want := []string{"account_id", "available", "balance", "currency", "held", "projected_position", "revision", "status"}
	if !reflect.DeepEqual(keys(acc), want) || acc["balance"] != 700.0 || acc["held"] != 100.0 || acc["available"] != 600.0 || acc["status"] != "open" {
		t.Fatalf("account: %v", acc)
	}
	code, hacc, _ := f.get(t, "/v1/accounts/alice?min_position="+url.QueryEscape(min))
	if code != 200 || !reflect.DeepEqual(hacc, acc) {
		t.Fatalf("GET account: %d %v, NATS %v", code, hacc, acc)
	}

	f.checkEntries(t, min)

	// transfer
	tq := f.ask(t, "transfer", map[string]any{"transfer_id": "t1", "min_position": min})
	if !reflect.DeepEqual(keys(tq), []string{"amount", "currency", "from", "projected_position", "status", "to", "transfer_id"}) ||
		tq["status"] != "completed" || tq["from"] != "alice" || tq["to"] != "bob" || tq["amount"] != 300.0 {
		t.Fatalf("transfer: %v", tq)
	}
	if code, ht, _ := f.get(t, "/v1/transfers/t1"); code != 200 || !reflect.DeepEqual(ht, tq) {
		t.Fatalf("GET transfer: %d %v", code, ht)
	}

	f.checkCommandReplies(t, min)
	f.checkQueryRefusals(t)
}

// checkEntries checks the entries query over NATS, a page after a revision,
// and over HTTP, on alice's deposit and transfer debit.
func (f *fixture) checkEntries(t *testing.T, min string) {
	t.Helper()
	ent := f.ask(t, "entries", map[string]any{"account_id": "alice", "min_position": min})
	list := ent["entries"].([]any)
	if len(list) != 2 {
		t.Fatalf("entries: %v", ent)
	}
	e0, e1 := list[0].(map[string]any), list[1].(map[string]any)
	if !reflect.DeepEqual(keys(e0), []string{"amount", "at", "balance_after", "effective_at", "event_id", "idempotency_key", "metadata", "revision", "type"}) ||
		e0["amount"] != 1000.0 || e1["amount"] != -300.0 || e1["balance_after"] != 700.0 || e1["idempotency_key"] != "t1:debit" ||
		e0["effective_at"] != e0["at"] {
		t.Fatalf("entries: %v", list)
	}
	// by effective time over HTTP: the entries effective from the second one's
	// effective time; the balance with everything effective by the first's.
	code, eff, _ := f.get(t, "/v1/accounts/alice/entries?by=effective&from="+url.QueryEscape(e1["effective_at"].(string)))
	if l, _ := eff["entries"].([]any); code != 200 || len(l) != 1 || l[0].(map[string]any)["event_id"] != e1["event_id"] {
		t.Fatalf("GET entries by effective time: %d %v", code, eff)
	}
	// The balance is read from the balances projection, which follows the
	// store on its own: it waits for the same position as the entries.
	code, bal, _ := f.get(t, "/v1/accounts/alice/balance?min_position="+url.QueryEscape(min)+"&effective_at="+url.QueryEscape(e0["effective_at"].(string)))
	if code != 200 || bal["balance"] != 1000.0 || bal["as_of_effective"] != e0["effective_at"] || bal["as_of_revision"] != nil {
		t.Fatalf("GET balance by effective time: %d %v", code, bal)
	}
	page := f.ask(t, "entries", map[string]any{"account_id": "alice", "after_revision": e0["revision"], "limit": 1})
	if l := page["entries"].([]any); len(l) != 1 || l[0].(map[string]any)["event_id"] != e1["event_id"] {
		t.Fatalf("entries after %v: %v", e0["revision"], page)
	}
	code, hent, _ := f.get(t, "/v1/accounts/alice/entries?limit=1&after_revision=0")
	if code != 200 || len(hent["entries"].([]any)) != 1 {
		t.Fatalf("GET entries: %d %v", code, hent)
	}
}

// checkCommandReplies checks that the command query answers the ledger's
// original reply, byte for byte, over NATS and HTTP.
func (f *fixture) checkCommandReplies(t *testing.T, min string) {
	t.Helper()
	for _, k := range []string{"o1", "d1", "h1", "t1"} {
		orig, err := f.env.Ledger.Lookup(context.Background(), k)
		if err != nil || orig == nil {
			t.Fatal(k, orig, err)
		}
		wantJSON, _ := json.Marshal(orig)
		b, _ := json.Marshal(map[string]any{"idempotency_key": k, "min_position": min})
		msg, err := f.nc.Request(natsapi.QuerySubjectPrefix+"command", b, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if string(msg.Data) != string(wantJSON) {
			t.Fatalf("command %s:\n got  %s\n want %s", k, msg.Data, wantJSON)
		}
		code, _, raw := f.get(t, "/v1/commands/"+k)
		if code != 200 || string(raw) != string(wantJSON)+"\n" {
			t.Fatalf("GET command %s: %d %s", k, code, raw)
		}
	}
}

// checkQueryRefusals checks not_found and invalid_request answers over NATS
// and HTTP.
func (f *fixture) checkQueryRefusals(t *testing.T) {
	t.Helper()
	for _, c := range []struct {
		q    string
		body any
		code string
	}{
		{"account", map[string]any{"account_id": "nobody"}, "not_found"},
		{"transfer", map[string]any{"transfer_id": "none"}, "not_found"},
		{"command", map[string]any{"idempotency_key": "never"}, "not_found"},
		{"entries", map[string]any{"account_id": "nobody"}, "not_found"},
		{"account", map[string]any{"account_id": "alice", "extra": 1}, "invalid_request"},
		{"account", map[string]any{"account_id": "no spaces"}, "invalid_request"},
		{"entries", map[string]any{"account_id": "alice", "limit": 1001}, "invalid_request"},
		{"entries", map[string]any{"account_id": "alice", "limit": 0}, "invalid_request"},
		{"account", map[string]any{"account_id": "alice", "min_position": "12"}, "invalid_request"},
		{"entries", map[string]any{"account_id": "alice", "by": "settlement"}, "invalid_request"},
		{"balance", map[string]any{"account_id": "alice", "at": "2026-11-22T10:00:00Z", "effective_at": "2026-11-22T10:00:00Z"}, "invalid_request"},
		{"balance", map[string]any{"account_id": "alice", "revision": 1, "effective_at": "2026-11-22T10:00:00Z"}, "invalid_request"},
		{"balance", map[string]any{"account_id": "alice", "effective_at": "yesterday"}, "invalid_request"},
	} {
		if got := f.ask(t, c.q, c.body); got["code"] != c.code {
			t.Errorf("%s %v: %v, want %s", c.q, c.body, got, c.code)
		}
	}
	if code, body, _ := f.get(t, "/v1/accounts/nobody"); code != 404 || body["code"] != "not_found" {
		t.Fatalf("GET unknown account: %d %v", code, body)
	}
	if code, body, _ := f.get(t, "/v1/accounts/alice/entries?limit=5000"); code != 400 || body["code"] != "invalid_request" {
		t.Fatalf("GET entries limit 5000: %d %v", code, body)
	}
}

func TestMinPositionWaitsForTheProjector(t *testing.T) {
	f := setup(t, 10*time.Second)
	env := f.env
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o1", "account_id": "alice", "currency": "EUR"})
	r := env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d1", "account_id": "alice", "amount": 5, "currency": "EUR"})

	// No projector: the wait is bounded and says so.
	short := query.New(env.Pool, query.Options{MaxWait: 300 * time.Millisecond})
	start := time.Now()
	_, qerr := short.Account(context.Background(), query.AccountRequest{AccountID: "alice", MinPosition: r.Position})
	if qerr == nil || qerr.Code != query.CodeProjectionBehind || qerr.ProjectedPosition != "0/0" || time.Since(start) < 300*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Fatalf("behind: %v after %s", qerr, time.Since(start))
	}
	mux := http.NewServeMux()
	httpapi.QueryRoutes(mux, short)
	hs := httptest.NewServer(mux)
	defer hs.Close()
	res, err := http.Get(hs.URL + "/v1/accounts/alice?min_position=" + url.QueryEscape(r.Position))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("GET behind: %d", res.StatusCode)
	}
	// Without min_position the (empty) read model answers at once.
	if got := f.ask(t, "account", map[string]any{"account_id": "alice"}); got["code"] != "not_found" || got["projected_position"] != "0/0" {
		t.Fatalf("no min_position: %v", got)
	}

	// The projector starts while a query waits: the query sees its write.
	done := make(chan map[string]any, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"account_id": "alice", "min_position": r.Position})
		msg, err := f.nc.Request(natsapi.QuerySubjectPrefix+"account", b, 20*time.Second)
		if err != nil {
			done <- map[string]any{"err": err.Error()}
			return
		}
		var out map[string]any
		json.Unmarshal(msg.Data, &out)
		done <- out
	}()
	time.Sleep(100 * time.Millisecond)
	f.start(t)
	got := <-done
	if got["balance"] != 5.0 || got["projected_position"] == "0/0" {
		t.Fatalf("after waiting: %v", got)
	}
}

// TestStatementPagesAndTimeFilters: 10,000 entries of one account, paged by
// next_after_revision, with and without from/to: no gap, no repeat, exactly the
// entries with from <= at < to, transfer steps naming their transfer; bad bounds
// are invalid_request naming the field.
func TestStatementPagesAndTimeFilters(t *testing.T) {
	f := setup(t, time.Minute) // the first page waits for 10,000 entries to be projected
	const n = 10_000
	tr := writeStatement(t, f, n)
	f.start(t)

	// Everything in pages of 1,000, once the projector reached the transaction.
	full := f.pageEntries(t, map[string]any{"account_id": "st", "limit": 1000, "min_position": tr.Position})
	wantRevisions(t, "all", full, func(map[string]any) bool { return true }, full)
	checkStatementOrderAndRefs(t, full, n)
	// Commands decided concurrently reach the stream in another order than
	// their times: a period is not a range of revisions.
	from, to := full[2500]["at"].(string), full[7500]["at"].(string)
	tFrom, tTo := entryAt(t, full[2500]), entryAt(t, full[7500])
	inPeriod := func(e map[string]any) bool { return !entryAt(t, e).Before(tFrom) && entryAt(t, e).Before(tTo) }
	got := f.pageEntries(t, map[string]any{"account_id": "st", "limit": 700, "from": from, "to": to})
	wantRevisions(t, "from/to", got, inPeriod, full)
	wantRevisions(t, "from only", f.pageEntries(t, map[string]any{"account_id": "st", "limit": 1000, "from": to}), func(e map[string]any) bool { return !entryAt(t, e).Before(tTo) }, full)
	code, h, _ := f.get(t, "/v1/accounts/st/entries?limit=5&from="+url.QueryEscape(from)+"&to="+url.QueryEscape(to))
	if l, _ := h["entries"].([]any); code != 200 || len(l) != 5 || l[0].(map[string]any)["revision"] != got[0]["revision"] || h["next_after_revision"] == nil {
		t.Fatalf("GET entries with from/to: %d %v", code, h)
	}
	for _, bad := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"account_id": "st", "from": "yesterday"}, "from"},
		{map[string]any{"account_id": "st", "to": "2026-13-01T00:00:00Z"}, "to"},
		{map[string]any{"account_id": "st", "from": to, "to": from}, "to"},
	} {
		r := f.ask(t, "entries", bad.body)
		if r["code"] != "invalid_request" || !strings.Contains(fmt.Sprint(r["fields"], r["message"]), bad.field) {
			t.Fatalf("%v: %v, want invalid_request naming %s", bad.body, r, bad.field)
		}
	}
}

// writeStatement opens accounts st and peer and writes n entries on st: n-1
// deposits by 16 concurrent writers, then a transfer's debit and a
// transaction's leg. It returns the transaction's reply.
func writeStatement(t *testing.T, f *fixture, n int) reply.Reply {
	t.Helper()
	ctx := context.Background()
	f.env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-st", "account_id": "st", "currency": "EUR"})
	f.env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-peer", "account_id": "peer", "currency": "EUR"})
	const workers = 16
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n-1; i += workers {
				r := f.env.Post(ctx, "deposit", map[string]any{"idempotency_key": fmt.Sprintf("d-%d", i), "account_id": "st", "amount": i + 1, "currency": "EUR"})
				if r.Status != "applied" {
					t.Errorf("deposit %d: %+v", i, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	f.env.MustApply(t, "transfer", map[string]any{"idempotency_key": "t-1", "transfer_id": "t-1", "from": "st", "to": "peer", "amount": 5, "currency": "EUR"})
	return f.env.MustApply(t, "post_transaction", map[string]any{"idempotency_key": "x-1", "transaction_id": "x-1",
		"postings": []any{map[string]any{"from": "st", "to": "peer", "amount": 7, "currency": "EUR"}}})
}

// pageEntries asks for entries page by page, following next_after_revision
// (body is updated as it goes), and returns them all; a page with a next one
// must be full.
func (f *fixture) pageEntries(t *testing.T, body map[string]any) []map[string]any {
	t.Helper()
	var all []map[string]any
	for {
		r := f.ask(t, "entries", body)
		list, ok := r["entries"].([]any)
		if !ok {
			t.Fatalf("entries %v: %v", body, r)
		}
		for _, e := range list {
			all = append(all, e.(map[string]any))
		}
		next, more := r["next_after_revision"]
		if !more {
			return all
		}
		if len(list) != body["limit"] {
			t.Fatalf("a page of %d cut short with next_after_revision %v", len(list), next)
		}
		body["after_revision"] = next
	}
}

// wantRevisions checks that got holds exactly the entries of full that keep
// keeps, in order: no gap, no repeat.
func wantRevisions(t *testing.T, what string, got []map[string]any, keep func(map[string]any) bool, full []map[string]any) {
	t.Helper()
	var want []float64
	for _, e := range full {
		if keep(e) {
			want = append(want, e["revision"].(float64))
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d", what, len(got), len(want))
	}
	for i, e := range got {
		if e["revision"].(float64) != want[i] {
			t.Fatalf("%s: entry %d at revision %v, want %v (a gap or a repeat)", what, i, e["revision"], want[i])
		}
	}
}

// checkStatementOrderAndRefs checks the statement writeStatement wrote: in
// increasing revisions, the transfer's debit naming its transfer and the
// transaction's leg its transaction, a deposit neither.
func checkStatementOrderAndRefs(t *testing.T, full []map[string]any, n int) {
	t.Helper()
	for i, e := range full {
		if i > 0 && e["revision"].(float64) <= full[i-1]["revision"].(float64) {
			t.Fatalf("entry %d at revision %v after %v", i, e["revision"], full[i-1]["revision"])
		}
	}
	if e := full[n-1]; e["transfer_id"] != "t-1" || e["amount"].(float64) != -5 || e["transaction_id"] != nil {
		t.Fatalf("the transfer's debit: %v", e)
	}
	if e := full[n]; e["transaction_id"] != "x-1" || e["amount"].(float64) != -7 || e["transfer_id"] != nil {
		t.Fatalf("the transaction's leg: %v", e)
	}
	if full[0]["transfer_id"] != nil {
		t.Fatalf("a deposit names a transfer: %v", full[0])
	}
}

// entryAt is an entry's time.
func entryAt(t *testing.T, e map[string]any) time.Time {
	ts, err := time.Parse(time.RFC3339Nano, e["at"].(string))
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// TestBalanceAsOfMatchesAFold: ledger.v1.query.balance at every revision, and at
// times on, just before and just after every event, equals a fold of the
// account's stream up to there, over a random history; before the account
// opened it is account_not_found, beyond its last revision invalid_request.
func TestBalanceAsOfMatchesAFold(t *testing.T) {
	f := setup(t, 10*time.Second)
	last := writeRandomHistory(t, f)
	f.start(t)

	states := foldAccountStates(t, f, "account-b")
	first := map[string]any{"account_id": "b", "revision": 0, "min_position": last.Position}
	f.checkBalance(t, "revision 0", first, states[0])
	for _, s := range states {
		f.checkBalance(t, fmt.Sprint("revision ", s.rev), map[string]any{"account_id": "b", "revision": s.rev}, s)
	}
	checkBalanceAtTimes(t, f, states)
	f.checkBalance(t, "now", map[string]any{"account_id": "b"}, states[len(states)-1])
	code, h, _ := f.get(t, fmt.Sprintf("/v1/accounts/b/balance?revision=%d", states[3].rev))
	if code != 200 || h["balance"] != float64(states[3].balance) {
		t.Fatalf("GET balance: %d %v", code, h)
	}
	for _, bad := range []struct {
		body  map[string]any
		code  string
		field string
	}{
		{map[string]any{"account_id": "b", "revision": len(states)}, "invalid_request", "revision"},
		{map[string]any{"account_id": "b", "revision": -1}, "invalid_request", "revision"},
		{map[string]any{"account_id": "b", "at": "noon"}, "invalid_request", "at"},
		{map[string]any{"account_id": "b", "at": states[0].at.Format(time.RFC3339Nano), "revision": 0}, "invalid_request", "revision"},
		{map[string]any{"account_id": "nobody"}, "not_found", ""},
	} {
		r := f.ask(t, "balance", bad.body)
		if r["code"] != bad.code || !strings.Contains(fmt.Sprint(r["fields"]), bad.field) {
			t.Fatalf("%v: %v, want %s naming %q", bad.body, r, bad.code, bad.field)
		}
	}
}

// writeRandomHistory opens account b (overdraft 500) and posts 300 random
// deposits, withdrawals, holds placed and released or captured, then a last
// deposit, whose reply it returns.
func writeRandomHistory(t *testing.T, f *fixture) reply.Reply {
	t.Helper()
	ctx := context.Background()
	f.env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-b", "account_id": "b", "currency": "EUR", "overdraft_limit": 500})
	rng := rand.New(rand.NewPCG(20261124, 7))
	var holds []string
	for i := range 300 {
		key := fmt.Sprintf("k-%d", i)
		amount := 1 + rng.IntN(400)
		switch k := rng.IntN(10); {
		case k < 4:
			f.env.Post(ctx, "deposit", map[string]any{"idempotency_key": key, "account_id": "b", "amount": amount, "currency": "EUR"})
		case k < 7:
			f.env.Post(ctx, "withdraw", map[string]any{"idempotency_key": key, "account_id": "b", "amount": amount, "currency": "EUR"})
		case k < 8:
			id := "h-" + key
			if r := f.env.Post(ctx, "place_hold", map[string]any{"idempotency_key": key, "account_id": "b", "hold_id": id, "amount": amount, "currency": "EUR"}); r.Status == "applied" {
				holds = append(holds, id)
			}
		case len(holds) > 0:
			id := holds[0]
			holds = holds[1:]
			typ := "release_hold"
			if k == 9 {
				typ = "capture_hold"
			}
			f.env.Post(ctx, typ, map[string]any{"idempotency_key": key, "account_id": "b", "hold_id": id})
		}
	}
	return f.env.MustApply(t, "deposit", map[string]any{"idempotency_key": "last", "account_id": "b", "amount": 1, "currency": "EUR"})
}

// balanceState is an account as the domain's fold leaves it after one event.
type balanceState struct {
	at                 time.Time
	balance, held, rev int64
}

// foldAccountStates folds an account's stream with the domain's Evolve and
// returns the state after each event.
func foldAccountStates(t *testing.T, f *fixture, stream string) []balanceState {
	t.Helper()
	recs, err := f.env.Store.ReadStream(context.Background(), stream, 0, eventstore.Forwards, 0)
	if err != nil {
		t.Fatal(err)
	}
	var states []balanceState
	acc := domain.NewAccount(strings.TrimPrefix(stream, domain.AccountStreamPrefix))
	for _, re := range recs {
		m := devtest.EvolveRecorded(t, acc, re)
		states = append(states, balanceState{at: m.At, balance: acc.Balance, held: acc.Held, rev: acc.Revision})
	}
	return states
}

// checkBalance asks the balance query and checks its answer is account b in
// state want.
func (f *fixture) checkBalance(t *testing.T, what string, body map[string]any, want balanceState) {
	t.Helper()
	r := f.ask(t, "balance", body)
	if r["as_of_revision"] != float64(want.rev) || r["revision"] != float64(want.rev) || r["balance"] != float64(want.balance) ||
		r["held"] != float64(want.held) || r["available"] != float64(want.balance-want.held) || r["account_id"] != "b" {
		t.Fatalf("%s: %v, want %+v", what, r, want)
	}
}

// checkBalanceAtTimes asks the balance at, just before and just after every
// event's time: the state after the last event at or before it, and
// account_not_found before the first.
func checkBalanceAtTimes(t *testing.T, f *fixture, states []balanceState) {
	t.Helper()
	asOf := func(ts time.Time) (balanceState, bool) {
		var got balanceState
		ok := false
		for _, s := range states {
			if !s.at.After(ts) {
				got, ok = s, true
			}
		}
		return got, ok
	}
	for i, s := range states {
		for _, ts := range []time.Time{s.at, s.at.Add(-time.Microsecond), s.at.Add(time.Microsecond)} {
			want, ok := asOf(ts)
			body := map[string]any{"account_id": "b", "at": ts.Format(time.RFC3339Nano)}
			if !ok {
				if r := f.ask(t, "balance", body); r["code"] != string(domain.CodeAccountNotFound) {
					t.Fatalf("before the account opened (event %d): %v", i, r)
				}
				continue
			}
			f.checkBalance(t, fmt.Sprint("at ", ts.Format(time.RFC3339Nano)), body, want)
		}
	}
}

// TestStatementShowsMetadata (PROTOCOL.md v1.1 §2): the metadata of a money
// command is stored with its events and shown on its statement entries, on both
// accounts of a transfer; the same key with other metadata is a conflict naming
// it, and writes nothing.
func TestStatementShowsMetadata(t *testing.T) {
	f := setup(t, 10*time.Second)
	ctx := context.Background()
	for _, a := range []string{"m1", "m2"} {
		f.env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-" + a, "account_id": a, "currency": "EUR"})
	}
	md := map[string]any{"order": "o-77", "channel": "web"}
	f.env.MustApply(t, "deposit", map[string]any{"idempotency_key": "md-1", "account_id": "m1", "amount": 500, "currency": "EUR", "metadata": md})
	tr := f.env.MustApply(t, "transfer", map[string]any{"idempotency_key": "mt-1", "transfer_id": "mt-1", "from": "m1", "to": "m2", "amount": 200, "currency": "EUR", "metadata": map[string]any{"invoice": "inv-9"}})
	r := f.env.Post(ctx, "deposit", map[string]any{"idempotency_key": "md-1", "account_id": "m1", "amount": 500, "currency": "EUR", "metadata": map[string]any{"order": "o-78"}})
	if r.Code != "idempotency_key_conflict" || !reflect.DeepEqual(r.Fields, []string{"metadata"}) {
		t.Fatalf("other metadata under the key: %+v", r)
	}
	f.start(t)
	entries := func(account string) []any {
		e := f.ask(t, "entries", map[string]any{"account_id": account, "min_position": tr.Position})
		return e["entries"].([]any)
	}
	m1, m2 := entries("m1"), entries("m2")
	if len(m1) != 2 || len(m2) != 1 {
		t.Fatalf("entries m1 %v, m2 %v", m1, m2)
	}
	if got := m1[0].(map[string]any)["metadata"]; !reflect.DeepEqual(got, md) {
		t.Fatalf("deposit's entry metadata %v, want %v", got, md)
	}
	for _, e := range []any{m1[1], m2[0]} {
		if got := e.(map[string]any)["metadata"]; !reflect.DeepEqual(got, map[string]any{"invoice": "inv-9"}) {
			t.Fatalf("transfer step's entry metadata %v", e)
		}
	}
}
