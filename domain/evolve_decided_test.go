package domain

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/uuid"
)

// TestEvolveAccountDecidedMatchesStored folds the same decisions twice, once from
// their encoded data (EvolveAccount, as read from a store) and once from the
// decided payloads (EvolveAccountDecided, as the ledger does, confirmed once its
// append is durable: ForgetDurable), and requires the same aggregate after every event, key records included.
func TestEvolveAccountDecidedMatchesStored(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	cmds := sampleAccountCommands(at)
	stored, decided := NewAccount("a"), NewAccount("a")
	for i, cmd := range cmds {
		cmd.IdempotencyKey, cmd.At = fmt.Sprintf("k%d", i), at
		d := DecideAccount(decided, cmd)
		if len(d.Events) == 0 {
			t.Fatalf("%d %s: no events: %+v", i, cmd.Type, d)
		}
		for j, ne := range d.Events {
			ev := storedOf(t, cmd, d.Events, j, uint64(stored.Revision+1), fmt.Sprint(i))
			if err := EvolveAccount(stored, ev); err != nil {
				t.Fatal(err)
			}
			if err := EvolveAccountDecided(decided, ev, ne.Data); err != nil {
				t.Fatal(err)
			}
			decided.ForgetDurable(decided.Revision) // its append is durable: confirmed
			if !sameButProvenance(stored, decided) {
				t.Fatalf("%d %s: aggregates differ:\nstored  %+v\ndecided %+v", i, ne.Type, stored, decided)
			}
		}
	}
	if decided.Keys["k13"].Code != CodeAccountNotEmpty || decided.Keys["k3"].Status != StatusRejected || decided.Refunded.Of("k1").Amount != 40 {
		t.Fatalf("the sequence did not go as planned: %+v", decided)
	}
}

// TestKeyRecordsShareStrings: records folded from events whose strings are each
// their own copy (as a store decodes them) share the stream name and the interned
// command and event types, so that an aggregate keeps no string per record for them.
func TestKeyRecordsShareStrings(t *testing.T) {
	a := NewAccount("a")
	opened, _ := json.Marshal(AccountOpened{AccountID: "a", Currency: "EUR"})
	credited, _ := json.Marshal(Credited{Amount: 5, Currency: "EUR", Reason: ReasonDeposit, BalanceAfter: 5})
	evs := []struct {
		typ, cmd string
		data     []byte
	}{{EvAccountOpened, string(CmdOpenAccount), opened}, {EvCredited, string(CmdDeposit), credited}}
	for i, e := range evs {
		ev := StoredEvent{
			ID: uuid.New(), Stream: strings.Clone(AccountStream("a")), Revision: uint64(i), Type: strings.Clone(e.typ), Data: e.data,
			Metadata: Metadata{Key: fmt.Sprintf("k%d", i), Command: strings.Clone(e.cmd), RequestHash: strings.Repeat("ab", 32), Count: 1},
		}
		if err := EvolveAccount(a, ev); err != nil {
			t.Fatal(err)
		}
	}
	r0, r1 := a.Keys["k0"], a.Keys["k1"]
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	if !same(r0.Events[0].Stream, r1.Events[0].Stream) || r1.Events[0].Stream != AccountStream("a") {
		t.Error("records keep a stream name each")
	}
	if !same(r1.Events[0].Type, EvCredited) || !same(string(r1.Command), string(CmdDeposit)) || !same(string(r0.Command), string(CmdOpenAccount)) {
		t.Error("records keep their own type strings")
	}
	if r1.RequestHash != ParseHash(strings.Repeat("ab", 32)) || r1.RequestHash.IsZero() {
		t.Errorf("request hash %x", r1.RequestHash)
	}
}

// TestKeyRecordOfSeveralEvents: a record keeps every event of its key's write in
// order, past the first that is allocated with it.
func TestKeyRecordOfSeveralEvents(t *testing.T) {
	a := NewAccount("a")
	opened, _ := json.Marshal(AccountOpened{AccountID: "a", Currency: "EUR"})
	if err := EvolveAccount(a, StoredEvent{ID: uuid.New(), Stream: "account-a", Type: EvAccountOpened, Data: opened, Metadata: Metadata{Key: "o", Command: "open_account", Count: 1}}); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for i := range 3 {
		data, _ := json.Marshal(Credited{Amount: 1, Currency: "EUR", Reason: ReasonDeposit, BalanceAfter: int64(i + 1)})
		ev := StoredEvent{ID: uuid.New(), Stream: "account-a", Revision: uint64(i + 1), Position: fmt.Sprintf("%d/%d", i+1, i+1), Type: EvCredited, Data: data, Metadata: Metadata{Key: "k", Command: "deposit", Index: i, Count: 3}}
		ids = append(ids, ev.ID)
		if err := EvolveAccount(a, ev); err != nil {
			t.Fatal(err)
		}
	}
	rec := a.Keys["k"]
	if len(rec.Events) != 3 || rec.Position != "3/3" || rec.After().Balance != 3 {
		t.Fatalf("record %+v", rec)
	}
	for i, ev := range rec.Events {
		if ev.ID != ids[i] || ev.Revision != uint64(i+1) || ev.Type != EvCredited || ev.Stream != "account-a" {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
}

// storedOf is event j of a decision on cmd as a store would return it, in
// account a's stream at revision rev; pos is its position and the chain hash it
// pretends to have.
func storedOf(t *testing.T, cmd Command, events []NewEvent, j int, rev uint64, pos string) StoredEvent {
	t.Helper()
	data, err := json.Marshal(events[j].Data)
	if err != nil {
		t.Fatal(err)
	}
	req := cmd.Canonical()
	m := Metadata{Key: cmd.IdempotencyKey, Command: string(cmd.Type), RequestHash: req.Hash, Index: j, Count: len(events), At: cmd.At, Chain: pos, Subject: EventSubject(events[j])}
	if j == 0 {
		m.Request = req.JSON
	}
	return StoredEvent{ID: uuid.New(), Stream: "account-a", Revision: rev, Position: pos, Type: events[j].Type, Data: data, Metadata: m}
}

// sampleAccountCommands is a life of account "a" that writes every kind of
// account event, recorded refusals and a refund among them; command i is to be
// sent under key "k<i>".
func sampleAccountCommands(at time.Time) []Command {
	return []Command{
		{Type: CmdOpenAccount, AccountID: "a", Currency: "EUR", OverdraftLimit: 10, Metadata: map[string]string{"k": "v"}},
		{Type: CmdDeposit, AccountID: "a", Amount: 100, HasAmount: true, Currency: "EUR"},
		{Type: CmdWithdraw, AccountID: "a", Amount: 30, HasAmount: true, Currency: "EUR"},
		{Type: CmdWithdraw, AccountID: "a", Amount: 1000, HasAmount: true, Currency: "EUR"}, // insufficient funds: recorded
		{Type: CmdDeposit, AccountID: "a", Amount: 5, HasAmount: true, Currency: "USD"},     // currency mismatch: recorded
		{Type: CmdPlaceHold, AccountID: "a", HoldID: "h1", Amount: 20, HasAmount: true, Currency: "EUR", ExpiresAt: at.Add(time.Hour)},
		{Type: CmdPlaceHold, AccountID: "a", HoldID: "h2", Amount: 10, HasAmount: true, Currency: "EUR"},
		{Type: CmdCaptureHold, AccountID: "a", HoldID: "h1", Amount: 15, HasAmount: true},
		{Type: CmdReleaseHold, AccountID: "a", HoldID: "h2"},
		{Type: CmdRefund, OriginalKey: "k1", Amount: 40, HasAmount: true},
		{Type: CmdRefund, OriginalKey: "k2"},
		{Type: CmdTransferCredit, AccountID: "a", Amount: 7, HasAmount: true, Currency: "EUR", Reason: ReasonTransferIn, Ref: "t"},
		{Type: CmdTransferDebit, AccountID: "a", Amount: 7, HasAmount: true, Currency: "EUR", Reason: ReasonTransferOut, Ref: "t"},
		{Type: CmdCloseAccount, AccountID: "a"}, // not empty: recorded
	}
}

// sameButProvenance reports whether read, folded from stored events, and
// decided, folded from the same events as decided here, are the same
// aggregate but for where their last event came from (DecidedHead: false
// for read, true for decided).
func sameButProvenance(read, decided *Account) bool {
	if read.DecidedHead() || !decided.DecidedHead() {
		return false
	}
	c := *decided
	c.decidedHead = false
	return reflect.DeepEqual(read, &c)
}
