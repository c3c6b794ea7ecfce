// Command chaos is the ledger's fault-injection suite, modelled on Jepsen's bank
// and idempotence workloads: it runs nats-server, `ledger serve`, `projector run`
// and PostgreSQL as separate processes on loopback, attacks them (kills,
// restarts, redeliveries, partitions through its own TCP proxy), records every
// client attempt (ok, failed, indefinite) and checks, from the event store and
// the read models, that nothing was lost or doubled (checks C1..C8).
//
//	go run ./chaos            # the full suite (≤ 14 min)
//	go run ./chaos --quick    # scaled down (≤ 6 min), what CI runs
//	go run ./chaos --seed N   # replay a run
//
// Every run prints its seed; the last line is "N passed, M failed".
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/platform/freeport"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "nats-server" {
		os.Exit(natsServerMain(os.Args[2:]))
	}
	os.Exit(run())
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// result is one scenario's figures and verdict.
type result struct {
	id, name   string
	err        error
	report     *Report
	stats      Stats
	ev         Evidence
	recoverMax time.Duration
	took       time.Duration
	notes      []string
	// failpoints counts the ledger's deaths by failpoint (scenario 3).
	failpoints map[string]int
}

func (r *result) ok() bool { return r.err == nil && r.report != nil && r.report.OK() }

type scenario struct {
	id   string
	name string
	run  func(ctx context.Context, s *suite, res *result) error
}

func run() int {
	o := parseFlags()
	fmt.Printf("chaos: seed %d (%s run; replay with --seed %d%s)\n", o.seed, o.mode(), o.seed, map[bool]string{true: " --quick", false: ""}[o.quick])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	budget := 14 * time.Minute // 12 before scenario 13 (about 2 min)
	if o.quick {
		budget = 6 * time.Minute // 3 min before scenario 12 (about 1 min), 13 (about 1 min)
	}
	ctx, cancel := context.WithTimeout(ctx, budget+2*time.Minute) // a hard stop beyond the budget
	defer cancel()

	workDir, err := makeWorkDir(o.dir)
	if err != nil {
		fmt.Println(err)
		fmt.Println("0 passed, 1 failed")
		return 1
	}
	keep := o.dir != ""
	s := newSuite(workDir, o)
	began := time.Now()
	if err := s.setUp(ctx); err != nil {
		fmt.Printf("setup: %v\n", err)
		fmt.Println("0 passed, 1 failed")
		return 1
	}
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 30*time.Second)
		defer c()
		s.cluster().Stop(sctx)
	}()
	fmt.Printf("chaos: binaries built and PostgreSQL up in %s; work dir %s\n", time.Since(began).Round(time.Millisecond), workDir)

	results := runScenarios(ctx, s, o.only)
	passed, failed := 0, 0
	for _, r := range results {
		if r.ok() {
			passed++
		} else {
			failed++
		}
	}
	total := time.Since(began)
	fmt.Printf("chaos: seed %d, %s in total (budget %s)\n", o.seed, total.Round(time.Second), budget)
	if total > budget {
		fmt.Printf("chaos: over the time budget\n")
		failed++
	}
	if failed == 0 && !keep {
		os.RemoveAll(workDir)
	} else {
		fmt.Printf("chaos: logs kept in %s\n", workDir)
	}
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return 1
	}
	return 0
}

// options are the command line's flags.
type options struct {
	seed    uint64
	quick   bool
	only    string
	dir     string
	verbose bool
	fuzz    time.Duration
}

// parseFlags reads the flags; a zero seed becomes a random one.
func parseFlags() options {
	var (
		seed    = flag.Uint64("seed", 0, "seed of the run (0: a random one, printed)")
		quick   = flag.Bool("quick", false, "scaled-down run (CI)")
		only    = flag.String("only", "", "comma-separated scenario numbers to run (default: all)")
		dir     = flag.String("dir", "", "working directory (default: a temporary one, removed after a passing run)")
		verbose = flag.Bool("v", false, "print progress")
		fuzz    = flag.Duration("fuzz", 0, "time of go test -fuzz in scenario 9 (default 30s, 10s with --quick)")
	)
	flag.Parse()
	if *seed == 0 {
		*seed = rand.Uint64() % 1_000_000_000
	}
	return options{seed: *seed, quick: *quick, only: *only, dir: *dir, verbose: *verbose, fuzz: *fuzz}
}

func (o options) mode() string {
	if o.quick {
		return "quick"
	}
	return "full"
}

// makeWorkDir makes dir, or a temporary directory when dir is "".
func makeWorkDir(dir string) (string, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "ledger-chaos-")
		if err != nil {
			return "", err
		}
		dir = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

func newSuite(workDir string, o options) *suite {
	s := &suite{dir: workDir, quick: o.quick, seed: o.seed, verbose: o.verbose, fuzzTime: o.fuzz}
	if s.fuzzTime == 0 {
		s.fuzzTime = 30 * time.Second
		if o.quick {
			s.fuzzTime = 5 * time.Second
		}
	}
	return s
}

// setUp builds the binaries and starts the suite's PostgreSQL.
func (s *suite) setUp(ctx context.Context) (err error) {
	s.ledgerBin, s.projectorBin, s.self, err = buildBinaries(ctx, filepath.Join(s.dir, "bin"))
	if err != nil {
		return err
	}
	s.pgDir = filepath.Join(s.dir, "pg")
	if s.pgPort, err = freeport.Loopback(); err != nil {
		return err
	}
	s.pg, err = pgcluster.Start(ctx, pgcluster.Options{Dir: s.pgDir, Port: s.pgPort, Fsync: true, Logger: quietLogger()})
	return err
}

// runScenarios runs the scenarios only names (comma-separated; "" for all),
// in order, until ctx ends, printing each one's result.
func runScenarios(ctx context.Context, s *suite, only string) []*result {
	var want []string
	if only != "" {
		want = strings.Split(only, ",")
	}
	var results []*result
	for _, sc := range scenarios() {
		if want != nil && !slices.Contains(want, sc.id) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		res := &result{id: sc.id, name: sc.name}
		t0 := time.Now()
		res.err = sc.run(ctx, s, res)
		res.took = time.Since(t0)
		printResult(res)
		results = append(results, res)
	}
	return results
}

func printResult(r *result) {
	verdict := "PASS"
	if !r.ok() {
		verdict = "FAIL"
	}
	recov := "-"
	if r.recoverMax > 0 {
		recov = r.recoverMax.Round(time.Millisecond).String()
	}
	fmt.Printf("scenario %-2s %-44s %s  commands=%d acked=%d indefinite=%d failed=%d duplicates=%d conflicts=%d redeliveries=%d kills=%d restarts=%d recover=%s events=%d took=%s\n",
		r.id, r.name, verdict, r.stats.Commands, r.stats.Acked, r.stats.Indefinite, r.stats.Failed, r.stats.Duplicates, r.stats.Conflicts,
		r.ev.Redeliveries, r.ev.Kills, r.ev.Restarts, recov, eventsOf(r.report), r.took.Round(100*time.Millisecond))
	if r.failpoints != nil {
		fmt.Printf("    failpoint deaths (each restarted): %s=%d %s=%d\n",
			natsapi.FailpointAfterCommitBeforeAck, r.failpoints[natsapi.FailpointAfterCommitBeforeAck],
			natsapi.FailpointAfterAckBeforeReply, r.failpoints[natsapi.FailpointAfterAckBeforeReply])
	}
	for _, n := range r.notes {
		fmt.Printf("    %s\n", n)
	}
	if r.err != nil {
		fmt.Printf("    error: %v\n", r.err)
	}
	if r.report != nil && !r.report.OK() {
		fmt.Print(r.report.String())
	}
}

func eventsOf(r *Report) int {
	if r == nil {
		return 0
	}
	return r.Events
}

func itoa(i int) string { return strconv.Itoa(i) }
