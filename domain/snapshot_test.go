package domain

import "testing"

// TestDecodeSnapshotRefusesWhatEncodeNeverWrites: a snapshot whose state,
// its hash taken again, holds what EncodeSnapshot never writes is refused,
// each kind apart; the audit's stub of a closed hold (amount 0) is not. A
// refunded sum of 0 or less decoded on bde2e73, and a ledger cold-loading it
// refunded the original again in full (the audit's comparison, which drops
// sums of 0, passed it).
func TestDecodeSnapshotRefusesWhatEncodeNeverWrites(t *testing.T) {
	all, _ := sampleStream(t)
	full := fold(t, NewAccount("a"), all)
	if full.Refunded["k1"].Amount != 40 || full.Holds["h1"] == nil {
		t.Fatalf("the sample refunded %+v, holds %v", full.Refunded, full.Holds)
	}
	active := snapshotHold{ID: "h3", Amount: 5, Status: HoldStatusActive, Key: "k-h3"}
	for name, c := range map[string]struct {
		edit func(st *snapshotState)
		ok   bool
	}{
		"true":                    {func(st *snapshotState) {}, true},
		"a closed hold's stub":    {func(st *snapshotState) { st.Holds[0].Amount = 0 }, true},
		"refunded 0":              {func(st *snapshotState) { st.Refunded["k1"] = 0 }, false},
		"refunded 0, unfindable":  {func(st *snapshotState) { st.Refunded["k1"], st.FindableRefunds = 0, nil }, false},
		"refunded less than 0":    {func(st *snapshotState) { st.Refunded["k1"] = -40 }, false},
		"refunded without a key":  {func(st *snapshotState) { st.Refunded[""] = 5 }, false},
		"findable listed twice":   {func(st *snapshotState) { st.FindableRefunds = append(st.FindableRefunds, st.FindableRefunds[0]) }, false},
		"findable not refunded":   {func(st *snapshotState) { st.FindableRefunds = append(st.FindableRefunds, "k9") }, false},
		"a hold without an ID":    {func(st *snapshotState) { st.Holds[0].ID = "" }, false},
		"a hold listed twice":     {func(st *snapshotState) { st.Holds = append(st.Holds, st.Holds[0]) }, false},
		"a hold of no status":     {func(st *snapshotState) { st.Holds[0].Status = "" }, false},
		"a closed hold below 0":   {func(st *snapshotState) { st.Holds[0].Amount = -1 }, false},
		"an active hold of 0":     {func(st *snapshotState) { h := active; h.Amount = 0; st.Holds = append(st.Holds, h) }, false},
		"an active hold below 0":  {func(st *snapshotState) { h := active; h.Amount = -5; st.Holds = append(st.Holds, h) }, false},
		"an active hold":          {func(st *snapshotState) { st.Holds = append(st.Holds, active) }, true},
		"another account's state": {func(st *snapshotState) { st.ID = "b" }, false},
	} {
		st := full.snapshotState()
		c.edit(&st)
		b, err := encodeState("account-a", uint64(full.Revision), full.LastChain, st)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeSnapshot("account-a", b); (err == nil) != c.ok {
			t.Errorf("%s: decoded %v, want %v: %v", name, err == nil, c.ok, err)
		}
	}
}
