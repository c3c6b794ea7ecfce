package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// account of the workload.
type account struct {
	id, currency string
}

// workload is a seeded bank workload: deposits, withdrawals, transfers,
// transactions (a payment with its fee leg) and refunds on a few hot accounts,
// with exact resends (some concurrent) and key reuse.
type workload struct {
	prefix    string
	accounts  []account
	producers int
	commands  int     // in total, over all producers
	resend    float64 // share of commands resent with the same key and body
	reuse     float64 // share of commands that reuse an acked key with another payload
	jetstream float64 // share sent with js.Publish instead of a request
	// batch is the share of the producers' steps that send a batch (not
	// atomic) of 2-8 new commands instead of one, sometimes with an element
	// repeating an earlier acknowledged key (the same body or another), and
	// sometimes resent whole.
	batch float64
	// atomic is the share of those batches (sent by request-reply) that are
	// atomic, under a key of their own: all of it or none of it.
	atomic float64
	// invalid is the share of the atomic batches that carry one invalid
	// element besides their commands (invalidElement): PROTOCOL.md v1.2 §2.2
	// records such a batch refused under its key, as a rejected one.
	invalid float64
	retries int // attempts per command while the outcome is indefinite
	pace    time.Duration
	seed    uint64
	// hot is the share of commands on the first account (a merchant's or a fee
	// account: most commands pipeline on it, issue 12).
	hot float64
	// backdated is the share of deposits booked late (v1.2 §2.3): effective
	// at a random earlier instant since the accounts' effective opening,
	// backdatedFrom, at which every account then opens.
	backdated float64
	// until, when set, keeps the producers going past their share until it closes.
	until <-chan struct{}
	// revision is an account's revision as the replies so far showed it (the
	// client's History.Revision): a conditional write expects it (v1.2 §2.3).
	revision func(account string) uint64
	// holds are the holds each producer placed and has not captured yet:
	// producer -> heldRef. Its next authorisation command captures it.
	holds sync.Map
	// refundable is each producer's last deposit, withdrawal or transfer with
	// a definite reply (applied or recorded rejected, so a refund of it is
	// decided the same whenever it runs): producer -> sentCmd. Its next refund
	// reverses it.
	refundable sync.Map
	// firstPublished and firstAtomic are set by the first batch any producer
	// sends through JetStream and the first atomic one: that first batch
	// goes that way whatever its draw says, so a run that stops at its share
	// is never vacuous by chance (C8 fails one that sent none: a scenario of
	// 300 commands drew no published batch for about 0.24% of seeds).
	firstPublished, firstAtomic atomic.Bool
	// firstInvalid is set by the first atomic batch with an invalid element,
	// which carries one whatever its draw says (as firstAtomic); invalidSent
	// counts the atomic batches sent with one (C8 fails a run of share
	// invalid that sent none).
	firstInvalid atomic.Bool
	invalidSent  atomic.Int64
}

// ack appends cmd, which got a definite reply, to producer p's acknowledged
// commands, and keeps it as p's next refund's original when it can be one.
func (w *workload) ack(p int, acked []sentCmd, cmd sentCmd) []sentCmd {
	switch cmd.typ {
	case "deposit", "withdraw", "transfer":
		w.refundable.Store(p, cmd)
	}
	return append(acked, cmd)
}

// heldRef is a hold a producer placed: captured later into account to.
type heldRef struct{ account, id, to string }

func hotAccounts(prefix string, n int) []account {
	out := make([]account, n)
	for i := range out {
		cur := "EUR"
		if i%5 == 4 {
			cur = "USD"
		}
		out[i] = account{id: fmt.Sprintf("%s-acc-%02d", prefix, i), currency: cur}
	}
	return out
}

type sentCmd struct {
	key, typ string
	fields   map[string]any
}

// openers is how many accounts a workload opens at once.
const openers = 8

// open opens the accounts and gives each a starting balance (settled,
// bounded), openers at a time: scenario 1 opens thousands.
func (w *workload) open(ctx context.Context, c *client) error {
	errs := make([]error, openers)
	var wg sync.WaitGroup
	for g := range openers {
		wg.Add(1)
		go func() { // opener g opens every openers-th account from the g-th
			defer wg.Done()
			for i := g; i < len(w.accounts) && errs[g] == nil && ctx.Err() == nil; i += openers {
				errs[g] = w.openOne(ctx, c, w.accounts[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

// openOne opens a and gives it its starting balance.
func (w *workload) openOne(ctx context.Context, c *client, a account) error {
	key := "open-" + a.id
	fields := map[string]any{"account_id": a.id, "currency": a.currency}
	if w.backdated > 0 {
		fields["effective_at"] = backdatedFrom.Format(time.RFC3339)
	}
	if r := c.settle(ctx, key, "open_account", body(key, fields), 20); r.Outcome != OK {
		return fmt.Errorf("open %s: %s %s", a.id, r.Outcome, r.Err)
	}
	key = "seed-" + a.id
	if r := c.settle(ctx, key, "deposit", body(key, map[string]any{"account_id": a.id, "amount": 5000, "currency": a.currency}), 20); r.Outcome != OK {
		return fmt.Errorf("seed %s: %s %s", a.id, r.Outcome, r.Err)
	}
	return nil
}

// run runs the producers until each sent its share (or ctx ends).
func (w *workload) run(ctx context.Context, c *client) {
	var js nats.JetStreamContext
	if w.jetstream > 0 {
		js, _ = c.nc.JetStream()
	}
	if w.revision == nil {
		w.revision = c.h.Revision
	}
	var wg sync.WaitGroup
	per := w.commands / w.producers
	for p := 0; p < w.producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			pr := &producer{w: w, c: c, js: js, p: p, per: per, rng: rand.New(rand.NewPCG(w.seed, uint64(p)+1))}
			pr.produce(ctx)
		}(p)
	}
	wg.Wait()
}

// producer is one of a workload's producers: its share (per), its own rng and
// the commands acknowledged to it.
type producer struct {
	w     *workload
	c     *client
	js    nats.JetStreamContext // nil without JetStream
	p     int
	per   int
	rng   *rand.Rand
	acked []sentCmd
}

// produce sends the producer's commands, each a batch, a JetStream publish,
// a resend, a reused key or a plain command as the workload's ratios draw.
func (pr *producer) produce(ctx context.Context) {
	w, c, rng := pr.w, pr.c, pr.rng
	for i := 0; pr.more(ctx, i); i++ {
		if w.batch > 0 && rng.Float64() < w.batch {
			i = w.sendSomeBatch(ctx, c, pr.js, rng, pr.p, i, &pr.acked)
			continue
		}
		cmd := w.next(rng, pr.p, i)
		b := body(cmd.key, cmd.fields)
		if pr.js != nil && rng.Float64() < w.jetstream {
			pctx, cancel := context.WithTimeout(ctx, c.timeout)
			c.publish(pctx, pr.js, cmd.key, cmd.typ, b)
			cancel()
			continue
		}
		pr.send(ctx, cmd, b)
		if w.pace > 0 {
			time.Sleep(w.pace)
		}
	}
}

// more says whether command i is due: within the share, or until w.until
// closes when the workload has one; never once ctx ended.
func (pr *producer) more(ctx context.Context, i int) bool {
	if ctx.Err() != nil {
		return false
	}
	if i < pr.per {
		return true
	}
	if pr.w.until == nil {
		return false
	}
	select {
	case <-pr.w.until:
		return false
	default:
		return true
	}
}

// send sends cmd (body b) by request-reply: resent concurrently or after its
// answer, its key reused by an earlier command's, or once.
func (pr *producer) send(ctx context.Context, cmd sentCmd, b []byte) {
	w, c, rng := pr.w, pr.c, pr.rng
	x := rng.Float64()
	switch {
	case x < w.resend/2: // concurrent exact resend
		var inner sync.WaitGroup
		inner.Add(1)
		go func() { defer inner.Done(); c.settle(ctx, cmd.key, cmd.typ, b, w.retries) }()
		a := c.settle(ctx, cmd.key, cmd.typ, b, w.retries)
		inner.Wait()
		if a.Outcome == OK {
			pr.acked = w.ack(pr.p, pr.acked, cmd)
		}
	case x < w.resend: // sequential exact resend
		a := c.settle(ctx, cmd.key, cmd.typ, b, w.retries)
		c.settle(ctx, cmd.key, cmd.typ, b, w.retries)
		if a.Outcome == OK {
			pr.acked = w.ack(pr.p, pr.acked, cmd)
		}
	case x < w.resend+w.reuse && len(pr.acked) > 0: // key reuse with another payload
		old := pr.acked[rng.IntN(len(pr.acked))]
		c.send(ctx, old.key, old.typ, reused(rng, old))
	default:
		if a := c.settle(ctx, cmd.key, cmd.typ, b, w.retries); a.Outcome == OK {
			pr.acked = w.ack(pr.p, pr.acked, cmd)
		}
	}
}

// reused is the body of an acknowledged command with another payload: its key
// reused for another request, which the ledger must refuse as a conflict.
func reused(rng *rand.Rand, old sentCmd) []byte {
	f := map[string]any{}
	for k, v := range old.fields {
		f[k] = v
	}
	if amount, ok := f["amount"].(int); ok {
		f["amount"] = amount + 1 + rng.IntN(50)
	} else { // a transaction: other metadata makes it another request
		f["metadata"] = map[string]string{"reuse": strconv.Itoa(rng.IntN(1000))}
	}
	return body(old.key, f)
}

// batchOf is producer p's commands i, i+1, ... (2-8 of them) as batch elements.
func (w *workload) batchOf(rng *rand.Rand, p, i int) ([]sentCmd, []element) {
	n := 2 + rng.IntN(7)
	var elems []element
	var cmds []sentCmd
	for j := 0; j < n; j++ {
		cmd := w.next(rng, p, i+j)
		cmds = append(cmds, cmd)
		elems = append(elems, element{cmd.key, cmd.typ, body(cmd.key, cmd.fields)})
	}
	return cmds, elems
}

// sendSomeBatch sends producer p's commands from i as one batch: published
// through JetStream (a share w.jetstream of them, and the workload's first
// when it publishes at all), or by request-reply, atomic (a share w.atomic,
// and the first of those when it sends any) or not. It returns the last index
// sent.
func (w *workload) sendSomeBatch(ctx context.Context, c *client, js nats.JetStreamContext, rng *rand.Rand, p, i int, acked *[]sentCmd) int {
	if js != nil && w.jetstream > 0 && (rng.Float64() < w.jetstream || w.firstPublished.CompareAndSwap(false, true)) {
		w.firstPublished.Store(true)
		return w.publishBatch(ctx, c, js, rng, p, i)
	}
	if w.atomic > 0 && (rng.Float64() < w.atomic || w.firstAtomic.CompareAndSwap(false, true)) {
		w.firstAtomic.Store(true)
		return w.sendAtomic(ctx, c, rng, p, i, acked)
	}
	return w.sendBatch(ctx, c, rng, p, i, acked)
}

// publishBatch publishes producer p's commands i, i+1, ... as one batch
// through JetStream and returns the index of its last command.
func (w *workload) publishBatch(ctx context.Context, c *client, js nats.JetStreamContext, rng *rand.Rand, p, i int) int {
	_, elems := w.batchOf(rng, p, i)
	pctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	c.publishBatch(pctx, js, elems)
	return i + len(elems) - 1
}

// sendBatch sends producer p's commands i, i+1, ... as one batch that is not
// atomic, and returns the index of its last new command. With the share
// resend+reuse, one more element repeats an earlier acknowledged key: the same
// body (a duplicate) or, with the share reuse, another body (a conflict). With
// the share resend, the whole batch is sent again.
func (w *workload) sendBatch(ctx context.Context, c *client, rng *rand.Rand, p, i int, acked *[]sentCmd) int {
	cmds, elems := w.batchOf(rng, p, i)
	n := len(cmds)
	if x := rng.Float64(); x < w.resend+w.reuse && len(*acked) > 0 {
		old := (*acked)[rng.IntN(len(*acked))]
		e := element{old.key, old.typ, body(old.key, old.fields)}
		if x < w.reuse {
			e.body = reused(rng, old)
		}
		at := rng.IntN(len(elems) + 1)
		elems = append(elems[:at], append([]element{e}, elems[at:]...)...)
	}
	d := time.Duration(max(1, w.retries)) * c.timeout
	got := c.batch(ctx, elems, d)
	if rng.Float64() < w.resend {
		c.batch(ctx, elems, d)
	}
	for _, cmd := range cmds {
		for _, a := range got {
			if a.Key == cmd.key && a.Outcome == OK {
				*acked = w.ack(p, *acked, cmd)
			}
		}
	}
	return i + n - 1
}

// unconditional drops expected_revision from an atomic batch's commands: the
// revision the replies showed is stale more often than not, and one stale
// element refuses the batch whole (sweeps stay: they refuse only an empty
// account).
func unconditional(cmds []sentCmd, elems []element) {
	for j, cmd := range cmds {
		if _, ok := cmd.fields["expected_revision"]; ok {
			delete(cmd.fields, "expected_revision")
			elems[j].body = body(cmd.key, cmd.fields)
		}
	}
}

// sendAtomic sends producer p's commands i, i+1, ... as one atomic batch
// under a key of its own (client.atomicBatch), resent whole with the same key
// in the share resend (a duplicate), and returns the index of its last
// command.
func (w *workload) sendAtomic(ctx context.Context, c *client, rng *rand.Rand, p, i int, acked *[]sentCmd) int {
	cmds, elems := w.batchOf(rng, p, i)
	unconditional(cmds, elems)
	key := fmt.Sprintf("%s-p%d-%05d-atomic", w.prefix, p, i)
	elems = w.invalidElement(rng, key, elems)
	d := time.Duration(max(1, w.retries)) * c.timeout
	got := c.atomicBatch(ctx, key, elems, d)
	if rng.Float64() < w.resend {
		c.atomicBatch(ctx, key, elems, d)
	}
	for _, a := range got {
		if a.Outcome == OK {
			for _, cmd := range cmds {
				if cmd.key == a.Key {
					*acked = w.ack(p, *acked, cmd)
				}
			}
		}
	}
	return i + len(cmds) - 1
}

// invalidElement inserts, in a share w.invalid of atomic batches (and the
// first when the share is set), one invalid element at a random place among
// elems: a deposit of nothing (malformed), or one effective before every
// account's opening (invalid on the state the elements before it leave). The
// batch is refused at it unless an element before it refuses first; its key
// (the batch's key and "-invalid") is never decided.
func (w *workload) invalidElement(rng *rand.Rand, key string, elems []element) []element {
	if w.invalid <= 0 || (rng.Float64() >= w.invalid && !w.firstInvalid.CompareAndSwap(false, true)) {
		return elems
	}
	w.firstInvalid.Store(true)
	w.invalidSent.Add(1)
	a := w.accounts[rng.IntN(len(w.accounts))]
	k := key + "-invalid"
	f := map[string]any{"account_id": a.id, "amount": 0, "currency": a.currency}
	if rng.IntN(2) == 0 {
		f["amount"] = 1 + rng.IntN(100)
		f["effective_at"] = beforeOpening.Format(time.RFC3339Nano)
	}
	at := rng.IntN(len(elems) + 1)
	return slices.Insert(elems, at, element{k, "deposit", body(k, f)})
}

// beforeOpening is before every account's opening (backdatedFrom, or when
// the workload opened them).
var beforeOpening = backdatedFrom.AddDate(-1, 0, 0)

// peer is another account of a's currency, when one is found in a few tries.
func (w *workload) peer(rng *rand.Rand, a account) account {
	b := w.accounts[rng.IntN(len(w.accounts))]
	for tries := 0; tries < 10 && (b.currency != a.currency || b.id == a.id); tries++ {
		b = w.accounts[rng.IntN(len(w.accounts))]
	}
	return b
}

func (w *workload) next(rng *rand.Rand, p, i int) sentCmd {
	key := fmt.Sprintf("%s-p%d-%05d", w.prefix, p, i)
	a := w.accounts[rng.IntN(len(w.accounts))]
	if w.hot > 0 && rng.Float64() < w.hot {
		a = w.accounts[0]
	}
	x := rng.Float64()
	if x < 0.06 { // a refund of producer p's last acknowledged money command
		if cmd, ok := w.refund(rng, p, key); ok {
			return cmd
		}
	}
	switch {
	case x < 0.35:
		return w.backdate(rng, w.conditional(rng, sentCmd{key, "deposit", map[string]any{"account_id": a.id, "amount": 1 + rng.IntN(1000), "currency": a.currency}}))
	case x < 0.55:
		return w.conditional(rng, sentCmd{key, "withdraw", map[string]any{"account_id": a.id, "amount": 1 + rng.IntN(1500), "currency": a.currency}})
	case x < 0.67: // authorise, then capture into a merchant's account (v1.1)
		if h, ok := w.holds.LoadAndDelete(p); ok {
			ref := h.(heldRef)
			return sentCmd{key, "capture_hold", map[string]any{"account_id": ref.account, "hold_id": ref.id, "to": ref.to}}
		}
		b := w.peer(rng, a)
		if b.id == a.id || b.currency != a.currency {
			return sentCmd{key, "deposit", map[string]any{"account_id": a.id, "amount": 1 + rng.IntN(1000), "currency": a.currency}}
		}
		w.holds.Store(p, heldRef{account: a.id, id: "h-" + key, to: b.id})
		return sentCmd{key, "place_hold", map[string]any{"account_id": a.id, "hold_id": "h-" + key, "amount": 1 + rng.IntN(600), "currency": a.currency}}
	case x < 0.78: // a payment with its fee leg, all or nothing
		b, c := w.peer(rng, a), w.peer(rng, a)
		if b.id == a.id || c.id == b.id || b.currency != a.currency || c.currency != a.currency {
			return sentCmd{key, "deposit", map[string]any{"account_id": a.id, "amount": 1 + rng.IntN(1000), "currency": a.currency}}
		}
		amount := 1 + rng.IntN(1200)
		return sentCmd{key, "post_transaction", map[string]any{"transaction_id": "x-" + key, "postings": []any{
			map[string]any{"from": a.id, "to": b.id, "amount": amount, "currency": a.currency},
			map[string]any{"from": b.id, "to": c.id, "amount": 1 + amount/50, "currency": a.currency},
		}}}
	default:
		b := w.peer(rng, a)
		return w.conditional(rng, sentCmd{key, "transfer", map[string]any{"transfer_id": "t-" + key, "from": a.id, "to": b.id, "amount": 1 + rng.IntN(1200), "currency": a.currency}})
	}
}

// backdatedFrom is when the accounts of a workload with backdated deposits
// opened in the world.
var backdatedFrom = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// backdate books a share (w.backdated) of deposits late: effective at a random
// instant between backdatedFrom and an hour ago (a settlement booked late;
// decisions keep the record order, C4 checks the balances by effective time).
func (w *workload) backdate(rng *rand.Rand, cmd sentCmd) sentCmd {
	if w.backdated > 0 && rng.Float64() < w.backdated {
		span := time.Since(backdatedFrom) - time.Hour
		cmd.fields["effective_at"] = backdatedFrom.Add(time.Duration(rng.Int64N(int64(span)))).UTC().Format(time.RFC3339Nano)
	}
	return cmd
}

// conditional makes some deposits, withdrawals and transfers conditional
// (v1.2 §2.3): a sixth of the withdrawals and transfers sweep (up_to: the
// amount is a maximum), and a sixth of the deposits and withdrawals expect the
// revision the replies so far showed of their account, which other producers'
// commands often moved on (revision_mismatch, recorded).
func (w *workload) conditional(rng *rand.Rand, cmd sentCmd) sentCmd {
	x := rng.IntN(6)
	switch {
	case x == 0 && cmd.typ != "deposit":
		cmd.fields["up_to"] = true
	case x == 1 && cmd.typ != "transfer" && w.revision != nil:
		cmd.fields["expected_revision"] = w.revision(cmd.fields["account_id"].(string))
	}
	return cmd
}

// refund reverses producer p's last acknowledged deposit, withdrawal or
// transfer (PROTOCOL.md §2) under key: a third in full, the rest of an amount
// drawn up to one and a half times the original's (beyond what is left:
// refund_exceeds_original, recorded); one in two leaves the original
// refundable again, so that the refunds of one original add up (never beyond
// it: C5's replay re-decides each refund the ledger decided on the whole
// fold of its stream and fails on one the domain refuses; the audit does not
// check it, its bounded fold keeps no original's amount). A refund of a
// rejected original is refused, recorded.
func (w *workload) refund(rng *rand.Rand, p int, key string) (sentCmd, bool) {
	v, ok := w.refundable.LoadAndDelete(p)
	if !ok {
		return sentCmd{}, false
	}
	orig := v.(sentCmd)
	fields := map[string]any{"original_key": orig.key}
	if amount, _ := orig.fields["amount"].(int); amount > 0 && rng.IntN(3) > 0 {
		fields["amount"] = 1 + rng.IntN(amount+amount/2)
	}
	if rng.IntN(2) == 0 {
		w.refundable.LoadOrStore(p, orig)
	}
	return sentCmd{key, "refund", fields}, true
}
