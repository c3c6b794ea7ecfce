package domain

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// pinnedCommands are commands whose canonical request and hash were recorded from
// the map-and-json.Marshal encoder (Request().CanonicalJSON()) before Canonical
// existed: stored metadata, key claims and the audit depend on these bytes.
var pinnedCommands = []struct {
	cmd  Command
	json string
	hash string
}{
	{Command{Type: CmdDeposit, IdempotencyKey: "k-1", AccountID: "acc-42", Amount: 1250, HasAmount: true, Currency: "EUR"},
		"{\"account_id\":\"acc-42\",\"amount\":1250,\"currency\":\"EUR\",\"type\":\"deposit\"}", "4ddb418eda5b6bf005dd45fcb0586a44a98db9b9e649b17b1d2f0d80afe21d8f"},
	{Command{Type: CmdOpenAccount, IdempotencyKey: "k-2", AccountID: "alice", Currency: "EUR", OverdraftLimit: 500, Metadata: map[string]string{"tier": "gold", "owner": "Al <&> \"ice\"\n\u2028é"}},
		"{\"account_id\":\"alice\",\"currency\":\"EUR\",\"metadata\":{\"owner\":\"Al \\u003c\\u0026\\u003e \\\"ice\\\"\\n\\u2028é\",\"tier\":\"gold\"},\"overdraft_limit\":500,\"type\":\"open_account\"}", "25648e1ecf35387052e4e06778effaa54ee6d4a74393c9328eee9e81a4d888e0"},
	{Command{Type: CmdOpenAccount, IdempotencyKey: "k-3", AccountID: "bob", Currency: "USD"},
		"{\"account_id\":\"bob\",\"currency\":\"USD\",\"metadata\":{},\"overdraft_limit\":0,\"type\":\"open_account\"}", "b0eecbd6d17dd8ff8d8099add6b8e92c5313fa5139836fe7984efcbc3dd4e655"},
	{Command{Type: CmdTransfer, IdempotencyKey: "k-4", TransferID: "t-1", From: "a", To: "b", Amount: 9, HasAmount: true, Currency: "EUR"},
		"{\"amount\":9,\"currency\":\"EUR\",\"from\":\"a\",\"to\":\"b\",\"transfer_id\":\"t-1\",\"type\":\"transfer\"}", "2e43e2d820abb3d173a0db3202142e266d4a609bfb9f69bdcc71513cf5cf66b1"},
	{Command{Type: CmdPlaceHold, IdempotencyKey: "k-5", AccountID: "a", HoldID: "h-1", Amount: 3, HasAmount: true, Currency: "EUR", ExpiresAt: time.Date(2030, 1, 2, 3, 4, 5, 600, time.UTC)},
		"{\"account_id\":\"a\",\"amount\":3,\"currency\":\"EUR\",\"expires_at\":\"2030-01-02T03:04:05.0000006Z\",\"hold_id\":\"h-1\",\"type\":\"place_hold\"}", "f47b2b1e1403e3e9d947e71b97171158291a796c8f1ca748d21aa915f823ce96"},
	{Command{Type: CmdRefund, IdempotencyKey: "k-6", OriginalKey: "orig<key>&\"x\""},
		"{\"original_key\":\"orig\\u003ckey\\u003e\\u0026\\\"x\\\"\",\"type\":\"refund\"}", "2f5853df6b0df0d5e444ab79d5bd9a381668de8460e7fbeb33b15fe44e1598e4"},
	{Command{Type: CmdCaptureHold, IdempotencyKey: "k-7", AccountID: "a", HoldID: "h-1"},
		"{\"account_id\":\"a\",\"hold_id\":\"h-1\",\"type\":\"capture_hold\"}", "fd4153fed166dbfddd935cb8c876e66bf0ac6a123c3dbf0c786726ceb80182b5"},
	{Command{Type: CmdTransferDebit, IdempotencyKey: "k-8:debit", AccountID: "a", Amount: 9, HasAmount: true, Currency: "EUR", Ref: "t-1", Reason: "transfer_out", Origin: "k-8"},
		"{\"account_id\":\"a\",\"amount\":9,\"currency\":\"EUR\",\"type\":\"transfer_debit\"}", "7fd28a14e8b4ff188a0d672f56c824da3b7fddba3de17033a9db8461c974375b"},
	// v1.2 §2.3: pinned when they were added.
	{Command{Type: CmdWithdraw, IdempotencyKey: "k-9", AccountID: "a", Amount: 9, HasAmount: true, Currency: "EUR", ExpectedRevision: 0, HasExpectedRevision: true, UpTo: true},
		"{\"account_id\":\"a\",\"amount\":9,\"currency\":\"EUR\",\"expected_revision\":0,\"type\":\"withdraw\",\"up_to\":true}", "6622ea178b04dffc2c44d2b787bb47860d961df53b9ab6024779ad6c97d32a42"},
}

func TestCanonicalPinned(t *testing.T) {
	for _, p := range pinnedCommands {
		c := p.cmd.Canonical()
		if string(c.JSON) != p.json || c.Hash != p.hash {
			t.Errorf("%s: Canonical() = %s %s, pinned %s %s", p.cmd.Type, c.JSON, c.Hash, p.json, p.hash)
		}
		r := p.cmd.Request()
		if string(r.CanonicalJSON()) != p.json || r.Hash() != p.hash {
			t.Errorf("%s: Request() = %s %s, pinned %s %s", p.cmd.Type, r.CanonicalJSON(), r.Hash(), p.json, p.hash)
		}
		if rc := r.Canonical(); !bytes.Equal(rc.JSON, c.JSON) || rc.Hash != c.Hash {
			t.Errorf("%s: Request().Canonical() differs", p.cmd.Type)
		}
	}
}

// randomJSONString returns strings that exercise every escaping rule of
// encoding/json: quotes, backslashes, control characters, HTML characters,
// U+2028/U+2029, multi-byte runes and invalid UTF-8.
func randomJSONString(rng *rand.Rand) string {
	pieces := []string{"a", "Z", "0", "-", ".", ":", "_", " ", "\"", "\\", "/", "<", ">", "&", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f",
		"é", "€", "\u2028", "\u2029", "😀", "\xff", "\xc3", "\xed\xa0\x80", "~", "{", "}", ","}
	n := rng.Intn(8)
	var b []byte
	for range n {
		b = append(b, pieces[rng.Intn(len(pieces))]...)
	}
	return string(b)
}

func TestCanonicalMatchesRequest(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	types := append(append([]CommandType{}, ClientCommandTypes...), CmdTransferDebit, CmdTransferCredit, CmdTransferCompensate, CmdExpireHold)
	maybe := func() string {
		if rng.Intn(3) == 0 {
			return ""
		}
		return randomJSONString(rng)
	}
	for i := range 20000 {
		c := Command{
			Type: types[rng.Intn(len(types))], IdempotencyKey: maybe(),
			AccountID: maybe(), Currency: maybe(), TransferID: maybe(), From: maybe(), To: maybe(),
			HoldID: maybe(), OriginalKey: maybe(), Ref: maybe(), Reason: maybe(), Origin: maybe(),
			TransactionID: maybe(), At: time.Unix(rng.Int63n(4e9), rng.Int63n(1e9)),
		}
		for range rng.Intn(3) {
			c.Postings = append(c.Postings, Posting{From: maybe(), To: maybe(), Amount: rng.Int63() - rng.Int63(), Currency: maybe()})
		}
		if rng.Intn(2) == 0 {
			c.Amount, c.HasAmount = rng.Int63()-rng.Int63(), true
		}
		if rng.Intn(2) == 0 {
			c.OverdraftLimit = rng.Int63() - rng.Int63()
		}
		if rng.Intn(3) == 0 {
			c.ExpectedRevision, c.HasExpectedRevision = rng.Int63n(1<<53), true
		}
		c.UpTo = rng.Intn(3) == 0
		if rng.Intn(3) == 0 {
			c.ExpiresAt = time.Unix(rng.Int63n(4e9), rng.Int63n(1e9)*int64(rng.Intn(2))).In(time.FixedZone("x", 3600*(rng.Intn(5)-2)))
		}
		if rng.Intn(3) == 0 {
			c.EffectiveAt = time.Unix(rng.Int63n(4e9), rng.Int63n(1e9)*int64(rng.Intn(2))).In(time.FixedZone("y", 3600*(rng.Intn(5)-2)))
			if rng.Intn(2) == 0 { // as decoded from a request finer than the microsecond
				c.effectiveGiven, c.EffectiveAt = c.EffectiveAt, c.EffectiveAt.Truncate(time.Microsecond)
			}
		}
		if n := rng.Intn(4); n > 0 {
			c.Metadata = map[string]string{}
			for range n {
				c.Metadata[randomJSONString(rng)] = randomJSONString(rng)
			}
		}
		got, r := c.Canonical(), c.Request()
		if want := r.CanonicalJSON(); !bytes.Equal(got.JSON, want) {
			t.Fatalf("case %d (%+v):\n got %s\nwant %s", i, c, got.JSON, want)
		}
		if got.Hash != r.Hash() {
			t.Fatalf("case %d: hash %s, want %s", i, got.Hash, r.Hash())
		}
		if got.Sum.String() != got.Hash || r.Canonical().Sum != got.Sum {
			t.Fatalf("case %d: raw hash %s, want %s", i, got.Sum, got.Hash)
		}
	}
}

func TestJudge(t *testing.T) {
	a := Command{Type: CmdDeposit, AccountID: "a", Amount: 5, HasAmount: true, Currency: "EUR"}
	b := a
	b.Amount = 6
	ca := a.Canonical()
	reads := 0
	read := func() ([]byte, error) { reads++; return ca.JSON, nil }
	rec := &KeyRecord{RequestHash: ParseHash(ca.Hash)}
	if rec.RequestHash != ca.Sum {
		t.Fatalf("ParseHash(%s) = %x, want %x", ca.Hash, rec.RequestHash, ca.Sum)
	}
	verdict := func(d *Decided, req Canonical) KeyVerdict {
		t.Helper()
		j, err := Judge(d, req)
		if err != nil {
			t.Fatal(err)
		}
		return j.Verdict
	}
	if verdict(rec.DecidedFor(read), ca) != KeyDuplicate || verdict(rec.DecidedFor(read), a.Request().Canonical()) != KeyDuplicate || reads != 0 {
		t.Fatalf("same request is not a duplicate, or its request was read (%d reads)", reads)
	}
	if verdict(rec.DecidedFor(read), b.Canonical()) != KeyConflict || verdict(rec.DecidedFor(read), b.Request().Canonical()) != KeyConflict || reads != 2 {
		t.Fatalf("different amount is not a conflict, or its request was not read (%d reads)", reads)
	}
	if v := verdict((*KeyRecord)(nil).DecidedFor(read), ca); v != KeyNew {
		t.Fatalf("no record: %s, want new", v)
	}
	claim := &KeyClaimed{RequestHash: ca.Hash, Request: ca.JSON}
	if verdict(claim.DecidedFor(), ca) != KeyDuplicate || verdict(claim.DecidedFor(), b.Canonical()) != KeyConflict || verdict((*KeyClaimed)(nil).DecidedFor(), ca) != KeyNew {
		t.Fatal("a claim's verdict differs from a record's")
	}
	m := Metadata{RequestHash: ca.Hash, Request: ca.JSON}
	for name, d := range map[string]*Decided{"record": rec.DecidedFor(read), "claim": claim.DecidedFor(), "metadata": DecidedFor(m),
		"saga": (&Saga{RequestHash: ca.Sum, Request: ca.JSON}).DecidedFor(), "transaction": (&TransactionSaga{RequestHash: ca.Sum, Request: ca.JSON}).DecidedFor()} {
		if j, err := Judge(d, b.Canonical()); err != nil || j.Verdict != KeyConflict || len(j.Fields) != 1 || j.Fields[0] != "amount" {
			t.Fatalf("%s, different amount: %+v %v", name, j, err)
		}
	}
	// A record whose metadata carried no valid hash matches nothing; a
	// request that cannot be compared field by field differs in "request".
	for _, d := range []*Decided{(&KeyRecord{}).DecidedFor(nil), (&KeyClaimed{RequestHash: "not a hash"}).DecidedFor(), DecidedFor(Metadata{RequestHash: ca.Hash + "0"})} {
		if j, err := Judge(d, ca); err != nil || j.Verdict != KeyConflict || len(j.Fields) != 1 || j.Fields[0] != "request" {
			t.Fatalf("a zero hash matched: %+v %v", j, err)
		}
	}
	broken := errors.New("read failed")
	if _, err := Judge(rec.DecidedFor(func() ([]byte, error) { return nil, broken }), b.Canonical()); !errors.Is(err, broken) {
		t.Fatalf("a conflict whose request cannot be read: %v, want its error", err)
	}
}

func TestParseHash(t *testing.T) {
	sum := Hash(sha256.Sum256([]byte("x")))
	if got := ParseHash(sum.String()); got != sum {
		t.Fatalf("round trip: %x, want %x", got, sum)
	}
	if sum.String() != hex.EncodeToString(sum[:]) {
		t.Fatalf("String %s, want %s", sum.String(), hex.EncodeToString(sum[:]))
	}
	for _, bad := range []string{"", "ab", strings.ToUpper(sum.String()), sum.String()[:63] + "g", sum.String() + "0"} {
		if !ParseHash(bad).IsZero() {
			t.Errorf("ParseHash(%q) is not zero", bad)
		}
	}
}
