package projections

import (
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// TestDispatchEveryEventType walks every event type of the domain's registry
// through each projection's dispatch of its stream kind: the accounts' rows and
// the balance history take every account event and refuse the others; the
// transfers' rows and the commands' saga parts take every transfer event and
// refuse the others. A type registered in the domain and missing from a
// projection fails here, not in production (where the projector would stop).
func TestDispatchEveryEventType(t *testing.T) {
	for _, et := range domain.EventTypes() {
		account := et.Kind == domain.StreamAccount
		transfer := et.Kind == domain.StreamTransfer
		ev := func(stream string) *Event {
			re := eventstore.RecordedEvent{Stream: stream, Type: et.Name}
			return &Event{RecordedEvent: re, Meta: domain.Metadata{Key: "k"}, Payload: et.New()}
		}
		_, err := NextBalance(BalanceState{}, et.New())
		check(t, et, "balances", account, err)
		err = applyAccountEvent(map[string]*accountRow{}, map[[2]string]*holdRow{}, "a", ev(domain.AccountStream("a")))
		check(t, et, "accounts", account, err)
		err = (&transferRow{id: "t"}).apply(ev(domain.TransferStream("t")))
		check(t, et, "transfers", transfer, err)
		ps := &cmdParts{m: map[string]*part{"saga/k": {Stage: domain.SagaPending}}, dirty: map[string]bool{}, deleted: map[string]bool{}}
		_, err = ps.sagaStage(ev(domain.TransferStream("t")), "t", "saga/k", &part{revision: -1})
		check(t, et, "commands (sagas)", transfer, err)
	}
}

// check requires a projection's dispatch to have taken an event type it should
// take (err nil), and refused one it should not.
func check(t *testing.T, et domain.EventType, projection string, takes bool, err error) {
	t.Helper()
	switch {
	case takes && err != nil:
		t.Errorf("%s (%s stream): the %s projection refuses it: %v", et.Name, et.Kind, projection, err)
	case !takes && err == nil:
		t.Errorf("%s (%s stream): the %s projection takes it", et.Name, et.Kind, projection)
	}
}
