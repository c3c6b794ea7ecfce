package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/bench/seed"
	"github.com/ledgerworks/ledger/internal/ledger"
)

// KeyCheckStream is what the key-check phase measured on one stream length.
type KeyCheckStream struct {
	Events      int     `json:"events"`
	SeedSeconds float64 `json:"seed_seconds"`
	// ColdLoadMs is the first command on the stream by a fresh service: the
	// stream read and folded once (the cost a cache miss pays).
	ColdLoadMs float64 `json:"cold_load_ms"`
	// DuplicateP50Us, DuplicateP99Us: Handle of a known key, warm cache (no write).
	DuplicateP50Us float64 `json:"duplicate_p50_us"`
	DuplicateP99Us float64 `json:"duplicate_p99_us"`
	// DecideP50Us, DecideP99Us: Handle of a new deposit, warm cache, including its
	// append to PostgreSQL (fsync as configured).
	DecideP50Us float64 `json:"decide_append_p50_us"`
	DecideP99Us float64 `json:"decide_append_p99_us"`
	// DecideOnlyNs is the pure decision on the cached aggregate: look a known key
	// up and compare its request, check a new key is unknown, decide it; no I/O.
	DecideOnlyNs float64 `json:"decide_only_ns"`
}

// KeyCheckReport compares a short and a long stream.
type KeyCheckReport struct {
	Samples int            `json:"samples"`
	Short   KeyCheckStream `json:"short"`
	Long    KeyCheckStream `json:"long"`
	// Ratios long/short (the target is <= 1.2).
	DuplicateRatio  float64 `json:"duplicate_p50_ratio"`
	DecideRatio     float64 `json:"decide_append_p50_ratio"`
	DecideOnlyRatio float64 `json:"decide_only_ratio"`
}

// keyCheck seeds an account stream of 10 events and one of long events in the
// ledger's event store, then times, alternating between the two so that drift
// hits both alike: a fresh service's first command (cold load), duplicates and
// new deposits through ledger.Service.Handle (warm cache), and the pure decision.
func keyCheck(ctx context.Context, storeURL, runID string, long, samples int, log func(msg string, args ...any)) (*KeyCheckReport, error) {
	store, err := postgres.Open(ctx, storeURL)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	lengths := []int{10, long}
	streams := make([]*seed.Stream, 2)
	rep := &KeyCheckReport{Samples: samples}
	out := []*KeyCheckStream{&rep.Short, &rep.Long}
	for i, n := range lengths {
		start := time.Now()
		last := time.Now()
		st, err := seed.Account(ctx, store, "kc"+runID+"-"+strconv.Itoa(n), n, seed.Options{
			Progress: func(copied, total int) {
				if time.Since(last) > 2*time.Second {
					last = time.Now()
					log("seeding key-check stream", "events", n, "copied", copied, "of", total)
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

	// Duplicates: a sample of each stream's keys spread over its whole length.
	dups := make([][]domain.Command, 2)
	for i, st := range streams {
		step := max(1, len(st.Keys)/samples)
		for k := 0; k < len(st.Keys); k += step {
			typ := domain.CmdDeposit
			if k == 0 {
				typ = domain.CmdOpenAccount
			}
			cmd, ierr := domain.DecodeCommand(typ, st.Bodies[k])
			if ierr != nil {
				return nil, ierr
			}
			dups[i] = append(dups[i], cmd)
		}
	}

	// Cold: a fresh service per stream; its first command loads the stream.
	for i := range streams {
		svc := ledger.New(store, ledger.Options{})
		start := time.Now()
		r := svc.Handle(ctx, dups[i][len(dups[i])-1])
		out[i].ColdLoadMs = float64(time.Since(start).Microseconds()) / 1000
		svc.Close()
		if !r.Duplicate {
			return nil, fmt.Errorf("bench: key check: cold duplicate answered %s %s duplicate=%v", r.Status, r.Code, r.Duplicate)
		}
	}

	// Warm: one service, both streams cached.
	svc := ledger.New(store, ledger.Options{})
	defer svc.Close()
	for i := range streams {
		svc.Handle(ctx, dups[i][0])
	}
	dupLat := make([][]time.Duration, 2)
	decLat := make([][]time.Duration, 2)
	for k := 0; k < samples; k++ {
		for i, st := range streams {
			cmd := dups[i][k%len(dups[i])]
			start := time.Now()
			r := svc.Handle(ctx, cmd)
			dupLat[i] = append(dupLat[i], time.Since(start))
			if !r.Duplicate {
				return nil, fmt.Errorf("bench: key check: duplicate answered %s %s: %s", r.Status, r.Code, r.Message)
			}
			key := "kc" + runID + "-new-" + strconv.Itoa(i) + "-" + strconv.Itoa(k)
			ncmd, ierr := domain.DecodeCommand(domain.CmdDeposit, moneyBody(key, st.AccountID, 5, st.Currency))
			if ierr != nil {
				return nil, ierr
			}
			start = time.Now()
			r = svc.Handle(ctx, ncmd)
			decLat[i] = append(decLat[i], time.Since(start))
			if r.Status != domain.StatusApplied || r.Duplicate {
				return nil, fmt.Errorf("bench: key check: new deposit answered %s %s: %s", r.Status, r.Code, r.Message)
			}
		}
	}
	for i := range streams {
		slices.Sort(dupLat[i])
		slices.Sort(decLat[i])
		out[i].DuplicateP50Us = us(percentile(dupLat[i], 50))
		out[i].DuplicateP99Us = us(percentile(dupLat[i], 99))
		out[i].DecideP50Us = us(percentile(decLat[i], 50))
		out[i].DecideP99Us = us(percentile(decLat[i], 99))
	}

	// The pure decision, on aggregates folded from the store as a cache miss does.
	accs := make([]*domain.Account, 2)
	for i, st := range streams {
		if accs[i], err = foldAccount(ctx, store, st.Stream, st.AccountID); err != nil {
			return nil, err
		}
	}
	const rounds, perRound = 5, 20_000
	best := []time.Duration{1 << 62, 1 << 62}
	for round := 0; round < rounds; round++ {
		for i, st := range streams {
			fresh, ierr := domain.DecodeCommand(domain.CmdDeposit, moneyBody("kc"+runID+"-fresh", st.AccountID, 5, st.Currency))
			if ierr != nil {
				return nil, ierr
			}
			start := time.Now()
			for k := 0; k < perRound; k++ {
				known := dups[i][k%len(dups[i])]
				rec, ok := accs[i].Keys[known.IdempotencyKey]
				if !ok {
					return nil, errors.New("bench: key check: seeded key not in the aggregate")
				}
				if dup, _ := rec.Duplicate(known.Request()); !dup {
					return nil, errors.New("bench: key check: seeded key answered as a conflict")
				}
				if _, ok := accs[i].Keys[fresh.IdempotencyKey]; ok {
					return nil, errors.New("bench: key check: fresh key already decided")
				}
				if d := domain.DecideAccount(accs[i], fresh); len(d.Events) != 1 {
					return nil, fmt.Errorf("bench: key check: decision %+v", d)
				}
			}
			best[i] = min(best[i], time.Since(start)/perRound)
		}
	}
	for i := range streams {
		out[i].DecideOnlyNs = float64(best[i].Nanoseconds())
	}
	rep.DuplicateRatio = ratio(rep.Long.DuplicateP50Us, rep.Short.DuplicateP50Us)
	rep.DecideRatio = ratio(rep.Long.DecideP50Us, rep.Short.DecideP50Us)
	rep.DecideOnlyRatio = ratio(rep.Long.DecideOnlyNs, rep.Short.DecideOnlyNs)
	return rep, nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// foldAccount reads a stream and folds it, as the service does on a cache miss.
func foldAccount(ctx context.Context, store eventstore.StreamReader, stream, id string) (*domain.Account, error) {
	acc := domain.NewAccount(id)
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
