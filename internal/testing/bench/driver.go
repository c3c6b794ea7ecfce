package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
)

// requestTimeout bounds the wait for a command's definite reply (the intake's
// own bound is 15s).
const requestTimeout = 30 * time.Second

// clientsPerConn is how many clients share one NATS connection.
const clientsPerConn = 8

// target is a system under test as the clients see it: NATS connections to the
// server whose intake answers ledger.v1.cmd.<type>, and a ledger client on each
// (one request per command: its coalescing is off, so that the load phase
// measures single commands).
type target struct {
	name    string
	conns   []*nats.Conn
	clients []*client.Client
	// sent counts the messages sent on the command subjects, a batch one
	// (the JetStream capture stores each one; a resend is stored again, so
	// the stream may hold more).
	sent atomic.Int64
}

func dialTarget(name, url string, clients int) (*target, error) {
	t := &target{name: name}
	n := max(1, (clients+clientsPerConn-1)/clientsPerConn)
	for i := 0; i < n; i++ {
		nc, err := nats.Connect(url, nats.Name(fmt.Sprintf("bench-%s-%d", name, i)), nats.MaxReconnects(-1))
		if err != nil {
			t.close()
			return nil, fmt.Errorf("bench: connect %s: %w", url, err)
		}
		t.conns = append(t.conns, nc)
		t.clients = append(t.clients, client.New(nc, client.WithoutBatching()))
	}
	return t, nil
}

func (t *target) close() {
	for _, nc := range t.conns {
		nc.Close()
	}
}

// requester sends one bench client's commands, one at a time.
type requester struct {
	sent *atomic.Int64
	c    *client.Client
}

func (t *target) requester(i int) (*requester, error) {
	return &requester{sent: &t.sent, c: t.clients[i%len(t.clients)]}, nil
}

func (r *requester) close() {}

// replyHead is what the driver reads of a reply.
type replyHead struct {
	Status         domain.Status
	Code           domain.Code
	Message        string
	IdempotencyKey string
	Duplicate      bool
}

// do sends a command and waits for its definite reply (the client resends it,
// same key, while none came), at most requestTimeout: an error after that.
func (r *requester) do(c command) (replyHead, error) {
	r.sent.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	rep, err := r.c.Send(ctx, client.Raw{Type: string(c.typ), Body: c.body})
	if err != nil {
		return replyHead{}, err
	}
	return replyHead{Status: domain.Status(rep.Status), Code: domain.Code(rep.Code), Message: rep.Message, IdempotencyKey: rep.Key, Duplicate: rep.Duplicate}, nil
}

// doBatch sends cmds as one ledger.v1.cmd.batch request (not atomic) and
// waits for every command's definite reply (the client resends the
// undecided ones, same keys), at most requestTimeout.
func (r *requester) doBatch(cmds []command) ([]replyHead, error) {
	r.sent.Add(1) // the stream stores a batch as one message
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	els := make([]client.Command, len(cmds))
	for i, c := range cmds {
		els[i] = client.Raw{Type: string(c.typ), Body: c.body}
	}
	br, err := r.c.Batch(ctx, els)
	if err != nil {
		return nil, err
	}
	if string(br.Status) != string(domain.StatusApplied) || len(br.Replies) != len(cmds) {
		return nil, fmt.Errorf("batch answered %s %s (%s) with %d replies for %d commands", br.Status, br.Code, br.Message, len(br.Replies), len(cmds))
	}
	out := make([]replyHead, len(cmds))
	for i, rep := range br.Replies {
		out[i] = replyHead{Status: domain.Status(rep.Status), Code: domain.Code(rep.Code), Message: rep.Message, IdempotencyKey: rep.Key, Duplicate: rep.Duplicate}
	}
	return out, nil
}

// counters are a phase's live tallies (read by the progress reporter).
type counters struct {
	answered    atomic.Int64 // commands with an outcome (applied or rejected)
	duplicates  atomic.Int64 // answered with duplicate: true
	newApplied  atomic.Int64 // new keys answered applied, not duplicate
	newAnswered atomic.Int64 // new keys with an outcome (however it was flagged)
	rejected    atomic.Int64 // answered rejected
	errors      atomic.Int64 // status error/invalid, transport errors, timeouts
	anomalies   atomic.Int64 // a resend not answered as a duplicate
	// early counts new keys answered as duplicates: the JetStream consumer decided
	// the captured copy before the request-reply path (its grace was too short).
	early atomic.Int64
}

// worker is one client of a phase: its generator, its requester, its latencies.
type worker struct {
	gen  *clientGen
	req  *requester
	lats []time.Duration
	ends []time.Time // when each of lats ended
	dups []bool      // whether each of lats was a resend's
	errs []string
}

func (w *worker) record(c *counters, cmd command, rep replyHead, err error, lat time.Duration, keep bool) {
	if err != nil {
		c.errors.Add(1)
		if len(w.errs) < 3 {
			w.errs = append(w.errs, err.Error())
		}
		return
	}
	switch rep.Status {
	case domain.StatusApplied, domain.StatusRejected:
	default:
		c.errors.Add(1)
		if len(w.errs) < 3 {
			w.errs = append(w.errs, fmt.Sprintf("%s %s: %s", rep.Status, rep.Code, rep.Message))
		}
		return
	}
	c.answered.Add(1)
	if rep.Status == domain.StatusRejected {
		c.rejected.Add(1)
	}
	if rep.Duplicate {
		c.duplicates.Add(1)
	} else if rep.Status == domain.StatusApplied {
		c.newApplied.Add(1)
	}
	switch {
	case cmd.dup && !rep.Duplicate:
		c.anomalies.Add(1)
	case !cmd.dup && rep.Duplicate:
		c.early.Add(1)
	}
	if !cmd.dup {
		c.newAnswered.Add(1)
	}
	w.gen.answered(cmd)
	if keep {
		w.lats = append(w.lats, lat)
		w.ends = append(w.ends, time.Now())
		w.dups = append(w.dups, cmd.dup)
	}
}

// sendBatch sends the worker's next spec.batch commands in one request and
// records each one's reply.
func (w *worker) sendBatch(c *counters, spec loadSpec) {
	cmds := make([]command, spec.batch)
	for i := range cmds {
		cmds[i] = w.gen.next(spec.dupRatio)
	}
	t0 := time.Now()
	reps, err := w.req.doBatch(cmds)
	lat := time.Since(t0)
	for i, cmd := range cmds {
		var rep replyHead
		if err == nil {
			rep = reps[i]
		}
		w.record(c, cmd, rep, err, lat, spec.record)
	}
}

// loadSpec is one driven phase.
type loadSpec struct {
	system   string
	phase    string
	duration time.Duration
	dupRatio float64
	// rate, when > 0, drives the phase open-loop at this many commands per second
	// (latency is measured from each command's scheduled time, so that a stall
	// counts for every command it delays); 0 drives it closed-loop, each client
	// sending its next command when the previous one is answered.
	rate float64
	// record is false for a warm-up.
	record bool
	// batch, when > 1, sends the commands this many to a request
	// (ledger.v1.cmd.batch), closed-loop; each command's latency is its
	// batch's.
	batch int
}

type phaseRun struct {
	spec    loadSpec
	c       counters
	elapsed time.Duration
	lats    []time.Duration
	errs    []string
	// timeline is the phase second by second (by when commands ended).
	timeline []SecondStat
}

// drive runs spec with one worker per generator.
func drive(ctx context.Context, t *target, gens []*clientGen, spec loadSpec, prog *progress) (*phaseRun, error) {
	run := &phaseRun{spec: spec}
	workers, err := openWorkers(t, gens)
	if err != nil {
		return nil, err
	}
	defer closeWorkers(workers)
	for _, nc := range t.conns {
		if err := nc.Flush(); err != nil {
			return nil, err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, spec.duration)
	defer cancel()
	stopProg := prog.start(spec.system+"/"+spec.phase, spec.duration, &run.c)
	start := time.Now()
	var wg sync.WaitGroup
	switch {
	case spec.batch > 1:
		run.driveBatches(pctx, workers, &wg)
	case spec.rate <= 0:
		run.driveClosed(pctx, workers, &wg)
	default:
		run.driveOpen(pctx, start, workers, &wg)
	}
	wg.Wait()
	run.elapsed = time.Since(start)
	stopProg()
	run.collect(start, workers)
	return run, ctx.Err()
}

// openWorkers opens a requester per generator (none left open on error).
func openWorkers(t *target, gens []*clientGen) ([]*worker, error) {
	workers := make([]*worker, len(gens))
	for i, g := range gens {
		req, err := t.requester(i)
		if err != nil {
			closeWorkers(workers[:i])
			return nil, err
		}
		workers[i] = &worker{gen: g, req: req}
	}
	return workers, nil
}

// closeWorkers closes the workers' requesters, the last opened first.
func closeWorkers(workers []*worker) {
	for i := len(workers) - 1; i >= 0; i-- {
		workers[i].req.close()
	}
}

// driveBatches starts the workers closed-loop, each request a batch of
// spec.batch commands, until ctx ends.
func (run *phaseRun) driveBatches(ctx context.Context, workers []*worker, wg *sync.WaitGroup) {
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				w.sendBatch(&run.c, run.spec)
			}
		}()
	}
}

// driveClosed starts the workers closed-loop, each sending its next command
// when the previous one is answered, until ctx ends.
func (run *phaseRun) driveClosed(ctx context.Context, workers []*worker, wg *sync.WaitGroup) {
	spec := run.spec
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cmd := w.gen.next(spec.dupRatio)
				t0 := time.Now()
				rep, err := w.req.do(cmd)
				w.record(&run.c, cmd, rep, err, time.Since(t0), spec.record)
			}
		}()
	}
}

// driveOpen starts the workers open-loop and schedules spec.rate commands a
// second from start until ctx ends, each command's latency measured from its
// scheduled time.
func (run *phaseRun) driveOpen(ctx context.Context, start time.Time, workers []*worker, wg *sync.WaitGroup) {
	spec := run.spec
	due := make(chan time.Time, 1<<16)
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for at := range due {
				cmd := w.gen.next(spec.dupRatio)
				rep, err := w.req.do(cmd)
				w.record(&run.c, cmd, rep, err, time.Since(at), spec.record)
			}
		}()
	}
	interval := time.Duration(float64(time.Second) / spec.rate)
schedule:
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			select {
			case <-ctx.Done():
				break schedule
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case due <- at:
		default:
			// The backlog is full: the system is far below the rate. Wait
			// rather than drop, and let the latencies show it.
			select {
			case due <- at:
			case <-ctx.Done():
				break schedule
			}
		}
	}
	close(due)
}

// collect gathers the workers' latencies (sorted) and first errors, and the
// phase's timeline from start.
func (run *phaseRun) collect(start time.Time, workers []*worker) {
	run.timeline = timeline(start, workers)
	for _, w := range workers {
		run.lats = append(run.lats, w.lats...)
		run.errs = append(run.errs, w.errs...)
	}
	slices.Sort(run.lats)
	if len(run.errs) > 5 {
		run.errs = run.errs[:5]
	}
}

// SecondStat is one second of a phase: the commands that ended in it and their
// latencies (a tail that comes in bursts shows here).
type SecondStat struct {
	Second   int     `json:"second"`
	Commands int     `json:"commands"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	// Resends are the resends of answered keys among Commands (answered
	// from a key lookup when the key is not cached), ResendP99Ms their p99
	// and NewP99Ms the other commands': which kind a slow second slowed.
	Resends     int     `json:"resends"`
	ResendP99Ms float64 `json:"resend_p99_ms"`
	NewP99Ms    float64 `json:"new_p99_ms"`
	// PG is what PostgreSQL was doing in that second (ledger phases on
	// PostgreSQL: pgstate.go).
	PG *PGSecond `json:"pg,omitempty"`
}

func timeline(start time.Time, workers []*worker) []SecondStat {
	var buckets, resends [][]time.Duration // all; the resends'
	for _, w := range workers {
		for i, end := range w.ends {
			sec := int(end.Sub(start) / time.Second)
			if sec < 0 {
				continue
			}
			for len(buckets) <= sec {
				buckets, resends = append(buckets, nil), append(resends, nil)
			}
			buckets[sec] = append(buckets[sec], w.lats[i])
			if w.dups[i] {
				resends[sec] = append(resends[sec], w.lats[i])
			}
		}
	}
	out := make([]SecondStat, len(buckets))
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for sec, b := range buckets {
		slices.Sort(b)
		r := resends[sec]
		slices.Sort(r)
		out[sec] = SecondStat{Second: sec, Commands: len(b), P50Ms: ms(percentile(b, 50)), P99Ms: ms(percentile(b, 99)),
			Resends: len(r), ResendP99Ms: ms(percentile(r, 99)), NewP99Ms: ms(percentile(without(b, r), 99))}
		if len(b) > 0 {
			out[sec].MaxMs = ms(b[len(b)-1])
		}
	}
	return out
}

// without is sorted all less the sorted sub (a sub-multiset of it), sorted.
func without(all, sub []time.Duration) []time.Duration {
	out := make([]time.Duration, 0, len(all)-len(sub))
	j := 0
	for _, d := range all {
		if j < len(sub) && sub[j] == d {
			j++
			continue
		}
		out = append(out, d)
	}
	return out
}

// percentile of sorted latencies (0 when there are none).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)))
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

// progress prints a line per interval while a phase runs.
type progress struct {
	log      *slog.Logger
	interval time.Duration
}

func (p *progress) start(name string, total time.Duration, c *counters) (stop func()) {
	if p == nil || p.log == nil || p.interval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(p.interval)
		defer t.Stop()
		start := time.Now()
		last, lastAt := int64(0), start
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				n := c.answered.Load()
				rate := float64(n-last) / now.Sub(lastAt).Seconds()
				last, lastAt = n, now
				el := now.Sub(start)
				p.log.Info("bench", "phase", name, "elapsed", el.Round(time.Second).String()+"/"+total.String(),
					"pct", fmt.Sprintf("%.0f%%", 100*min(1, el.Seconds()/total.Seconds())),
					"commands", n, "rate", fmt.Sprintf("%.0f/s", rate), "duplicates", c.duplicates.Load(), "errors", c.errors.Load())
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
