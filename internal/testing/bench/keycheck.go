package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
)

// KeyCheckStream is what the key-check phase measured on one stream length.
type KeyCheckStream struct {
	Events      int     `json:"events"`
	SeedSeconds float64 `json:"seed_seconds"`
	// ColdLoadMs is the first command on the stream by a fresh service: the
	// stream read and folded once (the cost a cache miss pays); median of 3.
	ColdLoadMs float64 `json:"cold_load_ms"`
	// PeakHeapMB is the most heap in use during a cold load, over what was in use
	// before it (sampled every few milliseconds, largest of the cold loads);
	// HeldHeapMB what the loaded service still holds after a collection.
	PeakHeapMB float64 `json:"cold_load_peak_heap_mb"`
	HeldHeapMB float64 `json:"cold_load_held_heap_mb"`
	// Duplicate10Ns: Handle of a known key, warm cache (nothing is written),
	// cycling over 10 keys of the stream (spread over its length): the same
	// working set on both streams, so only the stream's length differs.
	Duplicate10Ns float64 `json:"duplicate_10_keys_ns"`
	// DuplicateSpreadNs: the same over SpreadKeys keys spread over the stream (on
	// the short stream its 10 keys): the long stream's checks also touch more
	// distinct records, which no longer sit in the CPU's caches.
	DuplicateSpreadNs float64 `json:"duplicate_spread_ns"`
	SpreadKeys        int     `json:"spread_keys"`
	// DuplicateP99Us: p99 of individually timed duplicates (spread keys).
	DuplicateP99Us float64 `json:"duplicate_p99_us"`
	// FirstResendP50Us, FirstResendP99Us: the first resend of each of
	// FirstResendKeys keys not resent before, individually timed on the warm
	// service, one after another. On a stream longer than the aggregate's
	// recent keys (FirstResendOld) they are keys older than those, which it has
	// forgotten: duplicates of old keys, answered from the store (through the
	// key's claim on KurrentDB); FirstResendRecalled counts the key records
	// rebuilt from the store meanwhile, which shows that they took that path.
	// On a shorter stream they lie between the spread ones, all remembered.
	FirstResendP50Us    float64 `json:"first_resend_p50_us"`
	FirstResendP99Us    float64 `json:"first_resend_p99_us"`
	FirstResendKeys     int     `json:"first_resend_keys"`
	FirstResendOld      bool    `json:"first_resend_old_keys"`
	FirstResendRecalled int     `json:"first_resend_recalled"`
	// DecideP50Us, DecideP99Us: Handle of a new deposit, warm cache, including its
	// appends to the event store (fsync as configured), individually timed.
	DecideP50Us float64 `json:"decide_append_p50_us"`
	DecideP99Us float64 `json:"decide_append_p99_us"`
	// DecideOnly10Ns, DecideOnlySpreadNs: the pure decision on the cached
	// aggregate, no I/O: look a known key up and compare its request (the latest
	// 10 keys, or the latest min(samples, 1,024): keys the aggregate remembers),
	// check that a new key is unknown, decide the new command.
	DecideOnly10Ns     float64 `json:"decide_only_10_keys_ns"`
	DecideOnlySpreadNs float64 `json:"decide_only_spread_ns"`
}

// KeyCheckReport compares a short and a long stream.
// keyCheckAccounts is the accounts the key check opens in the ledger's event
// store: one a stream it seeds (Short and Long).
const keyCheckAccounts = 2

type KeyCheckReport struct {
	// EventStore is the ledger's event store (ReportConfig.EventStore).
	EventStore string         `json:"event_store"`
	Samples    int            `json:"samples"`
	Short      KeyCheckStream `json:"short"`
	Long       KeyCheckStream `json:"long"`
	// Ratios long/short (the target is <= 1.2).
	Duplicate10Ratio      float64 `json:"duplicate_10_keys_ratio"`
	DuplicateSpreadRatio  float64 `json:"duplicate_spread_ratio"`
	DecideRatio           float64 `json:"decide_append_p50_ratio"`
	DecideOnly10Ratio     float64 `json:"decide_only_10_keys_ratio"`
	DecideOnlySpreadRatio float64 `json:"decide_only_spread_ratio"`
}

// LikeForLike is the worst long/short ratio over the measures that give both
// streams the same working set (10 keys) and the decide+append latency.
func (k *KeyCheckReport) LikeForLike() float64 {
	return max(k.Duplicate10Ratio, k.DecideOnly10Ratio, k.DecideRatio)
}

// Spread is the worst long/short ratio of the spread-keys measures.
func (k *KeyCheckReport) Spread() float64 {
	return max(k.DuplicateSpreadRatio, k.DecideOnlySpreadRatio)
}

// Rounds of the batch-timed measures (the best round is reported) and the
// operations timed together in one round.
const (
	keyCheckRounds     = 21
	keyCheckHandleOps  = 2000
	keyCheckDecideOps  = 10000
	keyCheckColdLoads  = 3
	keyCheckWorkingSet = 10
	// keyCheckRecentKeys is the service's default of the key records an
	// aggregate keeps (ledger.Options.RecentKeys).
	keyCheckRecentKeys = 1024
)

// keyCheck seeds an account stream of 10 events and one of long events in the
// ledger's event store (at storeURL; eventStore as Config.EventStore), then
// times, alternating between the two so that drift hits both alike: a fresh
// service's first command (cold load), duplicates and new deposits through
// ledger.Service.Handle (warm cache), the first resends of keys not resent
// before (on the long stream, old keys), and the pure decision.
func keyCheck(ctx context.Context, storeURL, eventStore, runID string, long, samples int, components *slog.Logger, log func(msg string, args ...any)) (*KeyCheckReport, error) {
	store, err := config.OpenEventStore(ctx, storeURL, components)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	k := &keyCheckRun{store: store, runID: runID, samples: samples, log: log,
		rep: &KeyCheckReport{EventStore: reportedEventStore(eventStore), Samples: samples}}
	k.out = []*KeyCheckStream{&k.rep.Short, &k.rep.Long}
	if err := k.seed(ctx, []int{10, long}); err != nil { // one account each: keyCheckAccounts
		return nil, err
	}
	if err := k.pickKeys(); err != nil {
		return nil, err
	}
	if err := k.coldLoads(ctx); err != nil {
		return nil, err
	}
	// Warm: one service, both streams cached.
	k.reg = prometheus.NewRegistry()
	k.svc = ledger.New(store, ledger.Options{Metrics: k.reg})
	defer k.svc.Close()
	for _, step := range []func(context.Context) error{k.warm, k.timeDuplicates, k.timeEach, k.firstResends, k.timeDecideOnly} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	k.summarize()
	return k.rep, nil
}

// keyCheckRun is one key check: its two streams (short, long), the keys it
// sends, the warm service and what it has timed so far, by stream.
type keyCheckRun struct {
	store   eventstore.Store
	runID   string
	samples int
	log     func(msg string, args ...any)
	rep     *KeyCheckReport
	out     []*KeyCheckStream
	streams []*seed.Stream

	// Known keys: keyCheckWorkingSet and samples spread over each stream's whole
	// length (most of them keys its aggregate has forgotten: answered from the
	// store), and the latest keyCheckWorkingSet and min(samples,
	// keyCheckRecentKeys) (keys the aggregate remembers: the decide-only
	// measures, which read no store).
	ten, spread, latest10, latest [][]domain.Command

	reg *prometheus.Registry
	svc *ledger.Service

	dup10, dupSpread, dupLat, decLat, decide10, decideSpread [][]time.Duration
}

// seed writes the streams, one per length, and reports how long each took.
func (k *keyCheckRun) seed(ctx context.Context, lengths []int) error {
	k.streams = make([]*seed.Stream, len(lengths))
	for i, n := range lengths {
		start := time.Now()
		last := time.Now()
		st, err := seed.Account(ctx, k.store, "kc"+k.runID+"-"+strconv.Itoa(n), n, seed.Options{
			Progress: func(done, total int) {
				if time.Since(last) > 2*time.Second {
					last = time.Now()
					k.log("seeding key-check stream", "events", n, "done", done, "of", total)
				}
			},
		})
		if err != nil {
			return err
		}
		k.streams[i] = st
		k.out[i].Events = n
		k.out[i].SeedSeconds = time.Since(start).Seconds()
		k.log("seeded key-check stream", "stream", st.Stream, "events", n, "key_claims", st.Claims, "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// pickKeys picks the known keys of each stream (keyCheckRun's key sets).
func (k *keyCheckRun) pickKeys() (err error) {
	n := len(k.streams)
	k.ten, k.spread, k.latest10, k.latest = make([][]domain.Command, n), make([][]domain.Command, n), make([][]domain.Command, n), make([][]domain.Command, n)
	for i, st := range k.streams {
		if k.ten[i], err = st.Spread(keyCheckWorkingSet); err != nil {
			return err
		}
		if k.spread[i], err = st.Spread(k.samples); err != nil {
			return err
		}
		if k.latest10[i], err = st.Latest(keyCheckWorkingSet); err != nil {
			return err
		}
		if k.latest[i], err = st.Latest(min(k.samples, keyCheckRecentKeys)); err != nil {
			return err
		}
		k.out[i].SpreadKeys = len(k.spread[i])
	}
	return nil
}

// handleDup sends a known key to svc, which must answer it as a duplicate.
func (k *keyCheckRun) handleDup(ctx context.Context, svc *ledger.Service, cmd domain.Command) error {
	if r := svc.Handle(ctx, cmd); !r.Duplicate {
		return fmt.Errorf("bench: key check: duplicate answered %s %s duplicate=%v: %s", r.Status, r.Code, r.Duplicate, r.Message)
	}
	return nil
}

// coldLoads times a fresh service's first command on each stream, which loads
// it, and the heap the load takes and holds.
func (k *keyCheckRun) coldLoads(ctx context.Context) error {
	for i := range k.streams {
		var cold []time.Duration
		for c := 0; c < keyCheckColdLoads; c++ {
			base := heapInUse(true)
			peak := sampleHeapPeak()
			svc := ledger.New(k.store, ledger.Options{})
			start := time.Now()
			err := k.handleDup(ctx, svc, k.spread[i][len(k.spread[i])-1])
			cold = append(cold, time.Since(start))
			k.out[i].PeakHeapMB = max(k.out[i].PeakHeapMB, mib(peak()-base))
			k.out[i].HeldHeapMB = max(k.out[i].HeldHeapMB, mib(heapInUse(true)-base))
			svc.Close()
			if err != nil {
				return err
			}
		}
		slices.Sort(cold)
		k.out[i].ColdLoadMs = float64(cold[len(cold)/2].Microseconds()) / 1000
	}
	return nil
}

// warm loads both streams into the warm service.
func (k *keyCheckRun) warm(ctx context.Context) error {
	for i := range k.streams {
		if err := k.handleDup(ctx, k.svc, k.spread[i][0]); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// timeDuplicates times duplicates in batches: the best of rounds of
// keyCheckHandleOps.
func (k *keyCheckRun) timeDuplicates(ctx context.Context) error {
	k.dup10 = make([][]time.Duration, len(k.streams))
	k.dupSpread = make([][]time.Duration, len(k.streams))
	for round := 0; round < keyCheckRounds; round++ {
		for i := range k.streams {
			for _, m := range []struct {
				keys []domain.Command
				out  *[]time.Duration
			}{{k.ten[i], &k.dup10[i]}, {k.spread[i], &k.dupSpread[i]}} {
				start := time.Now()
				for op := 0; op < keyCheckHandleOps; op++ {
					if err := k.handleDup(ctx, k.svc, m.keys[(round*keyCheckHandleOps+op)%len(m.keys)]); err != nil {
						return err
					}
				}
				*m.out = append(*m.out, time.Since(start)/keyCheckHandleOps)
			}
		}
	}
	return nil
}

// timeEach times duplicates (for their p99) and new deposits one by one.
func (k *keyCheckRun) timeEach(ctx context.Context) error {
	k.dupLat = make([][]time.Duration, len(k.streams))
	k.decLat = make([][]time.Duration, len(k.streams))
	for s := 0; s < k.samples; s++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		for i, st := range k.streams {
			cmd := k.spread[i][s%len(k.spread[i])]
			start := time.Now()
			if err := k.handleDup(ctx, k.svc, cmd); err != nil {
				return err
			}
			k.dupLat[i] = append(k.dupLat[i], time.Since(start))
			key := "kc" + k.runID + "-new-" + strconv.Itoa(i) + "-" + strconv.Itoa(s)
			ncmd, ierr := domain.DecodeCommand(domain.CmdDeposit, moneyBody(key, st.AccountID, 5, st.Currency))
			if ierr != nil {
				return ierr
			}
			start = time.Now()
			r := k.svc.Handle(ctx, ncmd)
			k.decLat[i] = append(k.decLat[i], time.Since(start))
			if r.Status != domain.StatusApplied || r.Duplicate {
				return fmt.Errorf("bench: key check: new deposit answered %s %s: %s", r.Status, r.Code, r.Message)
			}
		}
	}
	return nil
}

// firstResends times the first resends of keys never resent before in this
// run: on a stream longer than the keys an aggregate remembers, keys older
// than the latest ones, which no load, resend or new deposit so far has
// brought back (duplicates of old keys); else keys between the spread ones.
func (k *keyCheckRun) firstResends(ctx context.Context) error {
	resent := map[string]bool{}
	for _, keys := range [][][]domain.Command{k.ten, k.spread} {
		for _, cs := range keys {
			for _, c := range cs {
				resent[c.IdempotencyKey] = true
			}
		}
	}
	for i, st := range k.streams {
		if err := k.firstResendsOf(ctx, st, k.out[i], resent); err != nil {
			return err
		}
	}
	return nil
}

// firstResendsOf times the first resends on one stream into out.
func (k *keyCheckRun) firstResendsOf(ctx context.Context, st *seed.Stream, out *KeyCheckStream, resent map[string]bool) error {
	old := st.Events - keyCheckRecentKeys
	out.FirstResendOld = old > 0
	if !out.FirstResendOld {
		old = st.Events
	}
	keys, err := st.Between(k.samples, old)
	if err != nil {
		return err
	}
	var lat []time.Duration
	recalled := keysRecalled(k.reg)
	for _, cmd := range keys {
		if out.FirstResendOld && resent[cmd.IdempotencyKey] {
			continue
		}
		start := time.Now()
		if err := k.handleDup(ctx, k.svc, cmd); err != nil {
			return err
		}
		lat = append(lat, time.Since(start))
	}
	out.FirstResendRecalled = keysRecalled(k.reg) - recalled
	slices.Sort(lat)
	out.FirstResendKeys = len(lat)
	out.FirstResendP50Us, out.FirstResendP99Us = us(percentile(lat, 50)), us(percentile(lat, 99))
	if out.FirstResendOld && out.FirstResendRecalled != len(lat) {
		k.log("WARNING: duplicates of old keys did not all take the store's path", "events", st.Events, "keys", len(lat), "recalled", out.FirstResendRecalled)
	}
	return nil
}

// timeDecideOnly times the pure decision, on aggregates folded from the store
// as a cache miss does: the best of rounds of keyCheckDecideOps.
func (k *keyCheckRun) timeDecideOnly(ctx context.Context) (err error) {
	accs := make([]*domain.Account, len(k.streams))
	for i, st := range k.streams {
		if accs[i], err = foldAccount(ctx, k.store, st.Stream, st.AccountID); err != nil {
			return err
		}
	}
	k.decide10 = make([][]time.Duration, len(k.streams))
	k.decideSpread = make([][]time.Duration, len(k.streams))
	for round := 0; round < keyCheckRounds; round++ {
		for i, st := range k.streams {
			fresh, ierr := domain.DecodeCommand(domain.CmdDeposit, moneyBody("kc"+k.runID+"-fresh", st.AccountID, 5, st.Currency))
			if ierr != nil {
				return ierr
			}
			for _, m := range []struct {
				keys []domain.Command
				out  *[]time.Duration
			}{{k.latest10[i], &k.decide10[i]}, {k.latest[i], &k.decideSpread[i]}} {
				start := time.Now()
				for op := 0; op < keyCheckDecideOps; op++ {
					if err := decideOnly(accs[i], m.keys[(round*keyCheckDecideOps+op)%len(m.keys)], fresh); err != nil {
						return err
					}
				}
				*m.out = append(*m.out, time.Since(start)/keyCheckDecideOps)
			}
		}
	}
	return nil
}

// summarize reports the best round of each batch-timed measure (other
// processes on the machine only ever add time, and both streams had the same
// chances), the percentiles of the individually timed ones, and the ratios.
func (k *keyCheckRun) summarize() {
	best := func(d []time.Duration) float64 {
		return float64(slices.Min(d).Nanoseconds())
	}
	for i := range k.streams {
		out := k.out[i]
		out.Duplicate10Ns = best(k.dup10[i])
		out.DuplicateSpreadNs = best(k.dupSpread[i])
		out.DecideOnly10Ns = best(k.decide10[i])
		out.DecideOnlySpreadNs = best(k.decideSpread[i])
		slices.Sort(k.dupLat[i])
		slices.Sort(k.decLat[i])
		out.DuplicateP99Us = us(percentile(k.dupLat[i], 99))
		out.DecideP50Us = us(percentile(k.decLat[i], 50))
		out.DecideP99Us = us(percentile(k.decLat[i], 99))
	}
	rep := k.rep
	rep.Duplicate10Ratio = ratio(rep.Long.Duplicate10Ns, rep.Short.Duplicate10Ns)
	rep.DuplicateSpreadRatio = ratio(rep.Long.DuplicateSpreadNs, rep.Short.DuplicateSpreadNs)
	rep.DecideRatio = ratio(rep.Long.DecideP50Us, rep.Short.DecideP50Us)
	rep.DecideOnly10Ratio = ratio(rep.Long.DecideOnly10Ns, rep.Short.DecideOnly10Ns)
	rep.DecideOnlySpreadRatio = ratio(rep.Long.DecideOnlySpreadNs, rep.Short.DecideOnlySpreadNs)
}

// FirstResendLine describes the first resends of a key check's streams, for
// both renderings of the report.
func (k *KeyCheckReport) FirstResendLine() string {
	var parts []string
	for _, s := range []KeyCheckStream{k.Short, k.Long} {
		p := fmt.Sprintf("%d events: p50 %.1f µs, p99 %.1f µs over %d keys", s.Events, s.FirstResendP50Us, s.FirstResendP99Us, s.FirstResendKeys)
		switch {
		case !s.FirstResendOld:
			p += " (every key remembered)"
		case s.FirstResendRecalled == s.FirstResendKeys:
			p += fmt.Sprintf(" older than the aggregate's %d recent keys, every one recalled from the store", keyCheckRecentKeys)
		default:
			p += fmt.Sprintf(" older than the aggregate's %d recent keys, but only %d recalled from the store: NOT all duplicates of old keys", keyCheckRecentKeys, s.FirstResendRecalled)
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("first resend of a key (an old key's record is recalled %s): %s", recallPath(k.EventStore), strings.Join(parts, "; "))
}

// OldKeyP99Ms is the p99 of the duplicates of old keys (the long stream's first
// resends), and whether they were measured: the stream is longer than the
// aggregate's recent keys and every one took the store's path.
func (k *KeyCheckReport) OldKeyP99Ms() (float64, bool) {
	l := k.Long
	return l.FirstResendP99Us / 1000, l.FirstResendOld && l.FirstResendKeys > 0 && l.FirstResendRecalled == l.FirstResendKeys
}

// decideOnly is what the command handler does on a cached aggregate before it
// appends: a known key is looked up and its request compared; a new key is
// looked up, found unknown, and its command decided.
func decideOnly(acc *domain.Account, known, fresh domain.Command) error {
	rec, ok := acc.Keys[known.IdempotencyKey]
	if !ok {
		return errors.New("bench: key check: seeded key not in the aggregate")
	}
	if j, err := domain.Judge(rec.DecidedFor(nil), known.Canonical()); err != nil || j.Verdict != domain.KeyDuplicate {
		return errors.New("bench: key check: seeded key answered as a conflict")
	}
	if _, ok := acc.Keys[fresh.IdempotencyKey]; ok {
		return errors.New("bench: key check: fresh key already decided")
	}
	if d := domain.DecideAccount(acc, fresh); len(d.Events) != 1 {
		return fmt.Errorf("bench: key check: decision %+v", d)
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// foldAccount reads a stream and folds it into an aggregate that keeps as many
// keys as the service's.
func foldAccount(ctx context.Context, store eventstore.StreamReader, stream, id string) (*domain.Account, error) {
	acc := domain.NewAccount(id)
	acc.KeyLimit = keyCheckRecentKeys
	next := uint64(0)
	for {
		evs, err := store.ReadStream(ctx, stream, next, eventstore.Forwards, 4096)
		if errors.Is(err, eventstore.ErrStreamNotFound) {
			return acc, nil
		}
		if err != nil {
			return nil, err
		}
		for _, re := range evs {
			m, err := domain.DecodeMetadata(re.Metadata)
			if err != nil {
				return nil, err
			}
			if err := domain.EvolveAccount(acc, domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Position: re.Position.String(), Type: re.Type, Data: re.Data, Metadata: m}); err != nil {
				return nil, err
			}
		}
		if len(evs) < 4096 {
			return acc, nil
		}
		next = evs[len(evs)-1].Revision + 1
	}
}

var heapSample = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}

// heapInUse is the bytes of live and unswept heap objects, after a collection
// when gc is set.
func heapInUse(gc bool) int64 {
	if gc {
		runtime.GC()
	}
	s := []metrics.Sample{{Name: heapSample[0].Name}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// sampleHeapPeak samples the heap in use every 2 ms until the returned function
// is called, which stops sampling and returns the largest sample.
func sampleHeapPeak() func() int64 {
	stop, done := make(chan struct{}), make(chan int64)
	go func() {
		peak := heapInUse(false)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				peak = max(peak, heapInUse(false))
			case <-stop:
				done <- max(peak, heapInUse(false))
				return
			}
		}
	}()
	return func() int64 { close(stop); return <-done }
}

func mib(b int64) float64 { return float64(max(b, 0)) / (1 << 20) }
