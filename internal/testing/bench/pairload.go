package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Phases of the pair/lone comparison, each followed by its round (1, 2): on a
// pair (Config.Standby) the ledger's load phase again, with the standby not
// required (synchronous_standby_names cleared: a lone primary in effect, on the
// same cluster and data) and required, alternated.
const (
	PhaseLoadLone = "load-lone"
	PhaseLoadPair = "load-pair"
)

// pairRounds is how many times the comparison alternates lone and pair.
const pairRounds = 2

// syncRepEvery is the period of the samples of the backends waiting for the
// standby.
const syncRepEvery = 10 * time.Millisecond

// pairSwitch switches the pair's primary between waiting for its standby and
// not (pgcluster.Pair.SetSynchronous), and reads what a phase ran on through
// url, its database.
type pairSwitch struct {
	set func(ctx context.Context, on bool) error
	url string
}

// alternate runs the load phase through run, lone then pair, pairRounds
// times, each after switching the setting (which takes a checkpoint, so every
// phase starts after one), and leaves the standby required. Each phase records
// the setting the primary had and the backends sampled waiting for the standby.
func (s *pairSwitch) alternate(ctx context.Context, clients int, run func(name string) (*PhaseResult, error)) error {
	for round := 1; round <= pairRounds; round++ {
		for _, on := range []bool{false, true} {
			name := fmt.Sprintf("%s-%d", PhaseLoadLone, round)
			if on {
				name = fmt.Sprintf("%s-%d", PhaseLoadPair, round)
			}
			if err := s.set(ctx, on); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := s.phase(ctx, clients, name, run); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *pairSwitch) phase(ctx context.Context, clients int, name string, run func(string) (*PhaseResult, error)) error {
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var names string
	if err := conn.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	stop, done := make(chan struct{}), make(chan [2]int64)
	go func() {
		var waits, samples int64
		t := time.NewTicker(syncRepEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				done <- [2]int64{waits, samples}
				return
			case <-t.C:
				var k int64
				if conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&k) == nil {
					waits += k
					samples++
				}
			}
		}
	}()
	res, err := run(name)
	close(stop)
	n := <-done
	if err != nil {
		return err
	}
	res.SyncStandbyNames, res.SyncRepWaits, res.SyncRepSamples = &names, n[0], n[1]
	mean := 0.0
	if n[1] > 0 {
		mean = float64(n[0]) / float64(n[1])
	}
	res.Mode = fmt.Sprintf("closed loop, %d clients, synchronous_standby_names '%s'; %.2f backends waiting for the standby on average (%d samples)",
		clients, names, mean, n[1])
	return nil
}

// pairLoneRatio is the ledger's commands per second over its pair phases over
// that over its lone phases, each side pooled (all its commands over all its
// seconds); 0 when either side is missing.
func pairLoneRatio(phases []PhaseResult) float64 {
	var cmds, secs [2]float64 // lone, pair
	for _, p := range phases {
		if p.System != SystemLedger {
			continue
		}
		i := -1
		switch {
		case strings.HasPrefix(p.Phase, PhaseLoadLone+"-"):
			i = 0
		case strings.HasPrefix(p.Phase, PhaseLoadPair+"-"):
			i = 1
		}
		if i >= 0 {
			cmds[i] += float64(p.Commands)
			secs[i] += p.Seconds
		}
	}
	if secs[0] == 0 || secs[1] == 0 || cmds[0] == 0 {
		return 0
	}
	return ratio(cmds[1]/secs[1], cmds[0]/secs[0])
}
