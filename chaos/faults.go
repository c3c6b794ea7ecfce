package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
)

// sleepCtx sleeps d or until ctx ends; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// between is a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// killRestart SIGKILLs a service, starts it again and waits until it is ready;
// it returns the time from the kill to ready.
func (sys *system) killRestart(ctx context.Context, v *svc) (time.Duration, error) {
	v.restart.Lock()
	defer v.restart.Unlock()
	began := time.Now()
	v.kill()
	sys.kills.Add(1)
	if err := sys.startSvc(ctx, v); err != nil {
		return 0, err
	}
	return time.Since(began), nil
}

func (res *result) noteRecover(d time.Duration) {
	if d > res.recoverMax {
		res.recoverMax = d
	}
}

var resMu sync.Mutex

func (res *result) note(format string, args ...any) {
	resMu.Lock()
	defer resMu.Unlock()
	res.notes = append(res.notes, fmt.Sprintf(format, args...))
}

// watchLedgers restarts, until ctx ends, the ledgers that died by themselves
// (at a failpoint) and not by a killer's hand.
func (sys *system) watchLedgers(ctx context.Context, res *result) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, v := range sys.ledgers {
			began := time.Now()
			restarted, err := sys.restartIfDead(ctx, v)
			switch {
			case err != nil && ctx.Err() == nil:
				sys.s.logf("restart of %s after it died: %v (trying again)", v.name, err)
			case restarted && err == nil:
				d := time.Since(began)
				resMu.Lock()
				res.noteRecover(d)
				resMu.Unlock()
				sys.s.logf("%s died at a failpoint, restarted (%s)", v.name, d.Round(time.Millisecond))
			}
		}
	}
}

// failpointDeaths counts the "failpoint <name> fired" lines of the ledgers' logs.
func (sys *system) failpointDeaths() map[string]int {
	out := map[string]int{}
	for _, v := range sys.ledgers {
		b, err := os.ReadFile(v.log)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			var name string
			if n, _ := fmt.Sscanf(line, "failpoint %s fired", &name); n == 1 {
				out[name]++
			}
		}
	}
	return out
}

// killer SIGKILLs services picked from pick() n times, paced, until ctx ends.
func killer(sys *system, res *result, rng *rand.Rand, n int, lo, hi time.Duration, pick func() *svc) func(context.Context) {
	return func(ctx context.Context) {
		for i := 0; i < n; i++ {
			if !sleepCtx(ctx, between(rng, lo, hi)) {
				return
			}
			v := pick()
			d, err := sys.killRestart(context.WithoutCancel(ctx), v)
			if err != nil {
				res.note("restart of %s failed: %v", v.name, err)
				return
			}
			resMu.Lock()
			res.noteRecover(d)
			resMu.Unlock()
			sys.s.logf("killed and restarted %s (%s)", v.name, d.Round(time.Millisecond))
		}
	}
}

// ---- scenario 2: JetStream redelivery ----

func scenarioRedelivery(ctx context.Context, s *suite, res *result) error {
	rd := &redelivery{freezeRng: s.rng("2-freeze"), holdRng: s.rng("2-hold")}
	err := runBank(ctx, s, res, bank{
		ledgers: 2, projectors: 1, accounts: 10, producers: 4, commands: s.size(1200, 200),
		resend: 0.05, js: 0.6, batch: 0.15, retries: 10, timeout: 4 * time.Second,
		// A short AckWait, a short grace: the consumer races request-reply.
		ledgerArgs: []string{"--jetstream-backoff", "1s,1s,2s,2s", "--jetstream-grace", "100ms", "--jetstream-max-deliver", "20"},
		required:   true,
		faults:     rd.faults,
		evidence:   rd.evidence,
	})
	res.notes = append(res.notes, fmt.Sprintf("%d ledger freezes beyond the AckWait, %d held streams, %d invalid commands published (%d of them an undecodable batch), %d dead letters", rd.stops, rd.holds, rd.invalid, rd.badBatches, rd.dlq))
	if err == nil && res.report != nil && int(rd.dlq) < rd.invalid {
		res.report.fail(3, "%d invalid commands were published durably, only %d reached the DLQ", rd.invalid, rd.dlq)
	}
	return err
}

// redelivery is scenario 2's faults and what they did. Its faults run in
// parallel goroutines, each drawing from its own generator of the seed (a
// *rand.Rand is not safe for concurrent use, and draws interleaved by the
// scheduler would not replay from --seed).
type redelivery struct {
	freezeRng, holdRng       *rand.Rand
	invalid                  int
	dlq                      uint64
	stops, holds, badBatches int
}

func (rd *redelivery) faults(ctx context.Context, sys *system, res *result) {
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		rd.freezeLedgers(ctx, sys)
	}()
	go func() {
		defer wg.Done()
		rd.holdStreams(ctx, sys)
	}()
	go func() {
		defer wg.Done()
		rd.publishInvalid(ctx, sys)
	}()
	wg.Wait()
}

// freezeLedgers, for no ack: freezes a ledger (SIGSTOP) beyond the AckWait;
// what it was handling is redelivered to the other.
func (rd *redelivery) freezeLedgers(ctx context.Context, sys *system) {
	rng := rd.freezeRng
	for ctx.Err() == nil {
		if !sleepCtx(ctx, between(rng, 500*time.Millisecond, 1500*time.Millisecond)) {
			return
		}
		v := sys.ledgers[rng.IntN(len(sys.ledgers))]
		if c := v.cmd; c != nil {
			d := between(rng, 1500*time.Millisecond, 3*time.Second)
			sys.s.logf("freeze %s for %s", v.name, d.Round(time.Millisecond))
			syscall.Kill(-c.Process.Pid, syscall.SIGSTOP)
			time.Sleep(d)
			syscall.Kill(-c.Process.Pid, syscall.SIGCONT)
			rd.stops++
		}
	}
}

// holdStreams, for slow acks: holds an account stream's lock in an open
// append, so that commands on it outlive the AckWait (in-progress, then
// redelivery).
func (rd *redelivery) holdStreams(ctx context.Context, sys *system) {
	rng := rd.holdRng
	for ctx.Err() == nil {
		if !sleepCtx(ctx, between(rng, 500*time.Millisecond, time.Second)) {
			return
		}
		stream, d := "account-s2-acc-0"+itoa(rng.IntN(5)), between(rng, 1500*time.Millisecond, 2500*time.Millisecond)
		sys.s.logf("hold %s for %s", stream, d.Round(time.Millisecond))
		if sys.holdStream(ctx, stream, d) == nil {
			rd.holds++
		}
	}
}

// publishInvalid, for permanent errors: invalid commands published durably go
// to the DLQ.
func (rd *redelivery) publishInvalid(ctx context.Context, sys *system) {
	js, err := sys.nc.JetStream()
	if err != nil {
		return
	}
	// A batch that can never be decoded (a byte after its JSON
	// object) must be dead-lettered too.
	bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	js.Publish(natsapi.CommandSubject("batch"), []byte(`{"commands":[{"type":"deposit","idempotency_key":"s2-invalid-batch","account_id":"s2-acc-00","amount":1,"currency":"EUR"}]}x`), nats.Context(bctx))
	cancel()
	rd.invalid++
	rd.badBatches++
	for i := 0; ctx.Err() == nil && i < 20; i++ {
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return
		}
		key := fmt.Sprintf("s2-invalid-%d", i)
		b := []byte(fmt.Sprintf(`{"idempotency_key":%q,"account_id":"s2-acc-00","amount":1.5,"currency":"EUR"}`, key))
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		// The ledger may answer the ack inbox first with its 400: an
		// error here, yet the message is stored and must reach the DLQ.
		js.Publish("ledger.v1.cmd.deposit", b, nats.Context(pctx))
		rd.invalid++
		cancel()
	}
}

func (rd *redelivery) evidence(ctx context.Context, sys *system, res *result) {
	// The dead letters arrive once the stream's messages are handled.
	for i := 0; i < 50; i++ {
		rd.dlq, _ = sys.dlqCount(ctx)
		if int(rd.dlq) >= rd.invalid {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	res.ev.Other += rd.stops + rd.holds + int(rd.dlq)
	if reasons, err := sys.dlqReasons(ctx); err == nil {
		res.note("dead letters by reason: %v", reasons)
	}
}

// holdStream opens an append to stream and keeps it (and the stream's lock)
// for d, then rolls it back: the ledger's appends to the stream wait meanwhile.
func (sys *system) holdStream(ctx context.Context, stream string, d time.Duration) error {
	hctx, cancel := context.WithTimeout(ctx, d+5*time.Second)
	defer cancel()
	tx, err := sys.pool.Begin(hctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The event store's stream lock (eventstore/postgres lockStreams): appends to
	// the stream wait for it.
	if _, err := tx.Exec(hctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", stream); err != nil {
		return err
	}
	sleepCtx(hctx, d)
	return tx.Rollback(context.WithoutCancel(ctx))
}

// ---- scenario 3: SIGKILL of the ledger ----

func scenarioKillLedger(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("3")
	n := s.size(5, 2)
	// Besides the SIGKILLs at random moments, the ledger dies on purpose in the
	// windows a random kill rarely hits: committed but not acked (or replied), and
	// acked but not gone on. About 3 durable outcomes per command pass those
	// points (request-reply, then the consumer's confirmation and its ack): the
	// probabilities aim at ~10 deaths in the full run, ~4 in --quick.
	p := 0.0013
	if s.quick {
		p = 0.004
	}
	return runBank(ctx, s, res, bank{
		ledgers: 1, projectors: 1, accounts: 20, producers: 6, commands: s.size(2500, 300),
		resend: 0.05, reuse: 0.01, js: 0.2, batch: 0.15, retries: 12, timeout: 3 * time.Second,
		ledgerArgs: []string{"--jetstream-backoff", "2s,2s,4s", "--jetstream-grace", "300ms"},
		failpoints: fmt.Sprintf("%s:%g,%s:%g", natsapi.FailpointAfterCommitBeforeAck, p, natsapi.FailpointAfterAckBeforeReply, p),
		required:   true, planned: true,
		faults: func(ctx context.Context, sys *system, res *result) {
			killer(sys, res, rng, n, s.durScale(1500*time.Millisecond, 3*time.Second), s.durScale(2500*time.Millisecond, 5*time.Second), func() *svc { return sys.ledgers[0] })(ctx)
		},
	})
}

func (s *suite) durScale(quick, full time.Duration) time.Duration {
	if s.quick {
		return quick
	}
	return full
}

// ---- scenario 4: SIGKILL of the projector, two projectors at once ----

func scenarioKillProjector(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("4")
	n := s.size(10, 2)
	return runBank(ctx, s, res, bank{
		ledgers: 1, projectors: 2, accounts: 20, producers: 6, commands: s.size(2500, 300),
		resend: 0.05, retries: 8, required: true, planned: true,
		faults: func(ctx context.Context, sys *system, res *result) {
			killer(sys, res, rng, n, s.durScale(time.Second, 2*time.Second), s.durScale(2*time.Second, 4*time.Second), func() *svc { return sys.projectors[rng.IntN(len(sys.projectors))] })(ctx)
		},
	})
}

// ---- scenario 11: SIGKILL of the events publisher ----

// scenarioKillPublisher kills the one projector, which holds the publisher's
// lease, 10 times while commands flow (in --quick too, with shorter pauses): at
// the end C9 demands every stored event on LEDGER_EVENTS once, in order, none
// before it was stored.
func scenarioKillPublisher(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("11")
	return runBank(ctx, s, res, bank{
		ledgers: 1, projectors: 1, accounts: 20, producers: 6, commands: s.size(4000, 1500),
		resend: 0.05, retries: 8, required: true, planned: true,
		faults: func(ctx context.Context, sys *system, res *result) {
			killer(sys, res, rng, 10, s.durScale(300*time.Millisecond, time.Second), s.durScale(800*time.Millisecond, 3*time.Second), func() *svc { return sys.projectors[0] })(ctx)
		},
	})
}

// ---- scenario 5: PostgreSQL restart -m immediate ----

func scenarioPostgresRestart(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("5")
	n := s.size(3, 1)
	return runBank(ctx, s, res, bank{
		ledgers: 1, projectors: 1, accounts: 20, producers: 6, commands: s.size(2500, 300),
		resend: 0.05, js: 0.2, retries: 15, timeout: 4 * time.Second,
		ledgerArgs: []string{"--jetstream-backoff", "2s,2s,4s", "--jetstream-grace", "300ms"},
		required:   true, planned: true,
		faults: func(ctx context.Context, sys *system, res *result) {
			repeatFault(ctx, s, rng, n, res, "postgres restart", "postgres restarted -m immediate", func(ctx context.Context) (time.Duration, error) {
				d, err := s.restartPostgres(context.WithoutCancel(ctx))
				if err == nil {
					res.ev.Restarts++
				}
				return d, err
			})
		},
	})
}

// repeatFault runs fault n times, each after a pause of 2-8 s (scaled), and
// records how long the system took to recover from each; it stops at the first
// fault that fails ("<what> failed: ...") or when ctx ends.
func repeatFault(ctx context.Context, s *suite, rng *rand.Rand, n int, res *result, what, done string, fault func(context.Context) (time.Duration, error)) {
	for i := 0; i < n; i++ {
		if !sleepCtx(ctx, between(rng, s.durScale(2*time.Second, 4*time.Second), s.durScale(4*time.Second, 8*time.Second))) {
			return
		}
		d, err := fault(ctx)
		if err != nil {
			res.note("%s failed: %v", what, err)
			return
		}
		resMu.Lock()
		res.noteRecover(d)
		resMu.Unlock()
		s.logf("%s (%s)", done, d.Round(time.Millisecond))
	}
}

// ---- scenario 6: nats-server SIGKILL ----

func scenarioKillNATS(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("6")
	n := s.size(3, 2)
	return runBank(ctx, s, res, bank{
		ledgers: 1, projectors: 1, accounts: 20, producers: 6, commands: s.size(2500, 300),
		resend: 0.05, js: 0.3, retries: 15, timeout: 3 * time.Second,
		ledgerArgs: []string{"--jetstream-backoff", "2s,2s,4s", "--jetstream-grace", "300ms"},
		required:   true, planned: true,
		faults: func(ctx context.Context, sys *system, res *result) {
			repeatFault(ctx, s, rng, n, res, "nats restart", "nats-server killed and restarted", func(ctx context.Context) (time.Duration, error) {
				began := time.Now()
				sys.nats.kill()
				sys.kills.Add(1)
				time.Sleep(between(rng, 200*time.Millisecond, time.Second))
				if err := sys.startNATS(context.WithoutCancel(ctx)); err != nil {
					return 0, err
				}
				// Recovered when the ledgers are ready again (connected, subscribed).
				for _, l := range sys.ledgers {
					waitHTTP(ctx, l.readyURL(), 60*time.Second, l.running)
				}
				return time.Since(began), nil
			})
		},
	})
}

// ---- scenario 10: a mixed soak rotating fault subsets ----

func scenarioSoak(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("10")
	periods := s.size(8, 2)
	return runBank(ctx, s, res, bank{
		ledgers: 2, projectors: 2, accounts: 20, producers: 6, commands: s.size(3000, 300),
		resend: 0.08, reuse: 0.02, js: 0.3, retries: 15, timeout: 3 * time.Second,
		ledgerArgs: []string{"--jetstream-backoff", "2s,2s,4s", "--jetstream-grace", "300ms"},
		required:   true, planned: true,
		faults: func(ctx context.Context, sys *system, res *result) {
			for p := 0; p < periods; p++ {
				if !sleepCtx(ctx, between(rng, s.durScale(time.Second, 2*time.Second), s.durScale(2*time.Second, 4*time.Second))) {
					return
				}
				subset := rng.IntN(15) + 1 // a non-empty subset of four faults
				var names []string
				bg := context.WithoutCancel(ctx)
				if subset&1 != 0 {
					names = append(names, "kill-ledger")
					if d, err := sys.killRestart(bg, sys.ledgers[rng.IntN(len(sys.ledgers))]); err == nil {
						res.noteRecover(d)
					}
				}
				if subset&2 != 0 {
					names = append(names, "kill-projector")
					if d, err := sys.killRestart(bg, sys.projectors[rng.IntN(len(sys.projectors))]); err == nil {
						res.noteRecover(d)
					}
				}
				if subset&4 != 0 {
					names = append(names, "postgres-immediate")
					if d, err := s.restartPostgres(bg); err == nil {
						res.ev.Restarts++
						res.noteRecover(d)
					}
				}
				if subset&8 != 0 {
					names = append(names, "kill-nats")
					sys.nats.kill()
					sys.kills.Add(1)
					sys.startNATS(bg)
				}
				s.logf("soak period %d: %v", p, names)
				res.note("period %d: %v", p, names)
			}
		},
	})
}
