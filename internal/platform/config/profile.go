package config

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/urfave/cli/v3"
)

// The read tools' profiles: --cpuprofile (LEDGER_CPUPROFILE) and --memprofile
// (LEDGER_MEMPROFILE).
const (
	FlagCPUProfile = "cpuprofile"
	FlagMemProfile = "memprofile"
	EnvCPUProfile  = "LEDGER_CPUPROFILE"
	EnvMemProfile  = "LEDGER_MEMPROFILE"
)

// --memprofile's sampler: how often it reads the live heap (as the last
// collection marked it), the growth of the live heap over the one that last
// made it force a collection that makes it force another, and how often at
// most it forces one.
const (
	heapSampleEvery = 100 * time.Millisecond
	heapGrowth      = 20 // 1/20: 5%
	heapForceEvery  = time.Second
)

// ProfileFlags are --cpuprofile and --memprofile.
func ProfileFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: FlagCPUProfile, Usage: "write a CPU profile of the whole run to this file (go tool pprof)", Sources: cli.EnvVars(EnvCPUProfile), TakesFile: true},
		&cli.StringFlag{Name: FlagMemProfile, Usage: "write a heap profile to this file: the objects live at the highest live heap of the run (the live heap is read as each collection marked it, every 100 ms; at a new high, 5% over the last, a collection is forced, at most one a second, and the profile taken right after it, of what that collection found live; go tool pprof -sample_index=inuse_space)", Sources: cli.EnvVars(EnvMemProfile), TakesFile: true},
	}
}

// StartProfiles starts the profiles cmd's ProfileFlags ask for; stop ends
// them and writes the files.
func StartProfiles(cmd *cli.Command) (stop func() error, err error) {
	var stops []func() error
	stop = func() error {
		var first error
		for _, s := range stops {
			if err := s(); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	if path := cmd.String(FlagCPUProfile); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return nil, fmt.Errorf("config: --%s: %w", FlagCPUProfile, err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("config: --%s: %w", FlagCPUProfile, err)
		}
		stops = append(stops, func() error { pprof.StopCPUProfile(); return f.Close() })
	}
	if path := cmd.String(FlagMemProfile); path != "" {
		stops = append(stops, peakHeapProfile(path))
	}
	return stop, nil
}

// peakHeapProfile starts --memprofile's sampler (heapPeak) and returns what
// stops it and writes its profile to path.
func peakHeapProfile(path string) func() error {
	return startHeapPeak(path, heapSampleEvery).stop
}

// heapPeak keeps, in memory, the heap profile taken at the highest live heap
// seen so far, and writes it to path when stopped. It reads the live heap
// (/gc/heap/live:bytes, what the last collection marked: not the heap in
// use, which holds the garbage not yet collected) every so often; once it has
// grown by 1/heapGrowth over what the collection it last forced found (and
// not within heapForceEvery of that), it forces a collection and takes the
// profile right after it. A profile is of the objects live at a collection, and a forced
// one's is complete at once (a collection of the runtime's own publishes the
// one before it): so the kept profile is of the collection that found the
// most live, and that is its peak, within a growth step. Live as the
// collector counts it (as gctrace does): what the program allocates while a
// collection marks counts as live in it, so a profile forced while a tool
// allocates its pages holds some of them.
type heapPeak struct {
	path   string
	sample []metrics.Sample
	seen   uint64    // the live heap the collection it last forced found
	forced time.Time // when it did
	done   chan struct{}
	ended  chan struct{}

	mu   sync.Mutex
	best []byte // the profile kept
	peak uint64 // the live heap of the collection best was taken after
}

func startHeapPeak(path string, every time.Duration) *heapPeak {
	h := &heapPeak{path: path, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}, done: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(h.ended)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-h.done:
				return
			case <-t.C:
				h.poll(false)
			}
		}
	}()
	return h
}

// live is the live heap the last collection marked.
func (h *heapPeak) live() uint64 {
	metrics.Read(h.sample)
	return h.sample[0].Value.Uint64()
}

// poll forces a collection and takes the profile after it when the live heap
// has grown enough since the last one forced (or when force), keeping the
// profile if that collection found more live than the kept one's.
func (h *heapPeak) poll(force bool) {
	seen := h.live()
	if !force && (seen <= h.seen+h.seen/heapGrowth || time.Since(h.forced) < heapForceEvery) {
		return
	}
	runtime.GC()
	live := h.live()
	h.seen, h.forced = live, time.Now() // what it found, not the reading that made it force one
	var b bytes.Buffer
	if pprof.Lookup("heap").WriteTo(&b, 0) != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.best == nil || live > h.peak {
		h.best, h.peak = b.Bytes(), live
	}
}

// peakBytes is the live heap of the collection the kept profile was taken
// after (0: none yet).
func (h *heapPeak) peakBytes() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak
}

// stop ends the sampler, polls once more (a profile is taken if none was) and
// writes the kept profile.
func (h *heapPeak) stop() error {
	close(h.done)
	<-h.ended
	h.poll(h.peakBytes() == 0)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := os.WriteFile(h.path, h.best, 0o644); err != nil {
		return fmt.Errorf("config: --%s: %w", FlagMemProfile, err)
	}
	return nil
}

// ReadToolStart is LoggerFromCommand for a command of ReadToolFlags (or of
// LogFlags and ProfileFlags, as ledger serve and dev), with its profiles
// started; finish stops them (a profile it cannot write is logged).
func ReadToolStart(cmd *cli.Command, w io.Writer) (log *slog.Logger, finish func(), err error) {
	if log, err = LoggerFromCommand(cmd, w); err != nil {
		return nil, nil, Exit(2, err)
	}
	stop, err := StartProfiles(cmd)
	if err != nil {
		return nil, nil, Exit(2, err)
	}
	return log, func() {
		if err := stop(); err != nil {
			log.Error("profile not written", "err", err)
		}
	}, nil
}
