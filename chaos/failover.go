package main

import (
	"context"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
)

// ---- scenario 12: PostgreSQL failover on a primary and a synchronous standby ----

// scenarioFailover runs the bank workload with two ledgers and two projectors
// on a pgcluster.Pair (fsync on) through one multi-host URL, and fails the pair
// over and back: the primary SIGKILLed, the standby promoted, the old primary
// rewound into the new one's standby; in every second round the standby is
// frozen (SIGSTOP) for 4 s first, so that commits wait on it and their commands
// end indefinite. C1-C9 are checked on the promoted database through the same
// URL; C8 counts the promotions.
func scenarioFailover(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("12")
	rounds := s.size(3, 2)
	var pair *pgcluster.Pair
	defer func() {
		if pair != nil {
			_ = pair.Stop(context.WithoutCancel(ctx))
		}
	}()
	return runBank(ctx, s, res, bank{
		ledgers: 2, projectors: 2, accounts: 20, producers: 6, commands: s.size(2500, 300),
		resend: 0.05, js: 0.2, retries: 15, timeout: 4 * time.Second,
		ledgerArgs: []string{"--jetstream-backoff", "2s,2s,4s", "--jetstream-grace", "300ms", "--command-timeout", "3s"},
		required:   true, planned: true,
		setup: func(ctx context.Context, sys *system) error {
			var err error
			if pair, err = startPair(ctx, sys); err != nil {
				return err
			}
			sys.dbURL = pair.URLFor(sys.db)
			sys.svcDBURL = sys.dbURL
			return nil
		},
		evidence: stopLedgersFirst,
		faults: func(ctx context.Context, sys *system, res *result) {
			round := 0
			repeatFault(ctx, s, rng, rounds, res, "failover", "primary killed, standby promoted, old primary rewound", func(ctx context.Context) (time.Duration, error) {
				round++
				return failover(context.WithoutCancel(ctx), pair, round%2 == 0, res)
			})
		},
	})
}

// stopLedgersFirst is the evidence step of the scenarios whose faults delay
// the ledgers' transfer process: it writes its checkpoint when it has caught
// up, which after a failover or a leader change may come after the suite's
// quiesce. The ledgers stop first, so that the check sees every stored event
// published (C9).
func stopLedgersFirst(ctx context.Context, sys *system, res *result) {
	for _, l := range sys.ledgers {
		l.stop(10 * time.Second)
	}
	if err := sys.quiesce(ctx, 60*time.Second); err != nil {
		res.note("not quiet after the ledgers stopped: %v", err)
	}
}

// startPair starts the scenario's pair and its database.
func startPair(ctx context.Context, sys *system) (*pgcluster.Pair, error) {
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	pair, err := pgcluster.StartPair(sctx, pgcluster.PairOptions{
		Dirs: [2]string{filepath.Join(sys.dir, "pg-a"), filepath.Join(sys.dir, "pg-b")}, Fsync: true, Logger: quietLogger(),
	})
	if err != nil {
		return nil, err
	}
	if err := pgcluster.CreateDatabase(sctx, pair.URLFor("postgres"), sys.db); err != nil {
		pair.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	return pair, nil
}

// failover is one round; it returns how long until the pair was whole again
// (promoted and the old primary streaming as a synchronous standby).
func failover(ctx context.Context, pair *pgcluster.Pair, freeze bool, res *result) (time.Duration, error) {
	began := time.Now()
	if freeze {
		if _, err := pair.Standby().Signal(syscall.SIGSTOP); err != nil {
			return 0, err
		}
		time.Sleep(4 * time.Second)
	}
	if err := pair.Crash(ctx); err != nil {
		return 0, err
	}
	if _, err := pair.Standby().Signal(syscall.SIGCONT); err != nil {
		return 0, err
	}
	if err := pair.Promote(ctx); err != nil {
		return 0, err
	}
	promoted := time.Since(began)
	if err := pair.Rejoin(ctx); err != nil {
		return 0, err
	}
	resMu.Lock()
	res.ev.Other++
	n := res.ev.Other
	resMu.Unlock()
	res.note("promotion %d after %s (standby frozen first: %v)", n, promoted.Round(time.Millisecond), freeze)
	return time.Since(began), nil
}
