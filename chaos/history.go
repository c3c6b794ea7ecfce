package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	lclient "github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Outcomes of one client attempt.
const (
	OK         = "ok"         // a definite reply: applied or rejected
	Failed     = "failed"     // a definite failure: invalid, nothing recorded
	Indefinite = "indefinite" // no reply, or an infrastructure error: it may or may not have happened
)

// Attempt is one client attempt, as the history records it.
type Attempt struct {
	Key      string
	Type     string
	Body     []byte
	Via      string // "request", "batch" (an element of a batch) or "jetstream"
	InBatch  bool   // published through JetStream as an element of a batch
	Outcome  string
	Reply    *reply.Reply
	Err      string
	Start    time.Time
	Duration time.Duration
}

// History is every attempt of a scenario, and for each key the first request
// sent with it (the one whose hash the store must hold).
type History struct {
	mu       sync.Mutex
	attempts []Attempt
	// atomics counts the atomic batches sent, by their final status ("" for
	// none definite).
	atomics  map[lclient.Status]int
	first    map[string][]byte // key -> first body
	firstTyp map[string]string
	// revisions is each account's highest revision a reply showed: what a
	// client reads before a conditional write (expected_revision).
	revisions map[string]uint64
}

func newHistory() *History {
	return &History{first: map[string][]byte{}, firstTyp: map[string]string{}, atomics: map[lclient.Status]int{}, revisions: map[string]uint64{}}
}

// Revision is the highest revision of account a reply showed so far.
func (h *History) Revision(account string) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.revisions[account]
}

// noteSent records the body before it is sent, so that "first" is the first sent.
func (h *History) noteSent(key, typ string, body []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.first[key]; !ok {
		h.first[key] = body
		h.firstTyp[key] = typ
	}
}

// noteAtomic counts an atomic batch by its final status.
func (h *History) noteAtomic(st lclient.Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.atomics[st]++
}

// Atomics is the count of atomic batches by final status.
func (h *History) Atomics() map[lclient.Status]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.atomics)
}

func (h *History) add(a Attempt) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attempts = append(h.attempts, a)
	if r := a.Reply; r != nil && r.Account != nil && r.Account.Revision > h.revisions[r.Account.AccountID] {
		h.revisions[r.Account.AccountID] = r.Account.Revision
	}
}

// Attempts returns a copy of the attempts.
func (h *History) Attempts() []Attempt {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Attempt(nil), h.attempts...)
}

// keyState summarises the history of one key.
type keyState struct {
	key        string
	typ        string
	firstBody  []byte
	firstHash  string
	acked      []*reply.Reply // definite replies to the first request
	conflicts  int            // definite idempotency_key_conflict replies
	failed     int            // definite invalid replies to the first request
	indefinite int
}

// definite reports whether some attempt of the first request got a definite answer.
func (k *keyState) definite() bool { return len(k.acked) > 0 || k.failed > 0 }

// requestHash is the hash the ledger stores for a body (its canonical request).
func requestHash(typ string, body []byte) (string, bool) {
	if typ == string(domain.CmdBatch) { // an atomic batch's key: the batch's canonical request
		b, inv := domain.DecodeBatch(body)
		if inv != nil || !b.Atomic {
			return "", false
		}
		return b.Canonical().Hash, true
	}
	cmd, inv := domain.DecodeCommand(domain.CommandType(typ), body)
	if inv != nil {
		return "", false
	}
	return cmd.Request().Hash(), true
}

// Keys summarises the history by key.
func (h *History) Keys() map[string]*keyState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]*keyState{}
	for k, b := range h.first {
		ks := &keyState{key: k, typ: h.firstTyp[k], firstBody: b}
		ks.firstHash, _ = requestHash(ks.typ, b)
		out[k] = ks
	}
	for i := range h.attempts {
		a := &h.attempts[i]
		ks := out[a.Key]
		if ks == nil {
			continue
		}
		same := string(a.Body) == string(ks.firstBody)
		switch a.Outcome {
		case OK:
			if same {
				ks.acked = append(ks.acked, a.Reply)
			}
		case Failed:
			if a.Reply != nil && a.Reply.Code == domain.CodeIdempotencyKeyConflict {
				ks.conflicts++
			} else if same {
				ks.failed++
			}
		case Indefinite:
			if same {
				ks.indefinite++
			}
		}
	}
	return out
}

// Stats are a scenario's figures from its history.
type Stats struct {
	Commands, Keys, Acked, Indefinite, Failed, Duplicates, Conflicts int
	// RequestIndefinite counts indefinite request-reply attempts only (a
	// JetStream publish is indefinite by nature, not by a fault).
	RequestIndefinite int
}

// AppliedByType counts, per command type, the keys whose first definite reply
// applied them: what the workload exercised ("capture_hold 12, deposit 80").
func (h *History) AppliedByType() string {
	seen, n := map[string]bool{}, map[string]int{}
	for _, a := range h.Attempts() {
		if a.Outcome != OK || a.Reply == nil || seen[a.Key] {
			continue
		}
		seen[a.Key] = true
		if a.Reply.Status == domain.StatusApplied {
			n[a.Type]++
		}
	}
	var out []string
	for _, t := range slices.Sorted(maps.Keys(n)) {
		out = append(out, fmt.Sprintf("%s %d", t, n[t]))
	}
	return strings.Join(out, ", ")
}

func (h *History) Stats() Stats {
	var st Stats
	for _, a := range h.Attempts() {
		st.Commands++
		switch a.Outcome {
		case OK:
			if a.Reply.Duplicate {
				st.Duplicates++
			}
		case Failed:
			if a.Reply != nil && a.Reply.Code == domain.CodeIdempotencyKeyConflict {
				st.Conflicts++
			}
		case Indefinite:
			st.Indefinite++
			if a.Via != "jetstream" {
				st.RequestIndefinite++
			}
		}
	}
	for _, ks := range h.Keys() {
		st.Keys++
		if len(ks.acked) > 0 {
			st.Acked++
		}
		if ks.failed > 0 && len(ks.acked) == 0 {
			st.Failed++
		}
	}
	return st
}

// client sends commands through the ledger's Go client and records every call.
type client struct {
	nc      *nats.Conn
	lc      *lclient.Client
	h       *History
	timeout time.Duration
}

// newClient is a client on nc recording into h; each call is bounded by timeout.
// The ledger client sends one request per command (no coalescing), so that each
// recorded attempt is one command's.
func newClient(nc *nats.Conn, h *History, timeout time.Duration) *client {
	return &client{nc: nc, lc: lclient.New(nc, lclient.WithoutBatching(), lclient.WithAttemptTimeout(timeout)), h: h, timeout: timeout}
}

// body builds a command body with its key.
func body(key string, fields map[string]any) []byte {
	m := map[string]any{"idempotency_key": key}
	for k, v := range fields {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// send makes one attempt by request-reply: one call of the ledger client,
// which resends the command (same key) while its answer is not definite, bounded
// by the client's timeout; an attempt with no definite answer by then is
// indefinite.
func (c *client) send(ctx context.Context, key, typ string, b []byte) Attempt {
	return c.sendWithin(ctx, key, typ, b, c.timeout)
}

// sendWithin is send bounded by d.
func (c *client) sendWithin(ctx context.Context, key, typ string, b []byte, d time.Duration) Attempt {
	c.h.noteSent(key, typ, b)
	a := Attempt{Key: key, Type: typ, Body: b, Via: "request", Start: time.Now()}
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	lr, err := c.lc.Send(rctx, lclient.Raw{Type: typ, Body: b})
	a.Duration = time.Since(a.Start)
	if err != nil {
		a.Outcome, a.Err = Indefinite, err.Error()
		c.h.add(a)
		return a
	}
	c.record(&a, lr)
	c.h.add(a)
	return a
}

// element is one command of a batch the workload sends.
type element struct {
	key, typ string
	body     []byte
}

// batch sends elems as one ledger.v1.cmd.batch that is not atomic (the ledger
// client's Batch, which resends the elements left undecided, bounded by d) and
// records every element as an attempt of its own, exactly as a single
// command's: a definite reply is ok or failed, an element without one by then
// (answered error, or its reply lost) is indefinite. A batch refused as a
// whole (no per-element replies) leaves every element indefinite.
func (c *client) batch(ctx context.Context, elems []element, d time.Duration) []Attempt {
	cmds := make([]lclient.Command, len(elems))
	for i, e := range elems {
		c.h.noteSent(e.key, e.typ, e.body)
		cmds[i] = lclient.Raw{Type: e.typ, Body: e.body}
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	br, err := c.lc.Batch(rctx, cmds)
	out := make([]Attempt, len(elems))
	for i, e := range elems {
		a := Attempt{Key: e.key, Type: e.typ, Body: e.body, Via: "batch", Start: start, Duration: time.Since(start), Outcome: Indefinite}
		switch {
		case len(br.Replies) != len(elems):
			a.Err = fmt.Sprintf("batch answered %s %s (%s) with %d replies for %d elements: %v", br.Status, br.Code, br.Message, len(br.Replies), len(elems), err)
		case !br.Replies[i].Status.Definite():
			a.Err = fmt.Sprintf("element answered %q %s: %v", br.Replies[i].Status, br.Replies[i].Code, err)
		default:
			c.record(&a, br.Replies[i])
		}
		c.h.add(a)
		out[i] = a
	}
	return out
}

// record sets a's reply and outcome from the client's definite reply lr.
func (c *client) record(a *Attempt, lr lclient.Reply) {
	// The history keeps the server's reply type, whose JSON the client's
	// matches field for field (client/shape_test.go).
	var r reply.Reply
	raw, err := json.Marshal(lr)
	if err == nil {
		err = json.Unmarshal(raw, &r)
	}
	if err != nil {
		a.Outcome, a.Err = Indefinite, fmt.Sprintf("undecodable reply: %v", err)
		return
	}
	a.Reply = &r
	a.Outcome = OK
	if r.Status == domain.StatusInvalid {
		a.Outcome = Failed
	}
}

// publish makes one attempt through JetStream (js.Publish): the ack says the
// command is stored, not decided, so it is recorded as indefinite unless the
// ledger's own reply won the race to the ack inbox.
func (c *client) publish(ctx context.Context, js nats.JetStreamContext, key, typ string, b []byte) Attempt {
	c.h.noteSent(key, typ, b)
	a := Attempt{Key: key, Type: typ, Body: b, Via: "jetstream", Start: time.Now(), Outcome: Indefinite}
	_, err := js.Publish(natsapi.CommandSubject(typ), b, nats.Context(ctx))
	a.Duration = time.Since(a.Start)
	if err != nil {
		a.Err = err.Error()
	}
	c.h.add(a)
	return a
}

// batchBody is the body of a batch of elems ("" key: not atomic).
func batchBody(elems []element, key string) []byte {
	var b strings.Builder
	b.WriteString(`{"commands":[`)
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		// The element is the command's body with its type (PROTOCOL.md §2.2).
		fmt.Fprintf(&b, `{"type":%q,%s`, e.typ, e.body[1:])
	}
	b.WriteString(`]`)
	if key != "" {
		fmt.Fprintf(&b, `,"atomic":true,"idempotency_key":%q`, key)
	}
	b.WriteString(`}`)
	return []byte(b.String())
}

// atomicBatch sends elems as one atomic batch under key (the ledger client's
// Batch with Atomic, which resends it whole until its answer is definite,
// bounded by d). The batch's key is noted as sent (C3, C7: its decision is
// the one event of its key stream). Applied, every element is recorded as an
// attempt with its reply, so C1 demands all of their events; refused, none
// is recorded nor noted as sent, so any event of theirs fails C3: all or
// nothing. Without a definite answer, every element is noted and recorded
// indefinite, settled by key at the end like any other.
func (c *client) atomicBatch(ctx context.Context, key string, elems []element, d time.Duration) []Attempt {
	body := batchBody(elems, key)
	c.h.noteSent(key, string(domain.CmdBatch), body)
	cmds := make([]lclient.Command, len(elems))
	for i, e := range elems {
		cmds[i] = lclient.Raw{Type: e.typ, Body: e.body}
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	br, err := c.lc.Batch(rctx, cmds, lclient.Atomic(key))
	c.h.noteAtomic(br.Status)
	c.recordBatch(key, body, br, err, start)
	if err == nil && br.Status != lclient.StatusApplied {
		return nil // refused: nothing of it is decided
	}
	out := make([]Attempt, len(elems))
	for i, e := range elems {
		c.h.noteSent(e.key, e.typ, e.body)
		a := Attempt{Key: e.key, Type: e.typ, Body: e.body, Via: "atomic", Start: start, Duration: time.Since(start), Outcome: Indefinite}
		switch {
		case err != nil:
			a.Err = fmt.Sprintf("atomic batch %s: %v", key, err)
		case len(br.Replies) != len(elems):
			a.Err = fmt.Sprintf("atomic batch %s applied with %d replies for %d elements", key, len(br.Replies), len(elems))
		default:
			c.record(&a, br.Replies[i])
		}
		c.h.add(a)
		out[i] = a
	}
	return out
}

// recordBatch records an atomic batch's own attempt (its key's): the batch's
// definite reply (C1: checkAtomicKey), or indefinite, to be settled by
// sending the batch again.
func (c *client) recordBatch(key string, body []byte, br lclient.BatchReply, err error, start time.Time) Attempt {
	a := Attempt{Key: key, Type: string(domain.CmdBatch), Body: body, Via: "atomic", Start: start, Duration: time.Since(start), Outcome: Indefinite}
	var r reply.Reply
	raw, jerr := json.Marshal(br)
	if jerr == nil {
		jerr = json.Unmarshal(raw, &r)
	}
	switch {
	case err != nil:
		a.Err = err.Error()
	case jerr != nil:
		a.Err = fmt.Sprintf("undecodable reply: %v", jerr)
	default:
		a.Reply, a.Outcome = &r, OK
		if r.Status == domain.StatusInvalid && !reply.Recorded(r) { // invalid as a whole: its key decides nothing
			a.Outcome = Failed
		}
	}
	c.h.add(a)
	return a
}

// publishBatch publishes elems as one batch that is not atomic through
// JetStream (ledger.v1.cmd.batch, captured by LEDGER_COMMANDS) and records every
// element as a JetStream attempt of its own, indefinite as a single published
// command is: the ack says the batch is stored, not decided.
func (c *client) publishBatch(ctx context.Context, js nats.JetStreamContext, elems []element) []Attempt {
	for _, e := range elems {
		c.h.noteSent(e.key, e.typ, e.body)
	}
	start := time.Now()
	_, err := js.Publish(natsapi.CommandSubject("batch"), batchBody(elems, ""), nats.Context(ctx))
	out := make([]Attempt, len(elems))
	for i, e := range elems {
		a := Attempt{Key: e.key, Type: e.typ, Body: e.body, Via: "jetstream", InBatch: true, Start: start, Duration: time.Since(start), Outcome: Indefinite}
		if err != nil {
			a.Err = err.Error()
		}
		c.h.add(a)
		out[i] = a
	}
	return out
}

// settle sends a key until it gets a definite answer: one call of the ledger
// client, which resends it meanwhile, bounded by attempts times the client's
// timeout.
func (c *client) settle(ctx context.Context, key, typ string, b []byte, attempts int) Attempt {
	d := time.Duration(max(1, attempts)) * c.timeout
	if typ == string(domain.CmdBatch) {
		return c.settleBatch(ctx, key, b, d)
	}
	return c.sendWithin(ctx, key, typ, b, d)
}

// settleBatch sends an atomic batch (body, as first sent) again under its
// key until its answer is definite, bounded by d, and records it.
func (c *client) settleBatch(ctx context.Context, key string, body []byte, d time.Duration) Attempt {
	var b struct {
		Commands []map[string]any `json:"commands"`
	}
	var cmds []lclient.Command
	err := json.Unmarshal(body, &b)
	for _, el := range b.Commands {
		typ, _ := el["type"].(string)
		delete(el, "type")
		raw, merr := json.Marshal(el)
		err = errors.Join(err, merr)
		cmds = append(cmds, lclient.Raw{Type: typ, Body: raw})
	}
	start := time.Now()
	var br lclient.BatchReply
	if err == nil {
		rctx, cancel := context.WithTimeout(ctx, d)
		br, err = c.lc.Batch(rctx, cmds, lclient.Atomic(key))
		cancel()
	}
	return c.recordBatch(key, body, br, err, start)
}

// settleAll drives every key of the history whose first request has no definite
// answer yet to one (bounded): the client's duty after an indefinite outcome.
func (c *client) settleAll(ctx context.Context, attempts int) (unsettled []string) {
	keys := c.h.Keys()
	var pending []*keyState
	for _, ks := range keys {
		if !ks.definite() {
			pending = append(pending, ks)
		}
	}
	sort.Slice(pending, func(i, j int) bool { return pending[i].key < pending[j].key })
	var mu sync.Mutex
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, ks := range pending {
		wg.Add(1)
		sem <- struct{}{}
		go func(ks *keyState) {
			defer wg.Done()
			defer func() { <-sem }()
			if a := c.settle(ctx, ks.key, ks.typ, ks.firstBody, attempts); a.Outcome == Indefinite {
				mu.Lock()
				unsettled = append(unsettled, ks.key)
				mu.Unlock()
			}
		}(ks)
	}
	wg.Wait()
	return unsettled
}
