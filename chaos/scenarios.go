package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	lclient "github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
)

func scenarios() []scenario {
	return []scenario{
		{"0", "checker self-test", scenarioSelfTest},
		{"1", "bank: resends and key reuse", scenarioBank},
		{"2", "JetStream redelivery, faults, DLQ", scenarioRedelivery},
		{"3", "SIGKILL of the ledger", scenarioKillLedger},
		{"4", "SIGKILL of the projector, two projectors", scenarioKillProjector},
		{"5", "PostgreSQL restart -m immediate", scenarioPostgresRestart},
		{"6", "nats-server SIGKILL", scenarioKillNATS},
		{"7", "partitions through a TCP proxy", scenarioPartitions},
		{"8", "commit-order race of the PostgreSQL store", scenarioCommitOrder},
		{"9", "bad input and fuzzing the decoder", scenarioBadInput},
		{"10", "mixed soak", scenarioSoak},
		{"11", "SIGKILL of the events publisher", scenarioKillPublisher},
		{"12", "PostgreSQL failover: primary killed, standby promoted, old primary rewound", scenarioFailover},
		{"13", "3-node NATS cluster: meta and stream leaders SIGKILLed, a node cut off", scenarioNATSCluster},
	}
}

// size picks the full or the quick figure.
func (s *suite) size(full, quick int) int {
	if s.quick {
		return quick
	}
	return full
}

func (s *suite) rng(id string) *rand.Rand {
	var h uint64
	for _, c := range id {
		h = h*31 + uint64(c)
	}
	return rand.New(rand.NewPCG(s.seed, h))
}

func (s *suite) logf(format string, args ...any) {
	if s.verbose {
		fmt.Printf("  "+time.Now().Format("15:04:05.000")+" "+format+"\n", args...)
	}
}

// bank is the shape of a workload scenario.
type bank struct {
	ledgers, projectors int
	ledgerArgs          []string
	accounts            int
	producers           int
	commands            int
	resend, reuse, js   float64
	batch               float64 // share of the producers' steps sending a batch (workload.batch)
	atomic              float64 // share of those batches that are atomic (workload.atomic)
	invalid             float64 // share of the atomic ones with an invalid element (workload.invalid)
	hot                 float64 // share of the commands on one account
	backdated           float64 // share of the deposits booked late (workload.backdated)
	retries             int
	timeout             time.Duration
	pace                time.Duration
	// loadFor bounds the workload in time (default 25 s quick, 45 s full).
	loadFor time.Duration
	// setup runs after the system is up (e.g. to interpose proxies).
	setup func(ctx context.Context, sys *system) error
	// faults runs beside the workload until its context ends.
	faults func(ctx context.Context, sys *system, res *result)
	// evidence, when set, adds scenario-specific evidence before the check.
	evidence func(ctx context.Context, sys *system, res *result)
	// required: C8 demands evidence of faults.
	required bool
	// planned: faults returns after a planned number of faults, and the load
	// goes on until then.
	planned bool
	// settleTimeout bounds the final quiesce.
	settleTimeout time.Duration
	// failpoints, when set, is the ledgers' LEDGER_FAILPOINTS: they die on
	// purpose at those points, and a watcher restarts them until the check.
	failpoints string
}

// runBank runs a bank workload against a fresh system with faults beside it,
// settles every key, waits for quiet and checks.
func runBank(ctx context.Context, s *suite, res *result, b bank) error {
	sys, err := newSystem(ctx, s, "s"+res.id)
	if err != nil {
		return err
	}
	defer sys.down()
	sys.ledgerArgs = b.ledgerArgs
	if b.failpoints != "" {
		sys.ledgerEnv = []string{"LEDGER_FAILPOINTS=" + b.failpoints}
	}
	if b.setup != nil {
		if err := b.setup(ctx, sys); err != nil {
			return err
		}
	}
	if err := sys.up(ctx, max(b.ledgers, 1), b.projectors); err != nil {
		return err
	}
	if b.failpoints != "" {
		// Runs before sys.down (defers run last in, first out).
		wctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); sys.watchLedgers(wctx, res) }()
		defer func() {
			stop()
			<-done
			res.failpoints = sys.failpointDeaths()
		}()
	}
	h := newHistory()
	timeout := b.timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	c := newClient(sys.nc, h, timeout)
	w := b.workload(s, res.id)
	if err := w.open(ctx, c); err != nil {
		return err
	}
	s.logf("scenario %s: accounts open", res.id)
	fctx, fcancel := context.WithCancel(ctx)
	var fwg sync.WaitGroup
	faultsDone := make(chan struct{})
	if b.faults != nil {
		fwg.Add(1)
		go func() { defer fwg.Done(); defer close(faultsDone); b.faults(fctx, sys, res) }()
	} else {
		close(faultsDone)
	}
	if b.planned {
		w.until = faultsDone // the load lasts until the planned faults happened
	}
	// Every workload is bounded in time as well as in commands.
	loadFor := b.loadFor
	if loadFor == 0 {
		loadFor = s.durScale(25*time.Second, 45*time.Second)
	}
	wctx, wcancel := context.WithTimeout(ctx, loadFor)
	w.run(wctx, c)
	wcancel()
	fcancel()
	fwg.Wait()
	s.logf("scenario %s: workload done", res.id)
	if err := settleAndFinish(ctx, sys, c, h, res, b); err != nil {
		return err
	}
	batchNotes(res, h, b, w.invalidSent.Load())
	res.notes = append(res.notes, "applied: "+h.AppliedByType(), h.Conditions())
	return nil
}

// workload is the workload of b in scenario id.
func (b bank) workload(s *suite, id string) *workload {
	retries := b.retries
	if retries == 0 {
		retries = 8
	}
	return &workload{prefix: "s" + id, accounts: hotAccounts("s"+id, b.accounts), producers: b.producers, commands: b.commands,
		resend: b.resend, reuse: b.reuse, jetstream: b.js, batch: b.batch, atomic: b.atomic, retries: retries, pace: b.pace, seed: s.seed ^ uint64(len(id))<<32 ^ uint64(id[0]), hot: b.hot,
		backdated: b.backdated, invalid: b.invalid}
}

// settleAndFinish settles every key of h once the workload is done (the
// JetStream consumer drained, every key resent until its answer is definite),
// waits for quiet and checks.
func settleAndFinish(ctx context.Context, sys *system, c *client, h *History, res *result, b bank) error {
	if err := sys.heal(ctx); err != nil {
		return err
	}
	// JetStream's ack promises a decision without any resend: wait for the
	// consumer to drain, then every stored key must have an outcome.
	if err := sys.waitConsumer(ctx, b.settleTimeoutOr(90*time.Second)); err != nil {
		return err
	}
	undecided, stored, err := sys.storedDecided(ctx, h)
	if err != nil {
		return err
	}
	if b.js > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d commands published to JetStream and acknowledged by it; %d of them undecided before any resend", stored, len(undecided)))
	}
	if left := c.settleAll(ctx, 30); len(left) > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d keys never got a definite answer (e.g. %s)", len(left), left[0]))
	}
	settle := b.settleTimeout
	if settle == 0 {
		settle = 90 * time.Second
	}
	if err := sys.quiesce(ctx, settle); err != nil {
		return err
	}
	if err := sys.finish(ctx, h, res, b.required, b.evidence); err != nil {
		return err
	}
	for _, k := range undecided {
		res.report.fail(1, "key %q: JetStream acknowledged the command, the ledger never decided it", k)
	}
	return nil
}

// batchNotes notes what the batches of b's workload got, and fails a run that
// was to send batches (atomic ones, batches through JetStream) and sent none:
// C8, as a run without faults. invalidSent is how many atomic batches the
// workload sent with an invalid element.
func batchNotes(res *result, h *History, b bank, invalidSent int64) {
	at := h.Atomics()
	sent := 0 // atomic batches, by request-reply
	for _, n := range at {
		sent += n
	}
	if b.batch > 0 {
		var n, dup, conflict, indefinite, published int
		for _, a := range h.Attempts() {
			if a.InBatch {
				published++
			}
			if a.Via != "batch" {
				continue
			}
			n++
			switch {
			case a.Outcome == Indefinite:
				indefinite++
			case a.Reply.Duplicate:
				dup++
			case a.Reply.Code == domain.CodeIdempotencyKeyConflict:
				conflict++
			}
		}
		res.notes = append(res.notes, fmt.Sprintf("%d of %d attempts were elements of batches (not atomic) by request-reply: %d duplicates, %d conflicts, %d indefinite; %d elements of batches published to JetStream", n, len(h.Attempts()), dup, conflict, indefinite, published))
		if n+published+sent == 0 {
			res.report.fail(8, "vacuous: the workload sent no batch (its share of batches is %g)", b.batch)
		} else if b.js > 0 && published == 0 {
			res.report.fail(8, "vacuous: the workload published no batch to JetStream (its share is %g of batches)", b.js)
		}
	}
	if b.atomic > 0 {
		if sent == 0 {
			res.report.fail(8, "vacuous: the workload sent no atomic batch (its share is %g of batches)", b.atomic)
		}
		elems := 0
		for _, a := range h.Attempts() {
			if a.Via == "atomic" {
				elems++
			}
		}
		res.notes = append(res.notes, fmt.Sprintf("atomic batches (sends and resends): %d applied (%d element attempts: C1 demands all of their events), %d rejected and %d invalid (their elements never noted as sent: C3 fails on any event of theirs), %d without a definite answer (their elements settled by key)",
			at[lclient.StatusApplied], elems, at[lclient.StatusRejected], at[lclient.StatusInvalid], at[""]))
	}
	if b.invalid > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d atomic batches sent with an invalid element (answered invalid, or rejected when an element before it refused first)", invalidSent))
		if invalidSent == 0 {
			res.report.fail(8, "vacuous: the workload sent no atomic batch with an invalid element (its share is %g of atomic batches)", b.invalid)
		}
	}
}

func (b bank) settleTimeoutOr(d time.Duration) time.Duration {
	if b.settleTimeout > 0 {
		return b.settleTimeout
	}
	return d
}

// waitConsumer waits (bounded) until the durable consumer has nothing pending.
func (sys *system) waitConsumer(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		info, err := sys.consumerInfo(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("consumer: %d pending, %d awaiting ack", info.NumPending, info.NumAckPending)
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("consumer not drained after %s: %v", timeout, last)
}

// storedDecided asks ledger.v1.query.command for every key that JetStream
// acknowledged and that has no definite reply yet.
func (sys *system) storedDecided(ctx context.Context, h *History) (undecided []string, stored int, err error) {
	queries := lclient.New(sys.nc).Queries()
	keys := h.Keys()
	for _, a := range h.Attempts() {
		if a.Via != "jetstream" {
			continue
		}
		if a.Err != "" {
			sys.s.logf("publish %s: %s", a.Key, a.Err)
			continue
		}
		ks := keys[a.Key]
		if ks == nil || string(ks.firstBody) != string(a.Body) {
			continue
		}
		stored++
		if ks.definite() {
			continue
		}
		var found bool
		for i := 0; i < 5 && !found; i++ { // bounded
			qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			r, qerr := queries.Command(qctx, a.Key)
			cancel()
			var qe *lclient.QueryError
			if qerr != nil && !errors.As(qerr, &qe) {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			found = qerr == nil && r.Status.Definite()
			break
		}
		if !found {
			undecided = append(undecided, a.Key)
		}
		keys[a.Key] = &keyState{key: a.Key, acked: ks.acked, failed: 1} // ask once per key
	}
	return undecided, stored, nil
}

// heal restarts whatever a fault left dead.
func (sys *system) heal(ctx context.Context) error {
	if c := sys.cluster; c != nil {
		for k := range c.nodes {
			c.setCut(k, false)
		}
		if err := c.start(ctx); err != nil {
			return err
		}
	} else if !sys.nats.running() {
		if err := sys.startNATS(ctx); err != nil {
			return err
		}
	}
	for _, v := range append(append([]*svc(nil), sys.ledgers...), sys.projectors...) {
		if _, err := sys.restartIfDead(ctx, v); err != nil {
			return err
		}
	}
	return nil
}

// restartIfDead starts v again if it is not running (and no one else is
// restarting it), returning whether it did.
func (sys *system) restartIfDead(ctx context.Context, v *svc) (bool, error) {
	v.restart.Lock()
	defer v.restart.Unlock()
	if v.running() {
		return false, nil
	}
	return true, sys.startSvc(ctx, v)
}

// finish gathers the evidence and runs the checker in one snapshot.
func (sys *system) finish(ctx context.Context, h *History, res *result, required bool, extra func(context.Context, *system, *result)) error {
	res.stats = h.Stats()
	res.ev.Required = required
	res.ev.Indefinite = res.stats.RequestIndefinite
	res.ev.Reconnects += int(sys.reconnects.Load())
	res.ev.Kills += int(sys.kills.Load())
	if info, err := sys.consumerInfo(ctx); err == nil {
		// Every delivery advances the consumer sequence, every first delivery the
		// stream sequence: the difference is the redeliveries.
		if d := int(info.Delivered.Consumer) - int(info.Delivered.Stream); d > 0 {
			res.ev.Redeliveries += d
		}
	}
	if extra != nil {
		extra(ctx, sys, res)
	}
	out, err := sys.eventsOut(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tx, err := sys.pool.BeginTx(cctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	rep, err := Check(cctx, tx, h, res.ev, out)
	if err != nil {
		return err
	}
	res.report = rep
	return nil
}

// ---- scenario 1 ----

// Half the commands go to one hot account, the rest spread over many accounts
// (3,000; 1,000 quick) with a ledger that caches 16 aggregates (--cache-size):
// most of those commands decide on their account's resident (the compact
// state of an account the cache dropped, issue 27) or load it cold from the
// store, grouped with the concurrent commands' loads, among the hot account's
// pipelined commands, batches, atomic batches and resends. Two ledgers serve
// them, as two instances of one deployment: each one's cached aggregates and
// residents go stale as the other writes, and the store refuses the appends
// decided on them (ledger_appends_refused_total, which C8 demands above 0),
// so that a resident made of a decision the store refused (the race fixed in
// c125731) would decide on a phantom balance, which C4 and C5 catch. The
// first ledger is SIGKILLed and restarted during the load (3 times; 2 quick): after each start
// it warms the store's accounts in the background (a few into the cache, the
// rest as residents) while the commands go on. C4 and C5 cover every account;
// the ledger's own counters, read before each kill and at the end, must show
// accounts loaded cold, commands decided on residents that evictions made
// (not only warming: bankEvictedShare), and as many residents made of
// accounts the ledger had just written (ledger_residents_made_total{head=
// "decided"}: not only those last folded from the store, which a ledger that
// never confirmed its own writes as the store's state would still make), or
// the run did not test them (C8).
const bankCacheSize = "16"

// bankEvictedShare is the least share of scenario 1's spread keys (its keys
// not on the hot account) that C8 demands decided on residents made when the
// cache dropped an account (ledger_resident_loads_total{origin="eviction"}):
// warming after each start makes residents of its own, so a count above 0
// alone would pass with eviction making none.
const bankEvictedShare = 0.25

func scenarioBank(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("1")
	var used accountLoads
	ledger := func(sys *system) *svc {
		used.read(ctx, sys.ledgers[0]) // its counters die with it
		return sys.ledgers[0]
	}
	err := runBank(ctx, s, res, bank{
		ledgers: 2, projectors: 1, accounts: s.size(3000, 1000), producers: 8,
		ledgerArgs: []string{"--cache-size", bankCacheSize},
		commands:   s.size(8000, 1000), resend: 0.10, reuse: 0.02, hot: bankHot, batch: 0.15, atomic: 0.35, invalid: 0.25, backdated: 0.1, required: true,
		retries: 12, timeout: 3 * time.Second, planned: true, // the load lasts until the kills happened
		faults: func(ctx context.Context, sys *system, res *result) {
			killer(sys, res, rng, s.size(3, 2), s.durScale(2*time.Second, 8*time.Second), s.durScale(4*time.Second, 12*time.Second), func() *svc { return ledger(sys) })(ctx)
		},
		evidence: func(ctx context.Context, sys *system, res *result) {
			// The client's own faults count too: resends and reuse.
			res.ev.Other += res.stats.Duplicates + res.stats.Conflicts
			ledger(sys)
			used.read(ctx, sys.ledgers[1]) // never killed: read once
			res.notes = append(res.notes, fmt.Sprintf("the ledgers' aggregates made from residents: %d of evicted accounts, %d of warmed ones; residents made of accounts just written: %d; account streams loaded cold: %d; appends refused (stale state): %d (over their starts; counters unread: %d)", used.evicted, used.warmed, used.written, used.cold, used.refused, used.unread))
		},
	})
	if err == nil && res.report != nil {
		if msg := used.vacuous(int(float64(res.stats.Keys) * (1 - bankHot))); msg != "" {
			res.report.fail(8, "%s", msg)
		}
	}
	return err
}

// bankHot is scenario 1's share of commands on its hot account.
const bankHot = 0.5

// accountLoads adds up a ledger's counters of the accounts it did not find
// in its cache (issue 27), over its starts.
type accountLoads struct {
	evicted, warmed, cold int64 // resident loads by origin, streams loaded cold
	written               int64 // residents made of evicted accounts whose head the ledger wrote
	refused               int64 // appends the store refused for a wrong expected revision
	unread                int   // reads that failed (a ledger already dead)
}

// vacuous says why the loads did not test the many accounts of spread keys
// (C8): no cold loads or refused appends, or fewer resident loads of
// evicted accounts, or fewer residents made of accounts just written, than
// bankEvictedShare of them; "" when they did.
func (l *accountLoads) vacuous(spread int) string {
	want := max(1, int64(float64(spread)*bankEvictedShare))
	if l.evicted < want || l.written < want || l.cold == 0 || l.refused == 0 {
		return fmt.Sprintf("the many accounts were not decided on residents made by eviction (%d, want %d: %.0f%% of %d spread keys; %d of warmed ones), made of accounts just written (%d, want %d), cold loads (%d) and refused appends (%d)",
			l.evicted, want, 100*bankEvictedShare, spread, l.warmed, l.written, want, l.cold, l.refused)
	}
	return ""
}

// read adds v's counters as they stand (they start at 0 with each process).
func (l *accountLoads) read(ctx context.Context, v *svc) {
	m, err := scrapeMetrics(ctx, v.port)
	if err != nil {
		l.unread++
		return
	}
	l.evicted += int64(m[`ledger_resident_loads_total{origin="eviction"}`])
	l.warmed += int64(m[`ledger_resident_loads_total{origin="warm"}`])
	l.cold += int64(m["ledger_cold_load_batch_streams_sum"])
	l.written += int64(m[`ledger_residents_made_total{head="decided"}`])
	l.refused += int64(m["ledger_appends_refused_total"])
}

// scrapeMetrics reads the samples of a service's /metrics, each under its
// name and labels as written (ledger_resident_loads_total{origin="warm"}).
func scrapeMetrics(ctx context.Context, port int) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		at := strings.LastIndexByte(line, ' ')
		if at < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		name, val := line[:at], line[at+1:]
		if f, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = f
		}
	}
	return out, sc.Err()
}
