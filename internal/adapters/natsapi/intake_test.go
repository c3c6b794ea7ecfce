package natsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// rig is one ledger (service + intake) on a real NATS and PostgreSQL.
type rig struct {
	t     *testing.T
	store eventstore.Store
	svc   *ledger.Service
	nc    *nats.Conn // the client's connection
	url   string     // NATS URL
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ns := devtest.NATS(t)
	store := devtest.Postgres(t)
	return &rig{t: t, store: store, svc: ledger.New(store, ledger.Options{}), nc: devtest.Connect(t, ns), url: ns.ClientURL()}
}

// intake starts an intake on its own connection; it is stopped when the test ends.
func (r *rig) intake(opts Options) (*Intake, *nats.Conn) {
	r.t.Helper()
	nc := devtest.ConnectURL(r.t, r.url)
	if opts.Lookup == nil {
		opts.Lookup = r.svc
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	in := New(nc, r.svc, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := in.Start(ctx); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := in.Stop(ctx); err != nil {
			r.t.Error(err)
		}
	})
	return in, nc
}

func (r *rig) request(typ string, body []byte) reply.Reply {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// One request, no resend: these tests look at what the intake answers
	// (LEDGER_COMMANDS is NoAck, so the first message is the ledger's reply).
	m, err := r.nc.RequestWithContext(ctx, CommandSubject(typ), body)
	if err != nil {
		r.t.Fatalf("%s: %v", typ, err)
	}
	var rep reply.Reply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		r.t.Fatalf("%s: reply %s: %v", typ, m.Data, err)
	}
	return rep
}

// query asks ledger.v1.query.<name> once and returns the reply.
func (r *rig) query(name string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := r.nc.RequestWithContext(ctx, QuerySubjectPrefix+name, body)
	if err != nil {
		return nil, err
	}
	return m.Data, nil
}

// eventsOfKey are the events of "all" whose metadata names key, outside key streams.
func (r *rig) eventsOfKey(key string) []eventstore.RecordedEvent {
	var out []eventstore.RecordedEvent
	for _, ev := range devtest.ReadAll(r.t, r.store) {
		m, err := domain.DecodeMetadata(ev.Metadata)
		if err != nil {
			r.t.Fatal(err)
		}
		if m.Key == key && !strings.HasPrefix(ev.Stream, domain.KeyStreamPrefix) {
			out = append(out, ev)
		}
	}
	return out
}

func body(fields map[string]any) []byte {
	b, err := json.Marshal(fields)
	if err != nil {
		panic(err)
	}
	return b
}

func TestBadInputIsInvalidAndWritesNothing(t *testing.T) {
	r := newRig(t)
	r.intake(Options{Grace: -1, BackOff: []time.Duration{time.Second}})
	if rep := r.request("open_account", body(map[string]any{"idempotency_key": "open-acc", "account_id": "acc", "currency": "EUR"})); rep.Status != domain.StatusApplied {
		t.Fatalf("open_account: %+v", rep)
	}
	before := len(devtest.SettledAll(r.t, r.store))

	deposit := func(extra string) []byte {
		return []byte(`{"idempotency_key":"bad-1","account_id":"acc","currency":"EUR",` + extra + `}`)
	}
	big := `{"idempotency_key":"bad-big","account_id":"acc","amount":1,"currency":"EUR","pad":"` + strings.Repeat("x", 64<<10) + `"}`
	rows := []struct {
		name, typ, body string
		field           string // named in the message
	}{
		{"malformed JSON", "deposit", `{"idempotency_key":"bad-1","account_id":`, "JSON"},
		{"unknown field", "deposit", `{"idempotency_key":"bad-1","account_id":"acc","amount":1,"currency":"EUR","colour":"red"}`, "colour"},
		{"missing key", "deposit", `{"account_id":"acc","amount":1,"currency":"EUR"}`, "idempotency_key"},
		{"key too long", "deposit", `{"idempotency_key":"` + strings.Repeat("k", 129) + `","account_id":"acc","amount":1,"currency":"EUR"}`, "idempotency_key"},
		{"amount 0", "deposit", string(deposit(`"amount":0`)), "amount"},
		{"amount -1", "deposit", string(deposit(`"amount":-1`)), "amount"},
		{"amount 1.5", "deposit", string(deposit(`"amount":1.5`)), "amount"},
		{`amount "10"`, "deposit", string(deposit(`"amount":"10"`)), "amount"},
		{"amount 1e3", "deposit", string(deposit(`"amount":1e3`)), "amount"},
		{"amount 2^53", "deposit", string(deposit(`"amount":9007199254740992`)), "amount"},
		{"lower-case currency", "deposit", `{"idempotency_key":"bad-1","account_id":"acc","amount":1,"currency":"eur"}`, "currency"},
		{"bad account id", "deposit", `{"idempotency_key":"bad-1","account_id":"acc ount!","amount":1,"currency":"EUR"}`, "account_id"},
		{"body over 64 KiB", "deposit", big, "body"},
		{"invalid UTF-8", "deposit", "{\"idempotency_key\":\"bad-1\",\"account_id\":\"acc\",\"amount\":1,\"currency\":\"EUR\",\"x\":\"\xff\xfe\"}", "UTF-8"},
		{"unknown command type", "teleport", `{"idempotency_key":"bad-1","account_id":"acc","amount":1,"currency":"EUR"}`, "type"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			rep := r.request(row.typ, []byte(row.body))
			if rep.Status != domain.StatusInvalid || rep.Code != domain.CodeInvalidRequest {
				t.Fatalf("status %q code %q, want invalid/invalid_request: %+v", rep.Status, rep.Code, rep)
			}
			if !strings.Contains(rep.Message, row.field) {
				t.Fatalf("message %q does not name %q", rep.Message, row.field)
			}
			if len(rep.Events) != 0 || rep.Duplicate {
				t.Fatalf("events or duplicate on an invalid reply: %+v", rep)
			}
		})
	}
	if rep := r.request("teleport", []byte(rows[len(rows)-1].body)); len(rep.Fields) != 1 || rep.Fields[0] != "type" {
		t.Errorf("unknown type: fields %v, want [type]", rep.Fields)
	}

	// The stream captured every row; the consumer dead-letters each, with its reason.
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dlq, err := js.Stream(ctx, DLQStreamName)
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(len(rows) + 1)
	devtest.Eventually(t, 20*time.Second, "every bad row dead-lettered", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == want
	})
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(HeaderDLQReason) != string(domain.CodeInvalidRequest) || m.Header.Get(HeaderDLQSubject) == "" || m.Header.Get(HeaderDLQMessage) == "" {
		t.Errorf("dead letter headers: %v", m.Header)
	}
	if after := len(devtest.SettledAll(r.t, r.store)); after != before {
		t.Fatalf("bad input appended %d events", after-before)
	}
}

func TestJetStreamTwiceAndAfterAKilledConsumerIsAppliedOnce(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := EnsureStreams(ctx, js, StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	open := body(map[string]any{"idempotency_key": "open-alice", "account_id": "alice", "currency": "EUR"})
	dep := body(map[string]any{"idempotency_key": "dep-1", "account_id": "alice", "amount": 1500, "currency": "EUR"})
	// No ledger runs yet: the stream stores the commands and nobody answers (the
	// stream has NoAck). Plain publishes carry no reply subject.
	for _, m := range []struct {
		typ  string
		body []byte
	}{{"open_account", open}, {"deposit", dep}, {"deposit", dep}} {
		if err := r.nc.Publish(CommandSubject(m.typ), m.body); err != nil { // no Nats-Msg-Id: both copies are stored
			t.Fatal(err)
		}
	}
	stored := func(n uint64) {
		t.Helper()
		devtest.Eventually(t, 10*time.Second, fmt.Sprintf("%d commands stored", n), func() bool {
			st, err := js.Stream(ctx, StreamName)
			if err != nil {
				return false
			}
			info, err := st.Info(ctx)
			return err == nil && info.State.Msgs == n
		})
	}
	stored(3)

	// Consumer A decides the first copy of dep-1, then dies before its ack.
	var killed sync.Once
	died := make(chan struct{})
	aConn := make(chan *nats.Conn, 1)
	backoff := []time.Duration{time.Second}
	_, nc := r.intake(Options{Grace: -1, BackOff: backoff, beforeAck: func(m jetstream.Msg, rep reply.Reply) bool {
		if rep.IdempotencyKey != "dep-1" {
			return true
		}
		if rep.Status != domain.StatusApplied {
			t.Errorf("first delivery of dep-1: %+v", rep)
		}
		killed.Do(func() { (<-aConn).Close(); close(died) })
		return false
	}})
	aConn <- nc
	select {
	case <-died:
	case <-time.After(20 * time.Second):
		t.Fatal("consumer A never handled dep-1")
	}

	// One more copy while no ledger runs: a js.Publish gets no answer (its outcome
	// is indefinite: the client would retry with the same key), yet the command is
	// stored. Then consumer B takes over the durable.
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := js.Publish(pctx, CommandSubject("deposit"), dep); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish with no ledger up: %v, want no answer", err)
	}
	stored(4)
	r.intake(Options{Grace: -1, BackOff: backoff})
	cons, err := js.Consumer(ctx, StreamName, DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 30*time.Second, "every copy acked", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= 4
	})

	evs := r.eventsOfKey("dep-1")
	if len(evs) != 1 || evs[0].Type != domain.EvCredited {
		t.Fatalf("dep-1 wrote %d events, want one Credited: %+v", len(evs), evs)
	}
	q, err := r.query("command", body(map[string]any{"idempotency_key": "dep-1"}))
	if err != nil {
		t.Fatal(err)
	}
	var rep reply.Reply
	if err := json.Unmarshal(q, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Status != domain.StatusApplied || rep.Duplicate || rep.Account == nil || rep.Account.Balance != 1500 || len(rep.Events) != 1 || rep.Events[0].ID != evs[0].ID {
		t.Fatalf("query.command: %s", q)
	}
	q, err = r.query("command", body(map[string]any{"idempotency_key": "never-sent"}))
	if err != nil {
		t.Fatal(err)
	}
	var nf reply.QueryError
	if err := json.Unmarshal(q, &nf); err != nil || nf.Code != domain.CodeNotFound {
		t.Fatalf("unknown key: %s", q)
	}
}

func TestRequestReplyIsNotSeenAsDuplicateByItsSender(t *testing.T) {
	r := newRig(t)
	r.intake(Options{})
	r.request("open_account", body(map[string]any{"idempotency_key": "open-a", "account_id": "a", "currency": "EUR"}))
	for i := range 20 {
		rep := r.request("deposit", body(map[string]any{"idempotency_key": fmt.Sprintf("d-%d", i), "account_id": "a", "amount": 1, "currency": "EUR"}))
		if rep.Status != domain.StatusApplied || rep.Duplicate {
			t.Fatalf("first send of d-%d: %+v", i, rep)
		}
	}
	rep := r.request("deposit", body(map[string]any{"idempotency_key": "d-0", "account_id": "a", "amount": 1, "currency": "EUR"}))
	if !rep.Duplicate || rep.Status != domain.StatusApplied {
		t.Fatalf("resend of d-0: %+v", rep)
	}
}

// TestTransactionQuery (ledger.v1.query.transaction, v1.1): a posted and a
// refused transaction as their streams record them, not_found for an ID never
// posted, invalid_request naming transaction_id for a malformed one.
func TestTransactionQuery(t *testing.T) {
	r := newRig(t)
	r.intake(Options{})
	for _, id := range []string{"a", "b"} {
		r.request("open_account", body(map[string]any{"idempotency_key": "open-" + id, "account_id": id, "currency": "EUR"}))
	}
	r.request("deposit", body(map[string]any{"idempotency_key": "dep", "account_id": "a", "amount": 100, "currency": "EUR"}))
	leg := func(from, to string, amount int) map[string]any {
		return map[string]any{"from": from, "to": to, "amount": amount, "currency": "EUR"}
	}
	if rep := r.request("post_transaction", body(map[string]any{"idempotency_key": "tx-1", "transaction_id": "t-1", "postings": []any{leg("a", "b", 60)}, "metadata": map[string]string{"order": "7"}})); rep.Transaction == nil || len(rep.Accounts) != 2 {
		t.Fatalf("post_transaction over NATS: %+v", rep)
	}
	r.request("post_transaction", body(map[string]any{"idempotency_key": "tx-2", "transaction_id": "t-2", "postings": []any{leg("a", "b", 10), leg("b", "a", 500)}}))
	ask := func(b []byte, v any) {
		t.Helper()
		q, err := r.query("transaction", b)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(q, v); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var posted, refused reply.TransactionDetail
	ask(body(map[string]any{"transaction_id": "t-1"}), &posted)
	if posted.Status != "posted" || posted.IdempotencyKey != "tx-1" || len(posted.Postings) != 1 || posted.Postings[0].Amount != 60 || posted.Metadata["order"] != "7" || posted.Position == "" {
		t.Fatalf("posted transaction: %+v", posted)
	}
	ask(body(map[string]any{"transaction_id": "t-2"}), &refused)
	if refused.Status != "rejected" || refused.Code != domain.CodeInsufficientFunds || refused.Posting == nil || *refused.Posting != 1 {
		t.Fatalf("refused transaction: %+v", refused)
	}
	r.request("refund", body(map[string]any{"idempotency_key": "rf-1", "original_key": "tx-1", "amount": 10}))
	var refund reply.TransactionDetail
	ask(body(map[string]any{"transaction_id": "t-1~refund~0"}), &refund)
	if refund.Status != "posted" || refund.IdempotencyKey != "rf-1" || len(refund.Postings) != 1 || refund.Postings[0].From != "b" || refund.Postings[0].Amount != 10 {
		t.Fatalf("the refund, a transaction of its own: %+v", refund)
	}
	for _, c := range []struct {
		body []byte
		code domain.Code
	}{
		{body(map[string]any{"transaction_id": "never"}), domain.CodeNotFound},
		{body(map[string]any{"transaction_id": "t-1~refund~x"}), domain.CodeInvalidRequest},
		{body(map[string]any{"transaction_id": "a b"}), domain.CodeInvalidRequest},
		{body(map[string]any{"transaction_id": "t-1", "extra": 1}), domain.CodeInvalidRequest},
	} {
		var qe reply.QueryError
		ask(c.body, &qe)
		if qe.Code != c.code {
			t.Fatalf("%s: %+v", c.body, qe)
		}
	}
	// The same over HTTP (GET /v1/transactions/{id}).
	mux := http.NewServeMux()
	mux.Handle("GET /v1/transactions/{id}", TransactionHTTP(r.svc))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for path, want := range map[string]int{"/v1/transactions/t-1": 200, "/v1/transactions/t-1~refund~0": 200, "/v1/transactions/never": 404, "/v1/transactions/a%20b": 400,
		"/v1/transactions/t-1?status=posted": 400} { // no parameter is taken (httpapi.CheckParams)
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != want || (want == 200 && got["status"] != "posted") {
			t.Fatalf("GET %s: %d %v (%v)", path, resp.StatusCode, got, err)
		}
	}
}
