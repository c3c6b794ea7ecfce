package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// atomicBody is the body of an atomic batch of cmds under key.
func atomicBody(key string, cmds []batchCmd) []byte {
	return batchBody(cmds, "atomic", true, "idempotency_key", key)
}

// atomicExpected is what an atomic batch of cmds must answer after the
// commands of every batch applied before it (history): the replies its
// commands get sent alone, one after another, on a fresh ledger that took
// history first; refused at the first that is not applied.
type atomicExpected struct {
	replies []Reply
	refused int // -1: applied
}

func expectAtomic(t *testing.T, history, cmds []batchCmd) atomicExpected {
	t.Helper()
	ref := newService(devtest.Memory(t))
	defer ref.Close()
	for _, c := range history {
		if r := ref.HandleRaw(context.Background(), c.typ, c.alone()); r.Status != domain.StatusApplied {
			t.Fatalf("history does not apply alone: %s %s: %+v", c.typ, c.alone(), r)
		}
	}
	// decided: the command that decided each key. An element whose key was
	// decided with another request is refused as that conflict: the batch
	// judges every element's key before it decides the element, while alone a
	// command refused without a record (a transfer to an account that does not
	// exist) may answer that refusal without meeting its key's claim.
	decided := map[string]batchCmd{}
	decide := func(c batchCmd) {
		if k := c.body["idempotency_key"].(string); decided[k].typ == "" {
			decided[k] = c
		}
	}
	for _, c := range history {
		decide(c)
	}
	want := atomicExpected{refused: -1}
	for i, c := range cmds {
		r := positionless(ref.HandleRaw(context.Background(), c.typ, c.alone()))
		k, _ := c.body["idempotency_key"].(string)
		if d, ok := decided[k]; ok && r.Status == domain.StatusRejected && (d.typ != c.typ || !bytes.Equal(d.alone(), c.alone())) {
			r.Status, r.Code = domain.StatusInvalid, domain.CodeIdempotencyKeyConflict
		}
		if r.Status == domain.StatusApplied {
			decide(c)
		}
		want.replies = append(want.replies, r)
		if r.Status != domain.StatusApplied {
			want.refused = i
			break
		}
	}
	return want
}

// checkAllOrNothing is the store's side of an atomic batch (key, its
// elements' keys) answered r: the events it added (added) are, applied, the
// batch's decision and every element's claim but for those answered as
// duplicates, and nothing but what the batch and its elements wrote; refused
// (by a rejected or an invalid element), the batch's decision alone, so no
// element's claim nor any money.
func checkAllOrNothing(added []eventstore.RecordedEvent, key string, keys []string, r Reply) error {
	claims := map[string]string{}
	for _, ev := range added {
		if k, ok := strings.CutPrefix(ev.Stream, domain.KeyStreamPrefix); ok {
			claims[k] = ev.Type
			continue
		}
		m, err := domain.DecodeMetadata(ev.Metadata)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(keys, func(k string) bool { return m.Key == k || m.Origin == k || strings.HasPrefix(m.Key, k+":") }) {
			return fmt.Errorf("%s@%d (key %q) is no element's", ev.Stream, ev.Revision, m.Key)
		}
	}
	if r.Status != domain.StatusApplied {
		if len(added) != 1 || claims[key] != domain.EvBatchDecided {
			return fmt.Errorf("refused at %v, the batch wrote %d events, want its decision alone: %v", r.Index, len(added), claims)
		}
		return nil
	}
	if claims[key] != domain.EvBatchDecided {
		return fmt.Errorf("applied, but no decision of the batch was written: %v", claims)
	}
	for i, k := range keys {
		if slices.Index(keys, k) < i { // an earlier element's key: a duplicate of it
			if !r.Replies[i].Duplicate {
				return fmt.Errorf("element %d repeats key %q, not as a duplicate", i, k)
			}
			continue
		}
		if (claims[k] == domain.EvKeyClaimed) == r.Replies[i].Duplicate {
			return fmt.Errorf("element %d (key %q, duplicate %v): claimed by the batch: %v", i, k, r.Replies[i].Duplicate, claims[k] != "")
		}
	}
	return nil
}

// asDuplicate is a batch's first reply as a resend gets it.
func asDuplicate(r Reply) Reply {
	r.Duplicate = true
	if r.Status == domain.StatusApplied {
		r.Replies = append([]Reply(nil), r.Replies...)
		for i := range r.Replies {
			r.Replies[i].Duplicate = true
		}
	}
	return r
}

// atomicRun is a run of random atomic batches on one store.
type atomicRun struct {
	t       *testing.T
	s       *Service
	st      eventstore.Store
	history []batchCmd // the commands of the batches that applied, in order
	sent    []atomicSent
	invalid int // batches refused by an invalid element
}

// atomicSent is a batch sent and recorded: its key, body, commands and first reply.
type atomicSent struct {
	key   string
	body  []byte
	cmds  []batchCmd
	first Reply
}

// send sends an atomic batch (cmds under key) and checks it against its
// expected outcome, the store and a resend.
func (a *atomicRun) send(key string, cmds []batchCmd) {
	t := a.t
	ctx := context.Background()
	body := atomicBody(key, cmds)
	before := len(devtest.SettledAll(t, a.st))
	want := expectAtomic(t, a.history, cmds)
	r := positionless(a.s.HandleBatch(ctx, body, 0))
	keys := make([]string, len(cmds))
	for i, c := range cmds {
		keys[i], _ = c.body["idempotency_key"].(string)
	}
	if len(r.Replies) != len(cmds) || r.IdempotencyKey != key || r.Duplicate {
		t.Fatalf("batch %s: %+v", key, r)
	}
	if r.Status == domain.StatusInvalid {
		a.invalid++
	}
	if want.refused < 0 {
		if r.Status != domain.StatusApplied || r.Index != nil || !reflect.DeepEqual(r.Replies, want.replies) {
			t.Fatalf("batch %s (%s): applied alone, got\n%+v\nwant\n%+v", key, body, r.Replies, want.replies)
		}
		a.history = append(a.history, cmds...)
	} else {
		i, w := want.refused, want.replies[want.refused]
		if r.Status != w.Status || r.Code != w.Code || r.Index == nil || *r.Index != i || r.Replies[i].Code != w.Code {
			t.Fatalf("batch %s (%s): refused alone at %d (%+v), got %+v", key, body, i, w, r)
		}
		for j, el := range r.Replies {
			if j != i && (el.Status != domain.StatusRejected || el.Code != domain.CodeLinkedEventFailed || el.IdempotencyKey != keys[j]) {
				t.Fatalf("batch %s: element %d of a batch refused at %d: %+v", key, j, i, el)
			}
		}
	}
	if err := checkAllOrNothing(devtest.SettledAll(t, a.st)[before:], key, keys, r); err != nil {
		t.Fatalf("batch %s (%s): %v", key, body, err)
	}
	if again := positionless(a.s.HandleBatch(ctx, body, 0)); !reflect.DeepEqual(again, asDuplicate(r)) {
		t.Fatalf("batch %s resent:\n got %+v\nwant %+v", key, again, asDuplicate(r))
	}
	if got, err := a.s.Lookup(ctx, key); err != nil || got == nil || !reflect.DeepEqual(positionless(*got), r) {
		t.Fatalf("batch %s looked up: found %v, %v:\n%+v", key, got != nil, err, got)
	}
	a.sent = append(a.sent, atomicSent{key, body, cmds, r})
}

// resend sends an earlier batch again: it answers its first reply, duplicate.
func (a *atomicRun) resend(b atomicSent) {
	if r := positionless(a.s.HandleBatch(context.Background(), b.body, 0)); !reflect.DeepEqual(r, asDuplicate(b.first)) {
		a.t.Fatalf("batch %s resent later:\n got %+v\nwant %+v", b.key, r, asDuplicate(b.first))
	}
}

// refunds is a batch (the n-th) of refunds: of 1-3 money commands that
// applied, in full or in part, and of a deposit, a transfer or a transaction
// of the batch itself, the refund after its original or, now and then, before.
func (a *atomicRun) refunds(rng *rand.Rand, n int) []batchCmd {
	var money []string
	for _, c := range a.history {
		if slices.Contains([]string{"deposit", "withdraw", "transfer", "post_transaction", "refund"}, c.typ) {
			money = append(money, c.body["idempotency_key"].(string))
		}
	}
	refund := func(i int, orig string) batchCmd {
		c := batchCmd{"refund", map[string]any{"idempotency_key": fmt.Sprintf("rf%d-%d", n, i), "original_key": orig}}
		if rng.Intn(2) == 0 {
			c.body["amount"] = 1 + rng.Intn(40)
		}
		return c
	}
	var out []batchCmd
	for i := 0; i < 1+rng.Intn(3) && len(money) > 0; i++ {
		out = append(out, refund(i, money[rng.Intn(len(money))]))
	}
	key := fmt.Sprintf("rf%d-orig", n)
	var orig batchCmd
	switch rng.Intn(3) {
	case 0:
		orig = batchCmd{"deposit", map[string]any{"idempotency_key": key, "account_id": "a1", "amount": 50, "currency": "EUR"}}
	case 1:
		orig = batchCmd{"transfer", map[string]any{"idempotency_key": key, "transfer_id": "t" + key, "from": "a0", "to": "a2", "amount": 5, "currency": "EUR"}}
	default:
		orig = batchCmd{"post_transaction", map[string]any{"idempotency_key": key, "transaction_id": "x" + key, "postings": []map[string]any{{"from": "a2", "to": "a1", "amount": 3, "currency": "EUR"}}}}
	}
	if rng.Intn(4) == 0 {
		return append(out, refund(9, key), orig)
	}
	return append(out, orig, refund(9, key), refund(10, key))
}

// applying is cmds without those that, sent alone after the commands of the
// batches applied so far and the ones of cmds it keeps, are not applied.
func (a *atomicRun) applying(cmds []batchCmd) []batchCmd {
	ref := newService(devtest.Memory(a.t))
	defer ref.Close()
	for _, c := range a.history {
		ref.HandleRaw(context.Background(), c.typ, c.alone())
	}
	var out []batchCmd
	for _, c := range cmds {
		if r := ref.HandleRaw(context.Background(), c.typ, c.alone()); r.Status == domain.StatusApplied {
			out = append(out, c)
		}
	}
	return out
}

// invalidElement is an element invalid by itself (malformed) or on the state
// it meets (an effective_at before its account's opening), under key inv<n>.
func invalidElement(rng *rand.Rand, n int) batchCmd {
	c := batchCmd{"deposit", map[string]any{"idempotency_key": fmt.Sprintf("inv%d", n), "account_id": "a0", "amount": 0, "currency": "EUR"}}
	if rng.Intn(2) == 0 {
		c.body["amount"], c.body["effective_at"] = 1, "2020-01-01T00:00:00Z"
	}
	return c
}

// TestAtomicBatchAllOrNothing (PROTOCOL.md v1.2 §2.2): random atomic batches
// (resent commands, keys reused for other requests, invalid commands,
// refusals, transfers, transactions, holds, refunds of every kind) on memory and PostgreSQL. Each
// applies exactly when its commands sent alone one after another would all
// apply, answering what they would answer; otherwise it is refused at the
// first that would not, and nothing of it is applied (checkAllOrNothing on
// what it wrote). Resent, at once or after later batches, it answers the same,
// duplicate (refused by an invalid element too); its key with another batch
// is a conflict; the keys of a refused batch's commands stay undecided. LEDGER_PROPERTY_SEED replays another seed.
func TestAtomicBatchAllOrNothing(t *testing.T) {
	seed := propertySeed(t, 20261127)
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		rng := rand.New(rand.NewSource(seed))
		cmds := randomBatchWorkload(rng, 140)
		a := &atomicRun{t: t, s: newService(st), st: st}
		defer a.s.Close()
		t.Logf("seed %d, %d commands", seed, len(cmds))
		a.send("b-open", cmds[:4])
		for i, n := 4, 0; i < len(cmds); n++ {
			switch x := rng.Intn(10); {
			case x == 0 && len(a.sent) > 0: // an earlier batch again
				a.resend(a.sent[rng.Intn(len(a.sent))])
				continue
			case x == 2: // refunds of what applied, and of what the batch itself moves
				batch := a.refunds(rng, n)
				if rng.Intn(2) == 0 {
					batch = a.applying(batch)
				}
				if len(batch) > 0 {
					a.send(fmt.Sprintf("b%d", n), batch)
				}
				continue
			case x == 3: // what applies of the next commands, then an invalid element
				a.send(fmt.Sprintf("b%d", n), append(a.applying(cmds[i:min(i+1+rng.Intn(4), len(cmds))]), invalidElement(rng, n)))
				continue
			case x == 1 && len(a.sent) > 0: // an earlier batch's key for other commands
				b := a.sent[rng.Intn(len(a.sent))]
				body := atomicBody(b.key, cmds[i:i+1])
				if bytes.Equal(body, b.body) { // the workload resends commands: this is the same batch again
					a.resend(b)
					continue
				}
				r := a.s.HandleBatch(context.Background(), body, 0)
				if r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, []string{"commands"}) {
					t.Fatalf("batch %s with other commands: %+v", b.key, r)
				}
				continue
			}
			size := min(1+rng.Intn(5), len(cmds)-i)
			batch := cmds[i : i+size]
			if rng.Intn(2) == 0 { // most random batches are refused: keep half of them to what applies
				batch = a.applying(batch)
			}
			if len(batch) > 0 {
				a.send(fmt.Sprintf("b%d", n), batch)
			}
			i += size
		}
		decided, refunds := map[string]bool{}, 0
		for _, c := range a.history {
			decided[c.body["idempotency_key"].(string)] = true
			if c.typ == "refund" {
				refunds++
			}
		}
		t.Logf("%d batches sent, %d commands applied in them, %d of them refunds; %d refused by an invalid element", len(a.sent), len(a.history), refunds, a.invalid)
		if a.invalid == 0 {
			t.Fatal("no batch was refused by an invalid element")
		}
		for _, b := range a.sent {
			for _, c := range b.cmds {
				k, _ := c.body["idempotency_key"].(string)
				if got, err := a.s.Lookup(context.Background(), k); err != nil || (got != nil) != decided[k] {
					t.Fatalf("key %q of batch %s: decided %v (%v), want %v", k, b.key, got != nil, err, decided[k])
				}
			}
		}
	})
}

// TestAtomicBatchInvalidElement (PROTOCOL.md v1.2 §2.2): a command invalid by
// itself, or on the state the elements before it leave (an effective_at
// before its account's opening, which an element before it opens), refuses
// the batch in its turn, and the refusal is recorded under the batch's key as
// a rejected one is: its decision alone, no element's key decided. Sent again
// after the state changed (the account it would open opened alone, from
// earlier: sent anew, the batch would now be refused at its first element),
// it answers its first reply, duplicate; the key answers it (query.command)
// and refuses another batch and a single command as a conflict.
func TestAtomicBatchInvalidElement(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		defer s.Close()
		ctx := context.Background()
		for i, c := range []struct {
			bad   batchCmd
			field string
		}{
			{batchCmd{"deposit", map[string]any{"idempotency_key": "x", "account_id": "a", "amount": 0, "currency": "EUR"}}, "amount"},
			{batchCmd{"deposit", map[string]any{"idempotency_key": "x", "account_id": "a", "amount": 1, "currency": "EUR", "effective_at": devtest.Epoch.Add(-time.Hour).Format(time.RFC3339)}}, "effective_at"},
		} {
			key, acc := fmt.Sprintf("b%d", i), fmt.Sprintf("a%d", i)
			open := batchCmd{"open_account", map[string]any{"idempotency_key": "o" + key, "account_id": acc, "currency": "EUR"}}
			dep := batchCmd{"deposit", map[string]any{"idempotency_key": "d" + key, "account_id": acc, "amount": 5, "currency": "EUR"}}
			c.bad.body["account_id"], c.bad.body["idempotency_key"] = acc, "x"+key
			body := atomicBody(key, []batchCmd{open, dep, c.bad})
			before := len(devtest.SettledAll(t, st))
			first := positionless(s.HandleBatch(ctx, body, 0))
			if first.Status != domain.StatusInvalid || first.Code != domain.CodeInvalidRequest || first.Index == nil || *first.Index != 2 || first.Duplicate ||
				!reflect.DeepEqual(first.Replies[2].Fields, []string{c.field}) || first.Replies[0].Code != domain.CodeLinkedEventFailed {
				t.Fatalf("%s: %+v", c.field, first)
			}
			if err := checkAllOrNothing(devtest.SettledAll(t, st)[before:], key, []string{"o" + key, "d" + key, "x" + key}, first); err != nil {
				t.Fatalf("%s: %v", c.field, err)
			}
			opened := fmt.Appendf(nil, `{"idempotency_key":"alone-%s","account_id":%q,"currency":"EUR","effective_at":%q}`, key, acc, devtest.Epoch.Add(-2*time.Hour).Format(time.RFC3339))
			if r := s.HandleRaw(ctx, "open_account", opened); r.Status != domain.StatusApplied {
				t.Fatalf("%s: %+v", c.field, r)
			}
			checkInvalidDecided(t, s, key, body, first)
		}
	})
}

// checkInvalidDecided: the atomic batch under key (body), first answered
// first (refused by an invalid element), answers it again, duplicate, and
// from its key (Lookup, what query.command answers); its elements' keys are
// undecided; the key refuses another batch and a single command.
func checkInvalidDecided(t *testing.T, s *Service, key string, body []byte, first Reply) {
	t.Helper()
	ctx := context.Background()
	if again := positionless(s.HandleBatch(ctx, body, 0)); !reflect.DeepEqual(again, asDuplicate(first)) {
		t.Fatalf("%s resent:\n got %+v\nwant %+v", key, again, asDuplicate(first))
	}
	if got, err := s.Lookup(ctx, key); err != nil || got == nil || !reflect.DeepEqual(positionless(*got), first) {
		t.Fatalf("%s looked up (%v): %+v", key, err, got)
	}
	for _, el := range first.Replies {
		if got, err := s.Lookup(ctx, el.IdempotencyKey); err != nil || got != nil {
			t.Fatalf("%s: its element's key %q is decided (%v): %+v", key, el.IdempotencyKey, err, got)
		}
	}
	other := atomicBody(key, []batchCmd{{"open_account", map[string]any{"idempotency_key": "other-" + key, "account_id": "other-" + key, "currency": "EUR"}}})
	if r := s.HandleBatch(ctx, other, 0); r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, []string{"commands"}) {
		t.Fatalf("%s, another batch: %+v", key, r)
	}
	alone := fmt.Appendf(nil, `{"idempotency_key":%q,"account_id":"other-%s","currency":"EUR"}`, key, key)
	if r := s.HandleRaw(ctx, "open_account", alone); r.Code != domain.CodeIdempotencyKeyConflict {
		t.Fatalf("%s, a single command: %+v", key, r)
	}
}

// TestAtomicBatchNeedsMultiAppend: where the store cannot append to several
// streams at once (KurrentDB, and the others with that hidden), an atomic
// batch is invalid naming atomic, and nothing is decided.
func TestAtomicBatchNeedsMultiAppend(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		defer s.Close()
		open := batchCmd{"open_account", map[string]any{"idempotency_key": "o", "account_id": "a", "currency": "EUR"}}
		r := s.HandleBatch(context.Background(), atomicBody("b", []batchCmd{open}), 0)
		if r.Status != domain.StatusInvalid || r.Code != domain.CodeInvalidRequest || !reflect.DeepEqual(r.Fields, []string{"atomic"}) {
			t.Fatalf("%+v", r)
		}
		if got, err := s.Lookup(context.Background(), "o"); err != nil || got != nil {
			t.Fatalf("the element was decided: %+v %v", got, err)
		}
	})
}

// TestAtomicBatchRace: two ledgers on one store race the same atomic batch,
// each sending it from several goroutines, while single commands race under
// its elements' keys: the batch is decided once (every answer the same but
// for duplicate), and it and the single commands never both decide a key.
// So is one refused by an invalid element, raced alone.
func TestAtomicBatchRace(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		a, b := newService(st), newService(st)
		defer a.Close()
		defer b.Close()
		ctx := context.Background()
		open := []batchCmd{
			{"open_account", map[string]any{"idempotency_key": "o1", "account_id": "a1", "currency": "EUR"}},
			{"open_account", map[string]any{"idempotency_key": "o2", "account_id": "a2", "currency": "EUR"}},
		}
		if r := a.HandleBatch(ctx, atomicBody("open", open), 0); r.Status != domain.StatusApplied {
			t.Fatalf("%+v", r)
		}
		for round := range 4 {
			cmds := []batchCmd{
				{"deposit", map[string]any{"idempotency_key": fmt.Sprintf("d%d", round), "account_id": "a1", "amount": 10, "currency": "EUR"}},
				{"transfer", map[string]any{"idempotency_key": fmt.Sprintf("t%d", round), "transfer_id": fmt.Sprintf("t%d", round), "from": "a1", "to": "a2", "amount": 10, "currency": "EUR"}},
			}
			body := atomicBody(fmt.Sprintf("race%d", round), cmds)
			replies := atOnce(6, func(i int) Reply {
				s := []*Service{a, b}[i%2]
				if i >= 4 { // a command of the batch's, alone
					c := cmds[i-4]
					return s.HandleRaw(ctx, c.typ, c.alone())
				}
				return s.HandleBatch(ctx, body, 0)
			})
			want := asDuplicate(decidedOnce(t, round, replies[:4]))
			if alone := replies[5]; alone.Status != domain.StatusApplied { // the transfer alone came first, before the deposit
				if want.Status != domain.StatusRejected || *want.Index != 1 || want.Code != alone.Code {
					t.Fatalf("round %d: the transfer alone refused (%+v), the batch: %+v", round, alone, want)
				}
			} else if want.Status != domain.StatusApplied {
				t.Fatalf("round %d: %+v", round, want)
			}
			checkKeysDecidedOnce(t, st, round)
		}
		// Refused by an invalid element, the batch is decided once too: its
		// decision alone is written.
		body := atomicBody("race-invalid", []batchCmd{
			{"open_account", map[string]any{"idempotency_key": "o3", "account_id": "a3", "currency": "EUR"}},
			{"deposit", map[string]any{"idempotency_key": "x3", "account_id": "a3", "amount": 1, "currency": "EUR", "effective_at": devtest.Epoch.Add(-time.Hour).Format(time.RFC3339)}},
		})
		before := len(devtest.SettledAll(t, st))
		replies := atOnce(6, func(i int) Reply { return []*Service{a, b}[i%2].HandleBatch(ctx, body, 0) })
		if first := decidedOnce(t, 4, replies); first.Status != domain.StatusInvalid || first.Index == nil || *first.Index != 1 {
			t.Fatalf("refused by an invalid element: %+v", first)
		}
		if evs := devtest.SettledAll(t, st)[before:]; len(evs) != 1 || evs[0].Stream != domain.KeyStream("race-invalid") || evs[0].Type != domain.EvBatchDecided {
			t.Fatalf("refused by an invalid element: %d events written, want the batch's one decision", len(evs))
		}
	})
}

// atOnce calls send(0), ..., send(n-1) each in a goroutine of its own and
// returns their replies.
func atOnce(n int, send func(i int) Reply) []Reply {
	replies := make([]Reply, n)
	var wg sync.WaitGroup
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = send(i)
		}()
	}
	wg.Wait()
	return replies
}

// decidedOnce: of replies, the answers of senders racing one atomic batch,
// none is an error, exactly one decided it (not a duplicate), and every other
// is that one's duplicate; it returns that one (positionless).
func decidedOnce(t *testing.T, round int, replies []Reply) Reply {
	t.Helper()
	first := -1
	for i, r := range replies {
		if r.Status == domain.StatusError {
			t.Fatalf("round %d, sender %d: %+v", round, i, r)
		}
		if !r.Duplicate {
			if first >= 0 {
				t.Fatalf("round %d: senders %d and %d both decided the batch", round, first, i)
			}
			first = i
		}
	}
	if first < 0 {
		t.Fatalf("round %d: no sender decided the batch: %+v", round, replies)
	}
	want := positionless(asDuplicate(replies[first]))
	for i, r := range replies {
		if i != first && !reflect.DeepEqual(positionless(r), want) {
			t.Fatalf("round %d, sender %d:\n got %+v\nwant %+v", round, i, positionless(r), want)
		}
	}
	return positionless(replies[first])
}

// checkKeysDecidedOnce: every event a client key wrote, a claim aside, is in
// the stream of its one claim (a key decided by two writers would have its
// events in two places, or twice).
func checkKeysDecidedOnce(t *testing.T, st eventstore.Store, round int) {
	t.Helper()
	seen := map[string]bool{}
	for _, ev := range devtest.ReadAll(t, st) {
		if strings.HasPrefix(ev.Stream, domain.KeyStreamPrefix) {
			continue
		}
		m, err := domain.DecodeMetadata(ev.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		if m.Origin != "" || m.Index != 0 || strings.Contains(m.Key, ":") {
			continue
		}
		id := m.Key + "@" + ev.Stream
		if seen[id] {
			t.Fatalf("round %d: key %q decided twice in %s", round, m.Key, ev.Stream)
		}
		seen[id] = true
	}
}

// TestAtomicBatchCrash: a ledger that crashes before its batch's append
// leaves nothing of it, and one that crashes after it leaves all of it; sent
// again (to another instance), the batch is decided once and answered.
func TestAtomicBatchCrash(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		cmds := []batchCmd{
			{"open_account", map[string]any{"idempotency_key": "o", "account_id": "a", "currency": "EUR"}},
			{"deposit", map[string]any{"idempotency_key": "d", "account_id": "a", "amount": 5, "currency": "EUR"}},
		}
		for _, step := range []string{"batch/decided", "batch/appended"} {
			r := crashThenResend(t, st, step, "crash-"+step, atomicBody("crash-"+step, cmds))
			if r.Status != domain.StatusApplied || r.Duplicate != (step == "batch/appended") {
				t.Fatalf("%s, sent again: %+v", step, r)
			}
			cmds = []batchCmd{{"deposit", map[string]any{"idempotency_key": "d2", "account_id": "a", "amount": 7, "currency": "EUR"}}}
			raw, _ := json.Marshal(r.Replies)
			t.Logf("%s: %s", step, raw)
		}
		checkKeysDecidedOnce(t, st, 0)
	})
}

// crashThenResend sends the atomic batch under key (body) to a ledger that
// crashes at step, checks that the batch is decided exactly when the step
// follows its append (batch/appended), and returns the reply of another
// ledger the batch is sent to again.
func crashThenResend(t *testing.T, st eventstore.Store, step, key string, body []byte) Reply {
	t.Helper()
	ctx := context.Background()
	crashed := newService(st)
	crashAt(crashed, step)
	if r := crashed.HandleBatch(ctx, body, 0); r.Status != domain.StatusError {
		t.Fatalf("%s: %+v", step, r)
	}
	crashed.Close()
	got, err := newService(st).Lookup(ctx, key)
	if err != nil || (got != nil) != (step == "batch/appended") {
		t.Fatalf("%s: the batch decided: %v %v", step, got != nil, err)
	}
	s := newService(st)
	defer s.Close()
	return s.HandleBatch(ctx, body, 0)
}

// TestAtomicBatchInvalidElementCrash: a ledger that crashes after deciding
// an atomic batch refused by an invalid element and before its append leaves
// nothing of it (sent again, decided then), and one that crashes after the
// append leaves its decision (sent again, answered duplicate): either way
// decided once, its decision alone in the store.
func TestAtomicBatchInvalidElementCrash(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		for _, step := range []string{"batch/decided", "batch/appended"} {
			key := "crash-" + step
			body := atomicBody(key, []batchCmd{
				{"open_account", map[string]any{"idempotency_key": "o-" + step, "account_id": "a", "currency": "EUR"}},
				{"deposit", map[string]any{"idempotency_key": "x-" + step, "account_id": "a", "amount": 0, "currency": "EUR"}},
			})
			r := crashThenResend(t, st, step, key, body)
			if r.Status != domain.StatusInvalid || r.Index == nil || *r.Index != 1 || r.Duplicate != (step == "batch/appended") {
				t.Fatalf("%s, sent again: %+v", step, r)
			}
			var decisions int
			for _, ev := range devtest.SettledAll(t, st) {
				if ev.Stream == domain.KeyStream(key) {
					decisions++
				}
			}
			if decisions != 1 {
				t.Fatalf("%s: %d events in the batch's key stream, want its one decision", step, decisions)
			}
		}
	})
}

// TestAtomicBatchAmidHotPipelines: atomic batches on an account whose single
// commands pipeline (decided on its pending state, committed in groups) while
// they run: no command ends without a definite answer, the balances are what
// the applied answers add up to, and the store's history passes the audit.
func TestAtomicBatchAmidHotPipelines(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		defer s.Close()
		ctx := context.Background()
		for _, id := range []string{"h", "x"} {
			if r := s.HandleRaw(ctx, "open_account", fmt.Appendf(nil, `{"idempotency_key":"o-%s","account_id":"%s","currency":"EUR"}`, id, id)); r.Status != domain.StatusApplied {
				t.Fatalf("%+v", r)
			}
		}
		const rounds = 15
		var mu sync.Mutex
		var h, x int64
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					r := s.HandleRaw(ctx, "deposit", fmt.Appendf(nil, `{"idempotency_key":"d-%d-%d","account_id":"h","amount":3,"currency":"EUR"}`, g, i))
					if r.Status != domain.StatusApplied {
						t.Errorf("deposit: %+v", r)
						return
					}
					mu.Lock()
					h += 3
					mu.Unlock()
				}
			}()
		}
		for g := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					key := fmt.Sprintf("%d-%d", g, i)
					r := s.HandleBatch(ctx, atomicBody("b-"+key, []batchCmd{
						{"withdraw", map[string]any{"idempotency_key": "w-" + key, "account_id": "h", "amount": 4, "currency": "EUR"}},
						{"transfer", map[string]any{"idempotency_key": "t-" + key, "transfer_id": "t-" + key, "from": "h", "to": "x", "amount": 2, "currency": "EUR"}},
					}), 0)
					switch r.Status {
					case domain.StatusApplied:
						mu.Lock()
						h, x = h-6, x+2
						mu.Unlock()
					case domain.StatusRejected: // h had too little: nothing moved
					default:
						t.Errorf("batch %s: %+v", key, r)
						return
					}
				}
			}()
		}
		wg.Wait()
		a := audit(t, st, true)
		if a.balance("h") != h || a.balance("x") != x {
			t.Fatalf("balances h %d x %d, the answers add up to %d and %d", a.balance("h"), a.balance("x"), h, x)
		}
		if acc, err := s.loadAccount(ctx, "account-h", "h", true); err != nil || acc.Balance != h {
			t.Fatalf("the ledger's h: %v %v, want %d", acc, err, h)
		}
	})
}

// TestAtomicBatchConditions (v1.2 §2.3 inside §2.2): an element's
// expected_revision is the revision the elements before it left, and up_to
// moves what they left available; a mismatch refuses the batch.
func TestAtomicBatchConditions(t *testing.T) {
	s := newService(devtest.Memory(t))
	defer s.Close()
	ctx := context.Background()
	if r := s.HandleRaw(ctx, "open_account", []byte(`{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)); r.Status != domain.StatusApplied {
		t.Fatalf("%+v", r)
	}
	cmds := []batchCmd{
		{"deposit", map[string]any{"idempotency_key": "d", "account_id": "a", "amount": 10, "currency": "EUR", "expected_revision": 0}},
		{"withdraw", map[string]any{"idempotency_key": "w", "account_id": "a", "amount": 100, "currency": "EUR", "up_to": true}},
		{"deposit", map[string]any{"idempotency_key": "d2", "account_id": "a", "amount": 1, "currency": "EUR", "expected_revision": 1}},
	}
	if r := s.HandleBatch(ctx, atomicBody("b1", cmds), 0); r.Status != domain.StatusRejected || r.Code != domain.CodeRevisionMismatch || *r.Index != 2 {
		t.Fatalf("a stale expected_revision: %+v", r)
	}
	r := s.HandleBatch(ctx, atomicBody("b2", cmds[:2]), 0)
	if r.Status != domain.StatusApplied || r.Replies[1].Moved == nil || *r.Replies[1].Moved != 10 || r.Replies[1].Account.Balance != 0 {
		t.Fatalf("applied: %+v %+v", r, r.Replies[1])
	}
}

// TestAtomicBatchRefunds (PROTOCOL.md v1.2 §2.2: every command of §2 is an
// element): refunds of deposits, transfers and transactions, their originals
// decided before the batch or by an element before them, each answering what
// it answers sent alone after the ones before it (atomicRun.send: the store's
// side, the resend and the lookup too); a refund that may not be made refuses
// the batch, and one whose original does not exist yet refuses it forever,
// even once the original is decided.
func TestAtomicBatchRefunds(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		a := &atomicRun{t: t, s: newService(st), st: st}
		defer a.s.Close()
		cmd := func(typ string, kv ...any) batchCmd {
			c := batchCmd{typ, map[string]any{}}
			for i := 0; i < len(kv); i += 2 {
				c.body[kv[i].(string)] = kv[i+1]
			}
			return c
		}
		refund := func(key, orig string, amount ...int) batchCmd {
			c := cmd("refund", "idempotency_key", key, "original_key", orig)
			if len(amount) > 0 {
				c.body["amount"] = amount[0]
			}
			return c
		}
		posting := func(from, to string, amount int) map[string]any {
			return map[string]any{"from": from, "to": to, "amount": amount, "currency": "EUR"}
		}
		steps := []struct {
			key  string
			cmds []batchCmd
			want string // the batch's code
		}{
			{"b-deposit", []batchCmd{
				cmd("open_account", "idempotency_key", "oa", "account_id", "a", "currency", "EUR"),
				cmd("open_account", "idempotency_key", "ob", "account_id", "b", "currency", "EUR"),
				cmd("deposit", "idempotency_key", "d1", "account_id", "a", "amount", 100, "currency", "EUR"),
				refund("r1", "d1", 30)}, "ok"},
			{"b-transfer", []batchCmd{
				cmd("transfer", "idempotency_key", "tk", "transfer_id", "t1", "from", "a", "to", "b", "amount", 40, "currency", "EUR"),
				refund("rt1", "tk", 10), refund("rt2", "tk")}, "ok"},
			{"b-tx-refused", []batchCmd{
				cmd("post_transaction", "idempotency_key", "xk", "transaction_id", "x1", "postings", []map[string]any{posting("a", "b", 5), posting("b", "a", 2)}),
				refund("rx1", "xk"), refund("rx2", "rx1")}, "not_refundable"},
			{"b-tx", []batchCmd{
				cmd("post_transaction", "idempotency_key", "xk", "transaction_id", "x1", "postings", []map[string]any{posting("a", "b", 5), posting("b", "a", 2)}),
				refund("rx1", "xk")}, "ok"},
			{"b-tx-one", []batchCmd{cmd("post_transaction", "idempotency_key", "xs", "transaction_id", "x2", "postings", []map[string]any{posting("a", "b", 10)})}, "ok"},
			{"b-tx-slots", []batchCmd{refund("rs1", "xs", 4), refund("rs2", "xs", 6)}, "ok"},
			{"b-tx-exceeds", []batchCmd{refund("rs3", "xs", 1)}, "refund_exceeds_original"},
			{"b-stored", []batchCmd{refund("rd", "d1", 70), refund("rt3", "tk", 1)}, "refund_exceeds_original"},
			{"b-stored-ok", []batchCmd{refund("rd", "d1", 70), refund("rt3", "rt1")}, "not_refundable"},
			{"b-missing", []batchCmd{refund("rm", "later"), cmd("deposit", "idempotency_key", "later", "account_id", "a", "amount", 5, "currency", "EUR")}, "original_not_found"},
		}
		for _, s := range steps {
			a.send(s.key, s.cmds)
			if r := a.sent[len(a.sent)-1].first; string(r.Code) != s.want {
				t.Fatalf("batch %s: %s, want %s: %+v", s.key, r.Code, s.want, r)
			}
		}
		// A batch's key names no refundable command (the reference ledger of
		// send knows no batches: compared here with the refund sent alone).
		alone := post(t, a.s, "refund", `{"idempotency_key":"rb-alone","original_key":"b-deposit"}`)
		if r := a.s.HandleBatch(context.Background(), atomicBody("b-batch-key", []batchCmd{refund("rb", "b-deposit")}), 0); r.Code != domain.CodeNotRefundable || alone.Code != r.Code {
			t.Fatalf("a refund of a batch's key: %+v, alone %+v", r, alone)
		}
		later := cmd("deposit", "idempotency_key", "later", "account_id", "a", "amount", 5, "currency", "EUR")
		mustApply(t, a.s, later.typ, string(later.alone()))
		a.history = append(a.history, later)
		b := a.sent[len(a.sent)-1]
		if r := positionless(a.s.HandleBatch(context.Background(), b.body, 0)); !reflect.DeepEqual(r, asDuplicate(b.first)) {
			t.Fatalf("refused for a missing original, resent once it exists:\n got %+v\nwant %+v", r, asDuplicate(b.first))
		}
		a.send("b-found", []batchCmd{refund("rm2", "later")})
		if r := a.sent[len(a.sent)-1].first; r.Status != domain.StatusApplied {
			t.Fatalf("a refund of an original decided since: %+v", r)
		}
	})
}

// TestAtomicBatchKeepsCacheWarm: an applied atomic batch leaves the aggregates
// it wrote cached at the store's head (batchDecision.settle), and what they
// answer is what the store answers: each element's key, resent alone, gets
// from the warm ledger the reply a ledger that reads the store gets, global
// positions included; the commands that follow decide on the batch's
// balances. A refused batch leaves nothing of its elements in the cache.
func TestAtomicBatchKeepsCacheWarm(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		ctx := context.Background()
		s := newService(st)
		defer s.Close()
		mustApply(t, s, "open_account", `{"idempotency_key":"oa","account_id":"a","currency":"EUR"}`)
		mustApply(t, s, "open_account", `{"idempotency_key":"ob","account_id":"b","currency":"EUR"}`)
		cmds := []batchCmd{
			{"deposit", map[string]any{"idempotency_key": "d", "account_id": "a", "amount": 10, "currency": "EUR"}},
			{"transfer", map[string]any{"idempotency_key": "t", "transfer_id": "t1", "from": "a", "to": "b", "amount": 4, "currency": "EUR"}},
			{"withdraw", map[string]any{"idempotency_key": "w", "account_id": "b", "amount": 1, "currency": "EUR"}},
			{"refund", map[string]any{"idempotency_key": "r", "original_key": "d", "amount": 2}},
		}
		before := cachedAccounts(s, "a", "b")
		if r := s.HandleBatch(ctx, atomicBody("b1", cmds), 0); r.Status != domain.StatusApplied {
			t.Fatalf("%+v", r)
		}
		if after := cachedAccounts(s, "a", "b"); after[0] != before[0] || after[1] != before[1] {
			t.Fatalf("the batch's accounts were dropped and loaded again (cached %p, were %p)", after, before)
		}
		checkCached(t, s, st, "a", "b")
		cold := newService(st)
		defer cold.Close()
		for _, c := range cmds {
			if warm, want := s.HandleRaw(ctx, c.typ, c.alone()), cold.HandleRaw(ctx, c.typ, c.alone()); !warm.Duplicate || !reflect.DeepEqual(warm, want) {
				t.Fatalf("%s resent to the warm ledger:\n got %+v\nwant %+v", c.typ, warm, want)
			}
		}
		if r := post(t, s, "withdraw", `{"idempotency_key":"w2","account_id":"a","amount":5,"currency":"EUR"}`); r.Code != domain.CodeInsufficientFunds {
			t.Fatalf("a withdrawal over the 4 the batch left: %+v", r)
		}
		refused := []batchCmd{
			{"deposit", map[string]any{"idempotency_key": "d2", "account_id": "a", "amount": 7, "currency": "EUR"}},
			{"withdraw", map[string]any{"idempotency_key": "w3", "account_id": "b", "amount": 100, "currency": "EUR"}},
		}
		if r := s.HandleBatch(ctx, atomicBody("b2", refused), 0); r.Code != domain.CodeInsufficientFunds {
			t.Fatalf("%+v", r)
		}
		checkCached(t, s, st, "a", "b")
		if r := mustApply(t, s, "withdraw", `{"idempotency_key":"w4","account_id":"a","amount":4,"currency":"EUR"}`); r.Account.Balance != 0 {
			t.Fatalf("after a refused batch, the 4 left: %+v", r.Account)
		}
	})
}

// cachedAccounts are the aggregates cached for ids (nil where none is).
func cachedAccounts(s *Service, ids ...string) []*domain.Account {
	out := make([]*domain.Account, len(ids))
	for i, id := range ids {
		out[i], _ = s.accounts.c.Peek(domain.AccountStream(id))
	}
	return out
}

// checkCached: each account of ids that is cached is at its stream's head in
// the store.
func checkCached(t *testing.T, s *Service, st eventstore.Store, ids ...string) {
	t.Helper()
	for i, acc := range cachedAccounts(s, ids...) {
		stream := domain.AccountStream(ids[i])
		evs, err := st.ReadStream(context.Background(), stream, eventstore.EndOfStream, eventstore.Backwards, 1)
		if err != nil || len(evs) != 1 {
			t.Fatalf("%s: %v", stream, err)
		}
		if acc != nil && acc.Revision != int64(evs[0].Revision) {
			t.Fatalf("%s: cached at revision %d, the store's head is %d", stream, acc.Revision, evs[0].Revision)
		}
	}
}

// TestAtomicBatchKeyRepeatedOnAnotherAccount (PROTOCOL.md v1.2 §2.2): in an
// atomic batch, an element with the key of an earlier element and another
// request (the same deposit on another account) is refused as alone after it,
// idempotency_key_conflict, and refuses the batch at its index, deciding none
// of its keys; the same request again is a duplicate and counts as applied.
func TestAtomicBatchKeyRepeatedOnAnotherAccount(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		defer s.Close()
		ctx := context.Background()
		deposit := func(key, account string) batchCmd { return eurDeposit(key, account, 5) }
		s.HandleBatch(ctx, batchBody([]batchCmd{openEUR("a"), openEUR("b")}), 0)
		r := s.HandleBatch(ctx, atomicBody("ab1", []batchCmd{deposit("K", "a"), deposit("K", "b")}), 0)
		if r.Status != domain.StatusInvalid || r.Code != domain.CodeIdempotencyKeyConflict || r.Index == nil || *r.Index != 1 ||
			r.Replies[0].Code != domain.CodeLinkedEventFailed || r.Replies[1].Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("key K on a then on b: %+v", r)
		}
		if alone := s.HandleRaw(ctx, "deposit", deposit("K", "a").alone()); alone.Status != domain.StatusApplied || alone.Duplicate {
			t.Fatalf("K alone after the refused batch: %+v", alone)
		}
		r = s.HandleBatch(ctx, atomicBody("ab2", []batchCmd{deposit("K2", "b"), deposit("K2", "b")}), 0)
		if r.Status != domain.StatusApplied || r.Replies[0].Duplicate || !r.Replies[1].Duplicate || r.Replies[1].Status != domain.StatusApplied {
			t.Fatalf("key K2 twice, the same request: %+v", r)
		}
	})
}
