package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// What PostgreSQL did through a ledger phase (issue 27: a tail latency that
// no profile of the process explained): its checkpoints and WAL, from its
// cumulative statistics (PostgreSQL 15 and 16: pg_stat_bgwriter, pg_stat_wal;
// PostgreSQL 17 moved the checkpointer's counters to pg_stat_checkpointer and
// the backends' writes to pg_stat_io, so there watchPG warns and a phase has
// no PostgreSQL figures: docker-compose.yml's postgres:17 is not read) and
// its control file at the phase's ends, and every pgSampleEvery what the
// checkpointer and the backends were waiting for (pg_stat_activity), so
// that a slow second of the timeline can be set beside a checkpoint's
// writes or its fsyncs.

// pgSampleEvery is the period of the samples of pg_stat_activity.
const pgSampleEvery = 100 * time.Millisecond

// PGPhase is PostgreSQL's work through a phase: the differences of its
// cumulative counters between the phase's start and end. The counters lag
// (the checkpointer's reach pg_stat_bgwriter within about a second of a
// checkpoint's end, a backend's WAL counts once it is idle a while), so
// what ended in a phase's last second may be counted in the next phase;
// pg_control_checkpoint and the samples of pg_stat_activity do not lag.
type PGPhase struct {
	// CheckpointsTimed and CheckpointsRequested started in the phase (by
	// checkpoint_timeout; by max_wal_size or a CHECKPOINT).
	CheckpointsTimed     int64 `json:"checkpoints_timed"`
	CheckpointsRequested int64 `json:"checkpoints_requested"`
	// LastCheckpoint is when the latest completed checkpoint began
	// (pg_control_checkpoint), at the phase's end, to the second;
	// CheckpointEnded says whether one completed in the phase (its LSN moved:
	// two may begin in one second).
	LastCheckpoint  time.Time `json:"last_checkpoint"`
	CheckpointEnded bool      `json:"checkpoint_ended"`
	// BuffersCheckpoint are the pages the checkpointer wrote,
	// CheckpointWriteMs and CheckpointSyncMs the time it spent writing them
	// and in fsync of the data files (both counted when a checkpoint ends).
	BuffersCheckpoint int64   `json:"buffers_checkpoint"`
	CheckpointWriteMs float64 `json:"checkpoint_write_ms"`
	CheckpointSyncMs  float64 `json:"checkpoint_sync_ms"`
	// BuffersBackend are the pages the backends had to write themselves.
	BuffersBackend int64 `json:"buffers_backend"`
	// WALBytes, WALWrites and WALSyncs: the WAL generated, its writes and
	// fsyncs.
	WALBytes  int64 `json:"wal_bytes"`
	WALWrites int64 `json:"wal_writes"`
	WALSyncs  int64 `json:"wal_syncs"`
	// CheckpointerSamples counts the samples that found the checkpointer
	// in each wait event ("" for on CPU), WALWaits the backends found
	// waiting on the WAL (IO WALSync, WALWrite; LWLock WALWrite, WALInsert)
	// summed over Samples samples.
	CheckpointerSamples map[string]int `json:"checkpointer_samples,omitempty"`
	WALWaits            int64          `json:"wal_waits"`
	// Autovacuum is the autovacuum workers found, summed over the samples.
	Autovacuum int64 `json:"autovacuum"`
	// BackendWaits counts the client backends found in a statement or a
	// transaction (pg_stat_activity's state not idle) by
	// wait_event_type:wait_event ("cpu" for none), summed over the samples:
	// what a DBA reads first, e.g. IO:DataFileWrite for a backend writing a
	// dirty page itself to free a buffer, IO:DataFileRead for a page read
	// from the kernel, IO:WALSync for a commit's flush.
	BackendWaits map[string]int `json:"backend_waits,omitempty"`
	Samples      int64          `json:"samples"`
}

// PGSecond is what the samples of one second of a phase found.
type PGSecond struct {
	// Checkpointer lists the wait events the checkpointer was found in
	// ("cpu" for none), WALWaits the backends waiting on the WAL summed
	// over the second's samples.
	Checkpointer string `json:"checkpointer,omitempty"`
	WALWaits     int64  `json:"wal_waits,omitempty"`
	Autovacuum   int64  `json:"autovacuum,omitempty"`
	// Vacuumed are the autovacuum workers' queries seen in the second.
	Vacuumed     []string       `json:"vacuumed,omitempty"`
	BackendWaits map[string]int `json:"backend_waits,omitempty"`
	// CPU is the cores each part of the machine took in the second (this
	// process, the PostgreSQL server, the rest): who had the CPU when the
	// process's goroutines waited for it (go tool trace's scheduler delay).
	CPU *CPUUse `json:"cpu,omitempty"`
	// DirtyMiB and WritebackMiB are the kernel's dirty page cache and what
	// it was writing back at the second's end (/proc/meminfo): the pages the
	// backends wrote themselves wait there, and a flush of them shares the
	// disk with the commits' WAL fsyncs.
	DirtyMiB     int64 `json:"dirty_mib"`
	WritebackMiB int64 `json:"writeback_mib"`
	// SchedWaitMs is the time this process's goroutines spent runnable but
	// not running in the second, summed (runtime/metrics
	// /sched/latencies:seconds, each wait at its bucket's midpoint), and
	// SchedP99Ms the p99 of those waits (its bucket's upper bound): go tool
	// trace -pprof=sched per second, without a trace.
	SchedWaitMs float64 `json:"sched_wait_ms"`
	SchedP99Ms  float64 `json:"sched_p99_ms"`
}

// pgCounters are the cumulative counters at one moment.
type pgCounters struct {
	timed, req, bufCkpt, bufBackend int64
	writeMs, syncMs                 float64
	walBytes, walWrites, walSyncs   int64
	last                            time.Time // to the second
	lastLSN                         string    // the latest checkpoint's
}

const pgCountersSQL = `SELECT b.checkpoints_timed, b.checkpoints_req, b.buffers_checkpoint, b.buffers_backend,
	b.checkpoint_write_time, b.checkpoint_sync_time, w.wal_bytes::bigint, w.wal_write, w.wal_sync,
	(pg_control_checkpoint()).checkpoint_time, (pg_control_checkpoint()).checkpoint_lsn::text
	FROM pg_stat_bgwriter b, pg_stat_wal w`

func readPGCounters(ctx context.Context, conn *pgx.Conn) (pgCounters, error) {
	var c pgCounters
	err := conn.QueryRow(ctx, pgCountersSQL).Scan(&c.timed, &c.req, &c.bufCkpt, &c.bufBackend,
		&c.writeMs, &c.syncMs, &c.walBytes, &c.walWrites, &c.walSyncs, &c.last, &c.lastLSN)
	return c, err
}

// pgWaitsSQL is one sample: the checkpointer's wait event, the backends
// waiting on the WAL and the autovacuum workers.
const pgWaitsSQL = `SELECT coalesce(max(wait_event) FILTER (WHERE backend_type = 'checkpointer'), ''),
	count(*) FILTER (WHERE wait_event IN ('WALSync', 'WALWrite', 'WALInsert')),
	count(*) FILTER (WHERE backend_type = 'autovacuum worker'),
	coalesce(array_agg(DISTINCT query) FILTER (WHERE backend_type = 'autovacuum worker'), '{}')
	FROM pg_stat_activity`

// pgBackendWaitsSQL is one sample of the client backends (but the watch's
// own) in a statement or a transaction, by wait event.
const pgBackendWaitsSQL = `SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu'), count(*)
	FROM pg_stat_activity
	WHERE backend_type = 'client backend' AND state <> 'idle' AND pid <> pg_backend_pid()
	GROUP BY 1`

// pgWatch samples PostgreSQL through one phase.
type pgWatch struct {
	conn   *pgx.Conn
	pm     int       // the postmaster's PID, for sampleCPU
	cpu    cpuSample // at the last whole second
	sched  []uint64  // /sched/latencies:seconds's counts then
	c0     pgCounters
	start  time.Time
	stop   chan struct{}
	done   chan struct{}
	phase  PGPhase
	perSec []PGSecond
	seen   []map[string]bool // the checkpointer's wait events by second
}

// watchPG starts sampling the PostgreSQL at url; nil (and a warning) when
// it cannot, so that a phase is never refused for want of its statistics.
func watchPG(ctx context.Context, url string, pm int, warn func(string, ...any)) *pgWatch {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		warn("bench: postgres statistics", "err", err)
		return nil
	}
	c0, err := readPGCounters(ctx, conn)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		warn("bench: postgres statistics", "err", err)
		return nil
	}
	w := newPGWatch(conn, c0)
	w.pm, w.cpu = pm, sampleCPU(pm)
	_, w.sched = schedLatencies()
	go w.sample(ctx)
	return w
}

// newPGWatch is a watch on conn from the counters c0, not yet sampling.
func newPGWatch(conn *pgx.Conn, c0 pgCounters) *pgWatch {
	w := &pgWatch{conn: conn, c0: c0, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	w.phase.CheckpointerSamples = map[string]int{}
	w.phase.BackendWaits = map[string]int{}
	return w
}

func (w *pgWatch) sample(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(pgSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		w.sampleOnce(ctx)
	}
}

// sampleOnce reads pg_stat_activity once into the phase and its second.
func (w *pgWatch) sampleOnce(ctx context.Context) {
	var event string
	var walWaits, autovacuum int64
	var vacuumed []string
	if w.conn.QueryRow(ctx, pgWaitsSQL).Scan(&event, &walWaits, &autovacuum, &vacuumed) != nil {
		return
	}
	waits, err := w.backendWaits(ctx)
	if err != nil {
		return
	}
	if event == "" {
		event = "cpu"
	}
	sec := int(time.Since(w.start) / time.Second)
	for len(w.perSec) <= sec {
		w.perSec = append(w.perSec, PGSecond{BackendWaits: map[string]int{}})
		w.seen = append(w.seen, map[string]bool{})
	}
	s := &w.perSec[sec]
	if sec > 0 && w.perSec[sec-1].CPU == nil && w.cpu.ok {
		// The first sample of a second closes the previous one's CPU.
		now := sampleCPU(w.pm)
		w.perSec[sec-1].CPU, w.cpu = cpuBetween(w.cpu, now, cpuCount()), now
		w.perSec[sec-1].DirtyMiB, w.perSec[sec-1].WritebackMiB = kernelDirty()
		w.closeSched(&w.perSec[sec-1])
	}
	s.WALWaits += walWaits
	s.Autovacuum += autovacuum
	for _, q := range vacuumed {
		if !slices.Contains(s.Vacuumed, q) {
			s.Vacuumed = append(s.Vacuumed, q)
		}
	}
	for e, n := range waits {
		s.BackendWaits[e] += n
		w.phase.BackendWaits[e] += n
	}
	w.phase.Autovacuum += autovacuum
	w.seen[sec][event] = true
	w.phase.CheckpointerSamples[event]++
	w.phase.WALWaits += walWaits
	w.phase.Samples++
}

// backendWaits is one sample of pgBackendWaitsSQL.
func (w *pgWatch) backendWaits(ctx context.Context) (map[string]int, error) {
	rows, err := w.conn.Query(ctx, pgBackendWaitsSQL)
	if err != nil {
		return nil, err
	}
	waits := map[string]int{}
	var event string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&event, &n}, func() error {
		waits[event] = n
		return nil
	})
	return waits, err
}

// end stops the samples and returns the phase's figures, the seconds'
// merged into timeline (by second since the watch began, which is within
// the driver's set-up of the phase's start).
func (w *pgWatch) end(ctx context.Context, timeline []SecondStat) *PGPhase {
	close(w.stop)
	<-w.done
	defer w.conn.Close(context.WithoutCancel(ctx))
	c1, err := readPGCounters(ctx, w.conn)
	if err != nil {
		return nil
	}
	p, c0 := &w.phase, w.c0
	p.CheckpointsTimed, p.CheckpointsRequested = c1.timed-c0.timed, c1.req-c0.req
	p.LastCheckpoint, p.CheckpointEnded = c1.last, c1.lastLSN != c0.lastLSN
	p.BuffersCheckpoint, p.BuffersBackend = c1.bufCkpt-c0.bufCkpt, c1.bufBackend-c0.bufBackend
	p.CheckpointWriteMs, p.CheckpointSyncMs = c1.writeMs-c0.writeMs, c1.syncMs-c0.syncMs
	p.WALBytes, p.WALWrites, p.WALSyncs = c1.walBytes-c0.walBytes, c1.walWrites-c0.walWrites, c1.walSyncs-c0.walSyncs
	for sec := range min(len(timeline), len(w.perSec)) {
		s := w.perSec[sec]
		events := make([]string, 0, len(w.seen[sec]))
		for e := range w.seen[sec] {
			events = append(events, e)
		}
		slices.Sort(events)
		s.Checkpointer = strings.Join(events, ",")
		timeline[sec].PG = &s
	}
	return p
}

// String is the phase's PostgreSQL line of the progress log.
func (p *PGPhase) String() string {
	return fmt.Sprintf("checkpoints started %d timed, %d requested; one ended: %v (the last began %s); %d buffers written by checkpoints (write %.0f ms, sync %.0f ms), %d by backends; WAL %.1f MiB, %d writes, %d syncs; backends waiting on the WAL %.2f a sample; autovacuum workers %.2f a sample; the checkpointer's samples %v; the client backends' waits %v",
		p.CheckpointsTimed, p.CheckpointsRequested, p.CheckpointEnded, p.LastCheckpoint.UTC().Format(time.TimeOnly),
		p.BuffersCheckpoint, p.CheckpointWriteMs, p.CheckpointSyncMs, p.BuffersBackend,
		float64(p.WALBytes)/(1<<20), p.WALWrites, p.WALSyncs, float64(p.WALWaits)/float64(max(p.Samples, 1)), float64(p.Autovacuum)/float64(max(p.Samples, 1)), p.CheckpointerSamples, p.BackendWaits)
}

// kernelDirty reads the kernel's Dirty and Writeback pages from
// /proc/meminfo, in MiB (0, 0 when it cannot).
func kernelDirty() (dirty, writeback int64) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kib, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Dirty:":
			dirty = kib >> 10
		case "Writeback:":
			writeback = kib >> 10
		}
	}
	return dirty, writeback
}

// closeSched sets s's scheduler waits from the histogram's counts since
// the last call.
func (w *pgWatch) closeSched(s *PGSecond) {
	buckets, counts := schedLatencies()
	if len(counts) != len(w.sched) {
		w.sched = counts
		return
	}
	var n uint64
	diff := make([]uint64, len(counts))
	for i := range counts {
		diff[i] = counts[i] - w.sched[i]
		n += diff[i]
	}
	w.sched = counts
	var seen uint64
	for i, d := range diff {
		lo, hi := buckets[i], buckets[i+1]
		if math.IsInf(lo, -1) {
			lo = 0
		}
		if math.IsInf(hi, 1) {
			hi = lo
		}
		s.SchedWaitMs += float64(d) * (lo + hi) / 2 * 1000
		if seen < n-n/100 && seen+d >= n-n/100 && n > 0 {
			s.SchedP99Ms = hi * 1000
		}
		seen += d
	}
}

// schedLatencies reads runtime/metrics' /sched/latencies:seconds.
func schedLatencies() (buckets []float64, counts []uint64) {
	m := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil, nil
	}
	h := m[0].Value.Float64Histogram()
	return h.Buckets, slices.Clone(h.Counts)
}
