package audit

import (
	"encoding/json"
	"testing"

	"github.com/ledgerworks/ledger/domain"
)

// A checkpoint's account resumes alike whether it carries its stream (this
// build) or only its snapshot names it (a checkpoint of an earlier build);
// a carried stream the snapshot does not name is refused.
func TestResumeAccountWithAndWithoutItsStream(t *testing.T) {
	a := domain.NewAccount("r1")
	a.Revision, a.Opened, a.Currency, a.Balance = 3, true, "EUR", 250
	stream := domain.AccountStream(a.ID)
	snap, err := domain.EncodeSnapshot(stream, a)
	if err != nil {
		t.Fatal(err)
	}
	for name, ca := range map[string]carriedAccount{
		"with its stream":    {Stream: stream, Snapshot: snap},
		"an earlier build's": {Snapshot: snap},
	} {
		b, err := json.Marshal(ca)
		if err != nil {
			t.Fatal(err)
		}
		var back carriedAccount
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		f := NewFold()
		if err := f.resumeAccount(back); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if same, diff := domain.SameState(f.Accounts[a.ID], a); !same {
			t.Fatalf("%s: resumed %s", name, diff)
		}
	}
	f := NewFold()
	if err := f.resumeAccount(carriedAccount{Stream: domain.AccountStream("other"), Snapshot: snap}); err == nil {
		t.Fatal("a carried stream the snapshot does not name was resumed")
	}
}
