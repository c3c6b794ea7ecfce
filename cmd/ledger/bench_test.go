package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/bench"
)

// TestBenchRefusesAnUnknownEventStore: --event-store (or LEDGER_BENCH_EVENT_STORE)
// takes postgres, kurrenttest or a KurrentDB URL; anything else, a PostgreSQL URL
// too, is refused with status 2 before anything starts.
func TestBenchRefusesAnUnknownEventStore(t *testing.T) {
	for _, c := range []struct{ flag, env string }{
		{flag: "bogus"},
		{flag: "postgres://localhost/ledger"},
		{env: "kurrent"},
	} {
		t.Setenv("LEDGER_BENCH_EVENT_STORE", c.env)
		args := []string{"ledger", "bench"}
		if c.flag != "" {
			args = append(args, "--event-store", c.flag)
		}
		var out bytes.Buffer
		a := newApp()
		a.Writer, a.ErrWriter = &out, &out
		err := a.Run(context.Background(), args)
		var ec cli.ExitCoder
		if err == nil || !errors.As(err, &ec) || ec.ExitCode() != 2 || !strings.Contains(err.Error(), "--event-store") {
			t.Errorf("%v (env %q): %v", args, c.env, err)
		}
	}
}

// TestBenchRefusesABadFlag: every rule of bench.Config.Check, reached through
// its flag, is refused with status 2 and its message before anything starts
// (each case would otherwise start a cluster and run for minutes: the run's
// context is cancelled, so that a rule lost fails the case at once).
func TestBenchRefusesABadFlag(t *testing.T) {
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--clients", "0"}, "--clients, --accounts and --duration must be positive"},
		{[]string{"--accounts", "-1"}, "--clients, --accounts and --duration must be positive"},
		{[]string{"--duration", "0s"}, "--clients, --accounts and --duration must be positive"},
		{[]string{"--duplicate-ratio", "1"}, "duplicate ratio must be in [0, 1)"},
		{[]string{"--skew", "-0.5"}, "skew must be >= 0"},
		{[]string{"--transaction-ratio", "1.5", "--systems", "ledger"}, "transaction ratio must be in [0, 1]"},
		{[]string{"--open-loop-fractions", "0.5,1.5"}, `--open-loop-fractions: "1.5" is not a fraction in (0, 1]`},
		{[]string{"--open-loop-fractions", "half"}, `--open-loop-fractions: "half" is not a fraction in (0, 1]`},
		{[]string{"--systems", "ledger,other"}, "systems are ledger, baseline and echo"},
		{[]string{"--systems", "none,ledger"}, "systems are ledger, baseline and echo (or none alone)"},
		{[]string{"--transaction-ratio", "0.5"}, "use --systems ledger"},
		{[]string{"--many-accounts", "-1"}, "many accounts must be >= 0"},
		{[]string{"--history", "-1"}, "history events must be >= 0"},
		{[]string{"--history", "10", "--accounts", "1"}, "a history needs two accounts"},
		{[]string{"--transaction-ratio", "0.5", "--systems", "ledger", "--accounts", "1"}, "a transaction needs two accounts"},
		{[]string{"--grace", "-1s"}, "--grace must not be negative"},
		{[]string{"--batch-size", "1001"}, "batch size 1001 is over the protocol's 1000 commands"},
		{[]string{"--history", "10", "--history-memory-limit", "lots"}, "--history-memory-limit: "},
		{[]string{"--systems", "none", "--many-accounts", "10"}, "--many-accounts asks for phases of the ledger, and --systems none does not drive it"},
		{[]string{"--systems", "baseline", "--many-accounts", "10"}, "--many-accounts asks for phases of the ledger, and --systems baseline does not drive it"},
		{[]string{"--systems", "baseline,echo", "--many-accounts", "10"}, "--systems baseline,echo does not drive it"},
		{[]string{"--systems", "none", "--jetstream-messages", "5"}, "--jetstream-messages asks for the JetStream phases, and --systems none drives no system"},
		{[]string{"--systems", "echo", "--jetstream-messages", "5"}, "--jetstream-messages asks for the JetStream phases, and --systems echo drives neither the ledger nor the baseline"},
		{[]string{"--capture=false", "--jetstream-messages", "5"}, "--jetstream-messages asks for the JetStream phases, and they need the capture (--capture=false)"},
		{[]string{"--quick", "--jetstream-messages", "5"}, "--jetstream-messages asks for the JetStream phases, and they need the capture (--capture=false, --quick's default)"},
		{[]string{"--event-store", "kurrenttest", "--many-unsettled"}, "--many-unsettled asks for a change of the many-accounts phases, and the bench settles nothing on KurrentDB (--event-store kurrenttest)"},
		{[]string{"--systems", "none", "--many-cold"}, "--many-cold asks for a change of the many-accounts phases, and they do not run"},
		{[]string{"--systems", "none", "--many-unsettled"}, "--many-unsettled asks for a change of the many-accounts phases, and they do not run"},
		{[]string{"--systems", "baseline", "--many-cold"}, "--many-cold asks for a change of the many-accounts phases, and they do not run (--systems baseline does not drive the ledger)"},
		{[]string{"--systems", "ledger", "--many-accounts", "0", "--many-unsettled"}, "--many-unsettled asks for a change of the many-accounts phases, and they do not run (--many-accounts 0)"},
		{[]string{"--quick", "--many-cold"}, "--many-cold asks for a change of the many-accounts phases, and they do not run (--many-accounts 0, --quick's default)"},
		{[]string{"--quick", "--many-unsettled"}, "--many-unsettled asks for a change of the many-accounts phases, and they do not run (--many-accounts 0, --quick's default)"},
		{[]string{"--systems", "none", "--quick", "--many-cold"}, "they do not run (--systems none does not drive the ledger)"},
		{[]string{"--key-check-events", "0", "--key-check-samples", "50"}, "--key-check-samples asks for a change of the key-check phase, and the key-check phase does not run (--key-check-events 0)"},
		{[]string{"--history-snapshot-every", "50"}, "--history-snapshot-every asks for a change of the history phase, and the history phase does not run (--history 0, the default)"},
		{[]string{"--history", "0", "--history-memory-limit", "1GiB"}, "--history-memory-limit asks for a change of the history phase, and the history phase does not run"},
		{[]string{"--systems", "none", "--open-loop-fractions", "0.5"}, "--open-loop-fractions asks for the open-loop phases, and --systems none drives no system"},
		{[]string{"--systems", "none", "--batch-size", "10"}, "--batch-size asks for a change of the batch phases, and --systems none drives no system"},
	} {
		refusedWithStatus2(t, stopped, c.args, c.want)
	}
}

// TestBenchTargetRefusesEveryOtherPhaseFlag: --target-nats-url runs the
// warm-up and the load phase alone (bench.runTarget), so each flag of
// another phase, and --standby, set explicitly (on the command line or in
// the environment, at any value that asks for its phases), is refused with
// status 2 and the cause, before anything is dialled; left unset, each is
// off (TestBenchTargetTakesTheOtherPhasesOff).
func TestBenchTargetRefusesEveryOtherPhaseFlag(t *testing.T) {
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	target := []string{"--target-nats-url", "nats://127.0.0.1:1"}
	const cause = "--target-nats-url runs the warm-up and the load phase alone, against a ledger in another process, and starts nothing: leave "
	for _, c := range []struct {
		args   []string
		phases string
	}{
		{[]string{"--jetstream-messages", "5"}, "the JetStream phases"},
		{[]string{"--many-accounts", "10"}, "phases of the ledger"},
		{[]string{"--many-cold"}, "a change of the many-accounts phases"},
		{[]string{"--many-unsettled"}, "a change of the many-accounts phases"},
		{[]string{"--key-check-events", "10"}, "the key-check phase"},
		{[]string{"--key-check-samples", "400"}, "a change of the key-check phase"},
		{[]string{"--projection-timeout", "1s"}, "the projection phase"},
		{[]string{"--history", "1000"}, "the history phase"},
		{[]string{"--history-snapshot-every", "1000"}, "a change of the history phase"},
		{[]string{"--history-memory-limit", "1GiB"}, "a change of the history phase"},
		{[]string{"--open-loop-fractions", "0.5"}, "the open-loop phases"},
		{[]string{"--batch-size", "100"}, "a change of the batch phases"},
		{[]string{"--systems", "baseline"}, "the phases of systems besides the ledger"},
		{[]string{"--systems", "ledger,baseline"}, "the phases of systems besides the ledger"},
		{[]string{"--systems", "none"}, "the phases of systems besides the ledger"},
	} {
		flag := c.args[0]
		refusedWithStatus2(t, stopped, append(c.args, target...), "bench: "+flag+" asks for "+c.phases)
		refusedWithStatus2(t, stopped, append(c.args, target...), cause+flag+" out or drop --target-nats-url")
	}
	env := "LEDGER_BENCH_HISTORY" // set in the environment, as explicitly as on the command line
	t.Setenv(env, "1000")
	refusedWithStatus2(t, stopped, target, "bench: --history asks for the history phase, and --target-nats-url runs")
}

// TestBenchTargetRefusesItsOwnSystemsFlags: under --target-nats-url every
// flag of the systems under test but the target's own, set explicitly (on
// the command line or in the environment, at any value), is refused with
// status 2 before anything is dialled: each sets up a part of this process,
// which the target run does not start, and its value would describe a
// system the run did not measure (--systems: TestBenchTargetRefusesEveryOtherPhaseFlag).
// So is a trace or profile of a phase the target run does not run;
// --systems ledger and a trace of ledger/load are taken.
func TestBenchTargetRefusesItsOwnSystemsFlags(t *testing.T) {
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	target := []string{"--target-nats-url", "nats://127.0.0.1:1"}
	values := map[string]string{flagBenchEventStore: bench.EventStorePostgres, flagBenchNATSSync: "always", flagBenchLedgerDB: "postgres://127.0.0.1:1/l", flagBenchBaselineDB: "postgres://127.0.0.1:1/b"}
	checked := 0
	for _, f := range benchCommand().Flags {
		c, ok := f.(cli.CategorizableFlag)
		name := f.Names()[0]
		if !ok || c.GetCategory() != categorySUT || name == flagBenchTarget || name == flagBenchSystems {
			continue
		}
		arg := "--" + name + "=" + values[name]
		switch f.(type) {
		case *cli.BoolFlag:
			arg = "--" + name + "=true"
		case *cli.IntFlag:
			arg = "--" + name + "=1"
		case *cli.DurationFlag:
			arg = "--" + name + "=1s"
		case *cli.StringFlag:
			if values[name] == "" {
				arg = "--" + name + "=" + t.TempDir()
			}
		}
		refusedWithStatus2(t, stopped, append([]string{arg}, target...), "bench: --"+name+" sets up a system of this process, and --target-nats-url starts nothing")
		checked++
	}
	if checked < 15 {
		t.Fatalf("%d flags of the systems under test checked", checked)
	}
	t.Run("environment", func(t *testing.T) { // set in the environment, as explicitly as on the command line
		t.Setenv("LEDGER_BENCH_NO_FSYNC", "true")
		refusedWithStatus2(t, stopped, target, "bench: --no-fsync sets up a system of this process")
	})
	refusedWithStatus2(t, stopped, append([]string{"--trace", filepath.Join(t.TempDir(), "t")}, target...), "bench: --trace-phase "+bench.SystemLedger+"/"+bench.PhaseManyHalfLoad+" names a phase --target-nats-url does not run")
	refusedWithStatus2(t, stopped, append([]string{"--cpuprofile", filepath.Join(t.TempDir(), "c"), "--cpuprofile-phase", "ledger/hot"}, target...), "bench: --cpuprofile-phase ledger/hot names a phase")
	refusedWithStatus2(t, stopped, append([]string{"--memprofile", filepath.Join(t.TempDir(), "m"), "--cpuprofile-phase", "ledger/hot"}, target...), "bench: --cpuprofile-phase ledger/hot names a phase")
	for _, args := range [][]string{
		{"--systems", "ledger"},
		{"--trace", filepath.Join(t.TempDir(), "t"), "--trace-phase", "ledger/load"},
		{"--cpuprofile", filepath.Join(t.TempDir(), "c")},
		{"--memprofile", filepath.Join(t.TempDir(), "m")},
		{"--cpuprofile", filepath.Join(t.TempDir(), "c"), "--cpuprofile-phase", "ledger/load"},
	} {
		cmd := benchCommand()
		cmd.Action = func(_ context.Context, cmd *cli.Command) error {
			_, err := benchConfig(cmd)
			return err
		}
		if err := cmd.Run(context.Background(), append(append([]string{"bench"}, args...), target...)); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestBenchTargetTakesTheOtherPhasesOff: under --target-nats-url the
// phases it does not run are off when their flags are left unset (or set
// to their none), so that the report does not name them, and the flags of
// the load phase it runs are taken.
func TestBenchTargetTakesTheOtherPhasesOff(t *testing.T) {
	for _, args := range [][]string{
		{"--target-nats-url", "nats://127.0.0.1:1"},
		{"--target-nats-url", "nats://127.0.0.1:1", "--quick", "--history", "0", "--key-check-events", "0", "--many-accounts", "0", "--duration", "7s", "--clients", "3"},
		{"--target-nats-url", "nats://127.0.0.1:1", "--systems", "ledger", "--transaction-ratio", "0.5"}, // the ledger's alone: transactions too
	} {
		var cfg bench.Config
		cmd := benchCommand()
		cmd.Action = func(_ context.Context, cmd *cli.Command) (err error) {
			cfg, err = benchConfig(cmd)
			return err
		}
		if err := cmd.Run(context.Background(), append([]string{"bench"}, args...)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if cfg.JetStreamMessages != 0 || cfg.ManyAccounts != 0 || cfg.KeyCheckEvents != 0 || cfg.ProjectionTimeout != 0 || cfg.HistoryEvents != 0 || cfg.HistoryMemoryLimitSet || cfg.Standby {
			t.Errorf("%v: another phase left on: %+v", args, cfg)
		}
		if cfg.TargetNATSURL == "" || cfg.Duration <= 0 || cfg.Clients <= 0 || !slices.Equal(cfg.Systems, []string{bench.SystemLedger}) {
			t.Errorf("%v: the load phase's configuration lost: %+v", args, cfg)
		}
	}
}

// refusedWithStatus2 runs ledger bench with args under stopped (a context
// already cancelled, so that a rule lost fails at once rather than start a
// run) and fails t unless it ends with status 2 and an error holding want.
func refusedWithStatus2(t *testing.T, stopped context.Context, args []string, want string) {
	t.Helper()
	args = append([]string{"ledger", "bench"}, args...)
	var out bytes.Buffer
	a := newApp()
	a.Writer, a.ErrWriter = &out, &out
	err := a.Run(stopped, args)
	var ec cli.ExitCoder
	if err == nil || !errors.As(err, &ec) || ec.ExitCode() != 2 || !strings.Contains(err.Error(), want) {
		t.Errorf("%v: %v, want status 2 and %q", args, err, want)
	}
}

// TestBenchSystemsNoneLeavesTheDrivenPhasesOut: --systems none takes the
// phases of a driven system (JetStream, many accounts) off by default,
// where the other systems keep them, and takes them off when set to 0; a
// run that does not drive the ledger (--systems baseline) takes its
// many-accounts phases off; a run without the capture (--capture=false,
// --quick) or with echo alone takes the JetStream phases off; asked for,
// they are refused (TestBenchRefusesABadFlag). --standby is taken by every
// run.
func TestBenchSystemsNoneLeavesTheDrivenPhasesOut(t *testing.T) {
	d := bench.Defaults()
	for _, c := range []struct {
		args     []string
		js, many int
	}{
		{[]string{"--systems", "none"}, 0, 0},
		{[]string{"--systems", "none", "--many-accounts", "0", "--jetstream-messages", "0"}, 0, 0},
		{[]string{"--systems", "none", "--standby"}, 0, 0}, // the store a pair for the phases that run
		{[]string{"--systems", "ledger"}, d.JetStreamMessages, d.ManyAccounts},
		{[]string{"--systems", "baseline"}, d.JetStreamMessages, 0},
		{[]string{"--systems", "baseline", "--standby", "--many-accounts", "0"}, d.JetStreamMessages, 0}, // the baseline's commits wait for the standby
		{[]string{"--systems", "ledger,baseline", "--many-accounts", "7", "--many-cold", "--many-unsettled"}, d.JetStreamMessages, 7},
		// where the JetStream phases do not run, their default is off, not refused
		{[]string{"--capture=false"}, 0, d.ManyAccounts},
		{[]string{"--systems", "echo"}, 0, 0},
		{[]string{"--systems", "echo,ledger"}, d.JetStreamMessages, d.ManyAccounts},
		{[]string{"--quick"}, 0, 0},
		{[]string{"--quick", "--capture"}, d.Quick().JetStreamMessages, 0},
		{[]string{"--event-store", "kurrenttest", "--many-cold"}, d.JetStreamMessages, d.ManyAccounts},
		// a change of a phase that runs is taken
		{[]string{"--systems", "none", "--history", "10", "--history-snapshot-every", "5", "--history-memory-limit", "1GiB", "--key-check-samples", "5"}, 0, 0},
		{[]string{"--systems", "ledger", "--open-loop-fractions", "0.5", "--batch-size", "10", "--many-accounts", "0"}, d.JetStreamMessages, 0},
	} {
		var cfg bench.Config
		cmd := benchCommand()
		cmd.Action = func(_ context.Context, cmd *cli.Command) (err error) {
			cfg, err = benchConfig(cmd)
			return err
		}
		if err := cmd.Run(context.Background(), append([]string{"bench"}, c.args...)); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if cfg.JetStreamMessages != c.js || cfg.ManyAccounts != c.many {
			t.Errorf("%v: %d JetStream messages, %d many accounts, want %d and %d", c.args, cfg.JetStreamMessages, cfg.ManyAccounts, c.js, c.many)
		}
	}
}

// TestBenchPrintsAnInterruptedHistoryOnlyRun: a --systems none run
// interrupted while it seeds its history (bench.Run returns the report so
// far: no phase, the history's seeding measured) prints that report, as an
// interrupted run of the systems prints its phases, and ends with status
// ExitStopped; its JSON was written before.
func TestBenchPrintsAnInterruptedHistoryOnlyRun(t *testing.T) {
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	rep := &bench.Report{History: &bench.HistoryReport{Accounts: 100, Seeded: 52000, SeedSeconds: 3.5, FirstAccount: "hist1-acc-0", LastAccount: "hist1-acc-99"}}
	var out bytes.Buffer
	err := benchFailed(stopped, &out, rep, stopped.Err(), 4*time.Second)
	var ec cli.ExitCoder
	if !errors.As(err, &ec) || ec.ExitCode() != config.ExitStopped || !strings.Contains(err.Error(), "bench interrupted after 4s") {
		t.Errorf("status and error %v, want %d and the interruption", err, config.ExitStopped)
	}
	if want := "history: 52000 events seeded over 100 accounts in 3.5s"; !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "no system driven") {
		t.Errorf("printed %q, want the history's line %q", out.String(), want)
	}
	for _, unmeasured := range []string{"events/s", "0 events in 0.0s"} { // neither tool ran
		if strings.Contains(out.String(), unmeasured) {
			t.Errorf("printed %q: the rebuild and the audit never ran", unmeasured)
		}
	}
	out.Reset()
	rep.History.Rebuild = bench.ToolRun{Events: 52000, Seconds: 2, EventsPerSec: 26000}
	_ = benchFailed(stopped, &out, rep, stopped.Err(), 4*time.Second)
	if got := out.String(); !strings.Contains(got, "rebuild events/s: 26000\n") || strings.Contains(got, "audit events/s") || !strings.Contains(got, "audit (read models compared): not run") {
		t.Errorf("interrupted after its rebuild, printed %q, want the rebuild's rate and the audit not run", got)
	}
	out.Reset()
	if err := benchFailed(stopped, &out, &bench.Report{}, stopped.Err(), time.Second); err == nil || out.Len() != 0 {
		t.Errorf("a run interrupted before it measured anything printed %q (%v), want nothing", out.String(), err)
	}
}
