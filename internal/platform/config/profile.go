package config

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/metrics"
	"runtime/pprof"
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

// heapSampleEvery is how often --memprofile reads the heap in use.
const heapSampleEvery = 200 * time.Millisecond

// ProfileFlags are --cpuprofile and --memprofile.
func ProfileFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: FlagCPUProfile, Usage: "write a CPU profile of the whole run to this file (go tool pprof)", Sources: cli.EnvVars(EnvCPUProfile), TakesFile: true},
		&cli.StringFlag{Name: FlagMemProfile, Usage: "write a heap profile to this file, taken when the heap in use was at its peak (read every 200 ms; go tool pprof -sample_index=inuse_space)", Sources: cli.EnvVars(EnvMemProfile), TakesFile: true},
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

// peakHeapProfile keeps, in memory, the heap profile taken at the highest
// heap in use seen so far (the profile is of the live objects of the last
// collection before it), and writes it to path when stopped.
func peakHeapProfile(path string) func() error {
	var (
		best  []byte // written by the sampler, read once it has ended
		peak  uint64
		done  = make(chan struct{})
		ended = make(chan struct{})
	)
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	take := func() {
		metrics.Read(sample)
		inUse := sample[0].Value.Uint64()
		if inUse <= peak+peak/20 && best != nil { // 5% above the last peak before another
			return
		}
		var b bytes.Buffer
		if pprof.Lookup("heap").WriteTo(&b, 0) == nil {
			best, peak = b.Bytes(), inUse
		}
	}
	go func() {
		defer close(ended)
		t := time.NewTicker(heapSampleEvery)
		defer t.Stop()
		for {
			take()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() error {
		close(done)
		<-ended
		take()
		if err := os.WriteFile(path, best, 0o644); err != nil {
			return fmt.Errorf("config: --%s: %w", FlagMemProfile, err)
		}
		return nil
	}
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
