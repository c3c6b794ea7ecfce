package reply

import (
	"errors"
	"reflect"
	"testing"

	"github.com/ledgerworks/ledger/domain"
)

func TestFromSagaReadsOnlyTheStepsThatRan(t *testing.T) {
	after := &domain.AccountView{AccountID: "a", Currency: "EUR", Balance: 70, Available: 70, Revision: 4}
	back := &domain.AccountView{AccountID: "a", Currency: "EUR", Balance: 100, Available: 100, Revision: 5}
	ev := func(typ string) domain.EventRef { return domain.EventRef{Type: typ} }
	cases := []struct {
		name    string
		sg      Saga
		steps   map[string]*Step
		asked   []string
		status  domain.Status
		events  []string
		account *domain.AccountView
	}{{
		name:  "completed",
		sg:    Saga{Key: "k", Stage: domain.SagaCompleted, Out: "a", In: "b", Events: []domain.EventRef{ev(domain.EvTransferRequested), ev(domain.EvTransferCompleted)}},
		steps: map[string]*Step{"a/k:debit": {Status: domain.StatusApplied, Events: []domain.EventRef{ev("Debited")}, After: after}, "b/k:credit": {Status: domain.StatusApplied, Events: []domain.EventRef{ev("Credited")}}},
		asked: []string{"a/k:debit", "b/k:credit"}, status: domain.StatusApplied,
		events: []string{domain.EvTransferRequested, "Debited", "Credited", domain.EvTransferCompleted}, account: after,
	}, {
		name:  "debit refused: the credit is never asked for",
		sg:    Saga{Key: "k", Stage: domain.SagaRejected, Code: domain.CodeInsufficientFunds, Out: "a", In: "b", Events: []domain.EventRef{ev(domain.EvTransferRequested), ev(domain.EvTransferRejected)}},
		steps: map[string]*Step{"a/k:debit": {Status: domain.StatusRejected, Events: []domain.EventRef{ev("CommandRejected")}, After: back}},
		asked: []string{"a/k:debit"}, status: domain.StatusRejected,
		events: []string{domain.EvTransferRequested, "CommandRejected", domain.EvTransferRejected}, account: back,
	}, {
		name:  "outright: no step is asked for",
		sg:    Saga{Key: "k", Stage: domain.SagaRejected, Code: domain.CodeSameAccount, Outright: true, Out: "a", In: "a", Events: []domain.EventRef{ev(domain.EvTransferRequested), ev(domain.EvTransferRejected)}},
		asked: nil, status: domain.StatusRejected,
		events: []string{domain.EvTransferRequested, domain.EvTransferRejected},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var asked []string
			r, err := FromSaga(c.sg, true, func(account, key string) (*Step, error) {
				asked = append(asked, account+"/"+key)
				return c.steps[account+"/"+key], nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(asked, c.asked) {
				t.Errorf("asked for %v, want %v", asked, c.asked)
			}
			var types []string
			for _, e := range r.Events {
				types = append(types, e.Type)
			}
			if !reflect.DeepEqual(types, c.events) {
				t.Errorf("events %v, want %v", types, c.events)
			}
			if r.Status != c.status || !r.Duplicate || r.IdempotencyKey != "k" {
				t.Errorf("reply %+v", r)
			}
			if !reflect.DeepEqual(r.Account, c.account) {
				t.Errorf("account %+v, want %+v", r.Account, c.account)
			}
		})
	}
}

func TestFromSagaPassesLookupErrors(t *testing.T) {
	boom := errors.New("read failed")
	_, err := FromSaga(Saga{Key: "k", Stage: domain.SagaCompleted, Out: "a", In: "b"}, false, func(string, string) (*Step, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want %v", err, boom)
	}
}

func TestConflictNamesTheFields(t *testing.T) {
	r := Conflict("k", []string{"amount", "metadata"})
	if r.Code != domain.CodeIdempotencyKeyConflict || r.Status != domain.StatusInvalid || !reflect.DeepEqual(r.Fields, []string{"amount", "metadata"}) {
		t.Fatalf("reply %+v", r)
	}
	if want := "idempotency key was used with a different request; differing fields: amount, metadata"; r.Message != want {
		t.Fatalf("message %q, want %q", r.Message, want)
	}
}

// TestRecorded: a reply answers a recorded decision when applied, rejected,
// or an atomic batch refused at an element (its index), invalid included;
// not when invalid as a whole, nor an error.
func TestRecorded(t *testing.T) {
	i := 1
	for _, c := range []struct {
		r    Reply
		want bool
	}{
		{Reply{Status: domain.StatusApplied}, true},
		{Reply{Status: domain.StatusRejected}, true},
		{Reply{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Index: &i}, true},
		{Reply{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest}, false},
		{Reply{Status: domain.StatusInvalid, Code: domain.CodeIdempotencyKeyConflict}, false},
		{Reply{Status: domain.StatusError}, false},
	} {
		if got := Recorded(c.r); got != c.want {
			t.Errorf("%s %s index %v: recorded %v, want %v", c.r.Status, c.r.Code, c.r.Index, got, c.want)
		}
	}
}
