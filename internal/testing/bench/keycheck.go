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
	lengths := []int{10, long}
	streams := make([]*seed.Stream, 2)
	rep := &KeyCheckReport{EventStore: reportedEventStore(eventStore), Samples: samples}
	out := []*KeyCheckStream{&rep.Short, &rep.Long}
	for i, n := range lengths {
		start := time.Now()
		last := time.Now()
		st, err := seed.Account(ctx, store, "kc"+runID+"-"+strconv.Itoa(n), n, seed.Options{
			Progress: func(done, total int) {
				if time.Since(last) > 2*time.Second {
					last = time.Now()
					log("seeding key-check stream", "events", n, "done", done, "of", total)
				}
			},
		})
		if err != nil {
			return nil, err
		}
		streams[i] = st
		out[i].Events = n
		out[i].SeedSeconds = time.Since(start).Seconds()
		log("seeded key-check stream", "stream", st.Stream, "events", n, "key_claims", st.Claims, "took", time.Since(start).Round(time.Millisecond))
	}

	// Known keys: n spread over each stream's whole length (most of them keys its
	// aggregate has forgotten: answered from the store), and the latest n (keys
	// the aggregate remembers: the decide-only measures, which read no store).
	ten := make([][]domain.Command, 2)
	spread := make([][]domain.Command, 2)
	latest10 := make([][]domain.Command, 2)
	latest := make([][]domain.Command, 2)
	for i, st := range streams {
		if ten[i], err = st.Spread(keyCheckWorkingSet); err != nil {
			return nil, err
		}
		if spread[i], err = st.Spread(samples); err != nil {
			return nil, err
		}
		if latest10[i], err = st.Latest(keyCheckWorkingSet); err != nil {
			return nil, err
		}
		if latest[i], err = st.Latest(min(samples, keyCheckRecentKeys)); err != nil {
			return nil, err
		}
		out[i].SpreadKeys = len(spread[i])
	}
	handleDup := func(svc *ledger.Service, cmd domain.Command) error {
		if r := svc.Handle(ctx, cmd); !r.Duplicate {
			return fmt.Errorf("bench: key check: duplicate answered %s %s duplicate=%v: %s", r.Status, r.Code, r.Duplicate, r.Message)
		}
		return nil
	}

	// Cold: a fresh service; its first command loads the stream.
	for i := range streams {
		var cold []time.Duration
		for k := 0; k < keyCheckColdLoads; k++ {
			base := heapInUse(true)
			peak := sampleHeapPeak()
			svc := ledger.New(store, ledger.Options{})
			start := time.Now()
			err := handleDup(svc, spread[i][len(spread[i])-1])
			cold = append(cold, time.Since(start))
			out[i].PeakHeapMB = max(out[i].PeakHeapMB, mib(peak()-base))
			out[i].HeldHeapMB = max(out[i].HeldHeapMB, mib(heapInUse(true)-base))
			svc.Close()
			if err != nil {
				return nil, err
			}
		}
		slices.Sort(cold)
		out[i].ColdLoadMs = float64(cold[len(cold)/2].Microseconds()) / 1000
	}

	// Warm: one service, both streams cached.
	reg := prometheus.NewRegistry()
	svc := ledger.New(store, ledger.Options{Metrics: reg})
	defer svc.Close()
	for i := range streams {
		if err := handleDup(svc, spread[i][0]); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Duplicates, batch-timed: the best of rounds of keyCheckHandleOps.
	dup10 := make([][]time.Duration, 2)
	dupSpread := make([][]time.Duration, 2)
	for round := 0; round < keyCheckRounds; round++ {
		for i := range streams {
			for _, m := range []struct {
				keys []domain.Command
				out  *[]time.Duration
			}{{ten[i], &dup10[i]}, {spread[i], &dupSpread[i]}} {
				start := time.Now()
				for k := 0; k < keyCheckHandleOps; k++ {
					if err := handleDup(svc, m.keys[(round*keyCheckHandleOps+k)%len(m.keys)]); err != nil {
						return nil, err
					}
				}
				*m.out = append(*m.out, time.Since(start)/keyCheckHandleOps)
			}
		}
	}
	// Individually timed: duplicates (for their p99) and new deposits.
	dupLat := make([][]time.Duration, 2)
	decLat := make([][]time.Duration, 2)
	for k := 0; k < samples; k++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for i, st := range streams {
			cmd := spread[i][k%len(spread[i])]
			start := time.Now()
			if err := handleDup(svc, cmd); err != nil {
				return nil, err
			}
			dupLat[i] = append(dupLat[i], time.Since(start))
			key := "kc" + runID + "-new-" + strconv.Itoa(i) + "-" + strconv.Itoa(k)
			ncmd, ierr := domain.DecodeCommand(domain.CmdDeposit, moneyBody(key, st.AccountID, 5, st.Currency))
			if ierr != nil {
				return nil, ierr
			}
			start = time.Now()
			r := svc.Handle(ctx, ncmd)
			decLat[i] = append(decLat[i], time.Since(start))
			if r.Status != domain.StatusApplied || r.Duplicate {
				return nil, fmt.Errorf("bench: key check: new deposit answered %s %s: %s", r.Status, r.Code, r.Message)
			}
		}
	}

	// First resends of keys never resent before in this run: on a stream longer
	// than the keys an aggregate remembers, keys older than the latest ones,
	// which no load, resend or new deposit so far has brought back (duplicates
	// of old keys); else keys between the spread ones.
	resent := map[string]bool{}
	for _, keys := range [][][]domain.Command{ten, spread} {
		for _, cs := range keys {
			for _, c := range cs {
				resent[c.IdempotencyKey] = true
			}
		}
	}
	for i, st := range streams {
		old := st.Events - keyCheckRecentKeys
		out[i].FirstResendOld = old > 0
		if !out[i].FirstResendOld {
			old = st.Events
		}
		keys, err := st.Between(samples, old)
		if err != nil {
			return nil, err
		}
		var lat []time.Duration
		recalled := keysRecalled(reg)
		for _, cmd := range keys {
			if out[i].FirstResendOld && resent[cmd.IdempotencyKey] {
				continue
			}
			start := time.Now()
			if err := handleDup(svc, cmd); err != nil {
				return nil, err
			}
			lat = append(lat, time.Since(start))
		}
		out[i].FirstResendRecalled = keysRecalled(reg) - recalled
		slices.Sort(lat)
		out[i].FirstResendKeys = len(lat)
		out[i].FirstResendP50Us, out[i].FirstResendP99Us = us(percentile(lat, 50)), us(percentile(lat, 99))
		if out[i].FirstResendOld && out[i].FirstResendRecalled != len(lat) {
			log("WARNING: duplicates of old keys did not all take the store's path", "events", st.Events, "keys", len(lat), "recalled", out[i].FirstResendRecalled)
		}
	}

	// The pure decision, on aggregates folded from the store as a cache miss does.
	accs := make([]*domain.Account, 2)
	for i, st := range streams {
		if accs[i], err = foldAccount(ctx, store, st.Stream, st.AccountID); err != nil {
			return nil, err
		}
	}
	decide10 := make([][]time.Duration, 2)
	decideSpread := make([][]time.Duration, 2)
	for round := 0; round < keyCheckRounds; round++ {
		for i, st := range streams {
			fresh, ierr := domain.DecodeCommand(domain.CmdDeposit, moneyBody("kc"+runID+"-fresh", st.AccountID, 5, st.Currency))
			if ierr != nil {
				return nil, ierr
			}
			for _, m := range []struct {
				keys []domain.Command
				out  *[]time.Duration
			}{{latest10[i], &decide10[i]}, {latest[i], &decideSpread[i]}} {
				start := time.Now()
				for k := 0; k < keyCheckDecideOps; k++ {
					if err := decideOnly(accs[i], m.keys[(round*keyCheckDecideOps+k)%len(m.keys)], fresh); err != nil {
						return nil, err
					}
				}
				*m.out = append(*m.out, time.Since(start)/keyCheckDecideOps)
			}
		}
	}

	// The best round: other processes on the machine only ever add time, and
	// both streams had the same chances.
	best := func(d []time.Duration) float64 {
		return float64(slices.Min(d).Nanoseconds())
	}
	for i := range streams {
		out[i].Duplicate10Ns = best(dup10[i])
		out[i].DuplicateSpreadNs = best(dupSpread[i])
		out[i].DecideOnly10Ns = best(decide10[i])
		out[i].DecideOnlySpreadNs = best(decideSpread[i])
		slices.Sort(dupLat[i])
		slices.Sort(decLat[i])
		out[i].DuplicateP99Us = us(percentile(dupLat[i], 99))
		out[i].DecideP50Us = us(percentile(decLat[i], 50))
		out[i].DecideP99Us = us(percentile(decLat[i], 99))
	}
	rep.Duplicate10Ratio = ratio(rep.Long.Duplicate10Ns, rep.Short.Duplicate10Ns)
	rep.DuplicateSpreadRatio = ratio(rep.Long.DuplicateSpreadNs, rep.Short.DuplicateSpreadNs)
	rep.DecideRatio = ratio(rep.Long.DecideP50Us, rep.Short.DecideP50Us)
	rep.DecideOnly10Ratio = ratio(rep.Long.DecideOnly10Ns, rep.Short.DecideOnly10Ns)
	rep.DecideOnlySpreadRatio = ratio(rep.Long.DecideOnlySpreadNs, rep.Short.DecideOnlySpreadNs)
	return rep, nil
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
