package ledger

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestEffectiveAt (PROTOCOL.md §2.3): an account opened effective in the past
// takes money effective after its opening, by every money command, each event
// carrying the time as given; effective_at later than the record time (beyond
// the 5 s of skew), or earlier than an account's effective opening (either
// account of a transfer, a transaction or a capture into an account), is
// invalid_request naming effective_at and writes nothing; the time is part of
// the request (a resend answers the first decision, another time under the
// key is a conflict naming it). Decisions keep the record order: a deposit
// backdated before a withdrawal recorded earlier does not fund it.
func TestEffectiveAt(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		s := New(st, Options{Clock: clock})
		defer s.Close()
		p := strings.NewReplacer("/", "-").Replace(t.Name()) + "-"
		now := clock()
		ts := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339Nano) }
		a, b, late := p+"a", p+"b", p+"late"
		mustApply(t, s, "open_account", fmt.Sprintf(`{"idempotency_key":"%so-a","account_id":%q,"currency":"EUR","effective_at":%q}`, p, a, ts(-90*24*time.Hour)))
		mustApply(t, s, "open_account", fmt.Sprintf(`{"idempotency_key":"%so-b","account_id":%q,"currency":"EUR","effective_at":%q}`, p, b, ts(-60*24*time.Hour)))
		mustApply(t, s, "open_account", fmt.Sprintf(`{"idempotency_key":"%so-l","account_id":%q,"currency":"EUR"}`, p, late))

		if r := post(t, s, "withdraw", fmt.Sprintf(`{"idempotency_key":"%sw0","account_id":%q,"amount":10,"currency":"EUR"}`, p, a)); r.Code != domain.CodeInsufficientFunds {
			t.Fatalf("withdrawal before any deposit: %+v", r)
		}
		dep := fmt.Sprintf(`{"idempotency_key":"%sd1","account_id":%q,"amount":500,"currency":"EUR","effective_at":%q}`, p, a, ts(-80*24*time.Hour))
		r := mustApply(t, s, "deposit", dep)
		if again := post(t, s, "deposit", dep); !again.Duplicate || again.Status != domain.StatusApplied {
			t.Fatalf("resend: %+v", again)
		}
		other := strings.Replace(dep, ts(-80*24*time.Hour), ts(-79*24*time.Hour), 1)
		if c := post(t, s, "deposit", other); c.Code != domain.CodeIdempotencyKeyConflict || strings.Join(c.Fields, ",") != "effective_at" {
			t.Fatalf("the key with another effective_at: %+v", c)
		}
		if c := post(t, s, "deposit", strings.Replace(dep, fmt.Sprintf(`,"effective_at":%q`, ts(-80*24*time.Hour)), "", 1)); c.Code != domain.CodeIdempotencyKeyConflict || strings.Join(c.Fields, ",") != "effective_at" {
			t.Fatalf("the key without effective_at: %+v", c)
		}
		if r.Account.Balance != 500 {
			t.Fatalf("deposit: %+v", r.Account)
		}
		mustApply(t, s, "transfer", fmt.Sprintf(`{"idempotency_key":"%st1","transfer_id":"%st1","from":%q,"to":%q,"amount":100,"currency":"EUR","effective_at":%q}`, p, p, a, b, ts(-50*24*time.Hour)))
		mustApply(t, s, "post_transaction", txBodyAt(p+"x1", p+"x1", ts(-40*24*time.Hour), posting(a, b, 10, "EUR")))
		mustApply(t, s, "place_hold", fmt.Sprintf(`{"idempotency_key":"%sh1","account_id":%q,"hold_id":"h1","amount":50,"currency":"EUR","effective_at":%q}`, p, a, ts(-30*24*time.Hour)))
		mustApply(t, s, "capture_hold", fmt.Sprintf(`{"idempotency_key":"%sc1","account_id":%q,"hold_id":"h1","amount":20,"to":%q,"effective_at":%q}`, p, a, b, ts(-29*24*time.Hour)))
		mustApply(t, s, "place_hold", fmt.Sprintf(`{"idempotency_key":"%sh2","account_id":%q,"hold_id":"h2","amount":1,"currency":"EUR"}`, p, a))
		mustApply(t, s, "refund", fmt.Sprintf(`{"idempotency_key":"%sr1","original_key":"%sd1","amount":5,"effective_at":%q}`, p, p, ts(4*time.Second)))

		before := len(devtest.SettledAll(t, st))
		for _, c := range []struct{ what, typ, body string }{
			{"a deposit effective beyond the skew", "deposit", fmt.Sprintf(`{"idempotency_key":"%sbad1","account_id":%q,"amount":1,"currency":"EUR","effective_at":%q}`, p, a, ts(6*time.Second))},
			{"an opening effective beyond the skew", "open_account", fmt.Sprintf(`{"idempotency_key":"%sbad2","account_id":"%sz","currency":"EUR","effective_at":%q}`, p, p, ts(time.Hour))},
			{"a deposit before the opening", "deposit", fmt.Sprintf(`{"idempotency_key":"%sbad3","account_id":%q,"amount":1,"currency":"EUR","effective_at":%q}`, p, a, ts(-91*24*time.Hour))},
			{"a transfer before the credited account's opening", "transfer", fmt.Sprintf(`{"idempotency_key":"%sbad4","transfer_id":"%sbad4","from":%q,"to":%q,"amount":1,"currency":"EUR","effective_at":%q}`, p, p, a, late, ts(-time.Hour))},
			{"a transaction before one account's opening", "post_transaction", txBodyAt(p+"bad5", p+"bad5", ts(-70*24*time.Hour), posting(a, b, 1, "EUR"))},
			{"a capture before its to's opening", "capture_hold", fmt.Sprintf(`{"idempotency_key":"%sbad6","account_id":%q,"hold_id":"h2","to":%q,"effective_at":%q}`, p, a, late, ts(-time.Hour))},
			{"a withdrawal before the opening", "withdraw", fmt.Sprintf(`{"idempotency_key":"%sbad7","account_id":%q,"amount":1,"currency":"EUR","effective_at":%q}`, p, b, ts(-61*24*time.Hour))},
			{"not RFC 3339", "deposit", fmt.Sprintf(`{"idempotency_key":"%sbad8","account_id":%q,"amount":1,"currency":"EUR","effective_at":"yesterday"}`, p, a)},
		} {
			r := post(t, s, c.typ, c.body)
			if r.Status != domain.StatusInvalid || r.Code != domain.CodeInvalidRequest || strings.Join(r.Fields, ",") != "effective_at" {
				t.Errorf("%s: %+v", c.what, r)
			}
		}
		if devtest.MultiAppends(st) { // an atomic batch whose transaction an account's opening refuses
			r := post(t, s, "batch", fmt.Sprintf(`{"atomic":true,"idempotency_key":"%sab","commands":[{"type":"deposit","idempotency_key":"%sab1","account_id":%q,"amount":1,"currency":"EUR"},{"type":"post_transaction",%s]}`,
				p, p, a, strings.TrimPrefix(txBodyAt(p+"ab2", p+"ab2", ts(-70*24*time.Hour), posting(a, b, 1, "EUR")), "{")))
			if r.Status != domain.StatusInvalid || r.Index == nil || *r.Index != 1 || len(r.Replies) != 2 || strings.Join(r.Replies[1].Fields, ",") != "effective_at" {
				t.Errorf("an atomic batch with a transaction effective before an opening: %+v", r)
			}
		}
		for _, ev := range devtest.SettledAll(t, st)[before:] { // but the atomic batch's own decision
			if ev.Stream != domain.KeyStream(p+"ab") {
				t.Fatalf("an invalid command wrote %s %s %s", ev.Stream, ev.Type, ev.Data)
			}
		}

		effective := map[string]string{}
		for _, ev := range devtest.ReadAll(t, st) {
			m, err := domain.DecodeMetadata(ev.Metadata)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(ev.Stream, domain.AccountStream(p)) && m.EffectiveAt != nil {
				effective[ev.Stream+"/"+ev.Type] = m.EffectiveAt.Sub(now).String()
			}
		}
		sa, sb := domain.AccountStream(a), domain.AccountStream(b)
		want := map[string]string{
			sa + "/AccountOpened": "-2160h0m0s", sb + "/AccountOpened": "-1440h0m0s",
			sa + "/Credited":   "-1920h0m0s", // the deposit; the refund's Debited below
			sa + "/Debited":    "4s",
			sb + "/Credited":   "-696h0m0s", // the last credit to b: the capture's
			sa + "/HoldPlaced": "-720h0m0s", sa + "/HoldCaptured": "-696h0m0s",
		}
		for k, v := range want {
			if effective[k] != v {
				t.Errorf("%s effective %q, want %q", k, effective[k], v)
			}
		}
		if got := devtest.Account(t, st, a); got.Balance != 500-100-10-20-5 || !got.EffectiveFrom.Equal(now.Add(-90*24*time.Hour)) {
			t.Fatalf("account a: balance %d, effective from %s", got.Balance, got.EffectiveFrom)
		}
	})
}

func txBodyAt(key, id, effectiveAt string, postings ...string) string {
	return strings.TrimSuffix(txBody(key, id, postings...), "}") + fmt.Sprintf(`,"effective_at":%q}`, effectiveAt)
}
