package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/bench"
)

// benchOutputs are the profiles and the trace ledger bench writes, started
// and stopped by the phase hooks (--cpuprofile-phase, --trace-phase).
type benchOutputs struct {
	hooks []func(system, name string, start bool)
	files []*os.File
}

// openBenchOutputs creates the files of --memprofile, --trace and
// --cpuprofile and the hooks that write them; a CPU profile of the whole
// run starts at once.
func openBenchOutputs(cmd *cli.Command, progress *slog.Logger) (*benchOutputs, error) {
	o := &benchOutputs{}
	create := func(flag string) (*os.File, error) {
		p := cmd.String(flag)
		if p == "" {
			return nil, nil
		}
		f, err := os.Create(p)
		if err != nil {
			o.close()
			return nil, config.Exit(2, err)
		}
		o.files = append(o.files, f)
		return f, nil
	}
	profPhase := cmd.String(flagBenchProfPhase)
	if f, err := create(flagBenchMemProfile); err != nil {
		return nil, err
	} else if f != nil {
		phase := profPhase
		if phase == "" {
			phase = bench.SystemLedger + "/" + bench.PhaseLoad
		}
		o.hooks = append(o.hooks, heapProfilePhase(f, phase, progress))
	}
	if f, err := create(flagBenchTrace); err != nil {
		return nil, err
	} else if f != nil {
		o.hooks = append(o.hooks, startStopPhase(cmd.String(flagBenchTracePhase), "trace", func() error { return trace.Start(f) }, trace.Stop, progress))
	}
	if f, err := create(flagBenchCPUProfile); err != nil {
		return nil, err
	} else if f != nil && profPhase != "" {
		o.hooks = append(o.hooks, startStopPhase(profPhase, "cpu profile", func() error { return pprof.StartCPUProfile(f) }, pprof.StopCPUProfile, progress))
	} else if f != nil {
		if err := pprof.StartCPUProfile(f); err != nil {
			o.close()
			return nil, err
		}
	}
	return o, nil
}

// hook is bench.Config.PhaseHook: every output's hook.
func (o *benchOutputs) hook(system, name string, start bool) {
	for _, h := range o.hooks {
		h(system, name, start)
	}
}

// close stops what is still being written (a run interrupted mid-phase)
// and closes the files; it may be called twice.
func (o *benchOutputs) close() {
	pprof.StopCPUProfile()
	trace.Stop()
	for _, f := range o.files {
		f.Close()
	}
	o.files = nil
}

// heapProfilePhase writes a heap profile of the live objects into f as the
// phase named phase (system/phase) ends.
func heapProfilePhase(f io.Writer, phase string, progress *slog.Logger) func(system, name string, start bool) {
	return func(system, name string, start bool) {
		if start || system+"/"+name != phase {
			return
		}
		runtime.GC() // the profile then shows what is live
		if err := pprof.WriteHeapProfile(f); err != nil {
			progress.Error("heap profile", "err", err)
		}
	}
}

// startStopPhase is a phase hook that calls start as the phase named phase
// (system/phase) begins and stop as it ends: a CPU profile, a trace.
func startStopPhase(phase, what string, start func() error, stop func(), progress *slog.Logger) func(system, name string, begins bool) {
	return func(system, name string, begins bool) {
		if system+"/"+name != phase {
			return
		}
		if !begins {
			stop()
			return
		}
		if err := start(); err != nil {
			progress.Error(what, "err", err)
		}
	}
}

// writeBenchReports writes the report as JSON and as Markdown where asked.
func writeBenchReports(cmd *cli.Command, rep *bench.Report, progress *slog.Logger) {
	if rep == nil {
		return
	}
	if p := cmd.String(flagBenchJSON); p != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(p, append(b, '\n'), 0o644)
		}
		if err != nil {
			progress.Error("write JSON report", "err", err)
		}
	}
	if p := cmd.String(flagBenchMarkdown); p != "" {
		var b strings.Builder
		rep.Markdown(&b)
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			progress.Error("write Markdown report", "err", err)
		}
	}
}
