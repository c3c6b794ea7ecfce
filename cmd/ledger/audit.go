package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

func auditCommand() *cli.Command {
	flags := append(eventStoreFlags(),
		&cli.StringFlag{Name: "account", Usage: "check this account only (money conservation is still checked for the whole ledger)", Sources: cli.EnvVars("LEDGER_AUDIT_ACCOUNT")},
		&cli.BoolFlag{Name: "verify-chain", Usage: "recompute every stream's hash chain and name the first event whose stored content no longer matches", Sources: cli.EnvVars("LEDGER_AUDIT_VERIFY_CHAIN")},
		&cli.BoolFlag{Name: "read-models", Value: true, Usage: "compare every read model with the fold (needs --database-url)", Sources: cli.EnvVars("LEDGER_AUDIT_READ_MODELS")},
		&cli.BoolFlag{Name: "json", Usage: "print the report as JSON", Sources: cli.EnvVars("LEDGER_AUDIT_JSON")},
		&cli.BoolFlag{Name: "progress", Usage: "show a progress bar on stderr (events/s, time left)", Sources: cli.EnvVars("LEDGER_AUDIT_PROGRESS")},
		&cli.IntFlag{Name: "max-violations", Value: 1000, Usage: "violations listed (all are counted)", Sources: cli.EnvVars("LEDGER_AUDIT_MAX_VIOLATIONS")},
		&cli.StringFlag{Name: flagFrom, Usage: "check only the events after a stored audit checkpoint (its ID, or last), carrying its balances, chain heads and sagas in flight forward; what it trusts from before the checkpoint, which a full audit checks, is listed in its report (needs --database-url)", Sources: cli.EnvVars("LEDGER_AUDIT_FROM"),
			Validator: func(v string) error { _, err := parseFrom(v); return err }},
		&cli.StringFlag{Name: flagDropStop, Usage: "drop the stop point of a stopped full audit (its ID, as the stopped audit printed it, or last: the one stored) and its sets, under its run's lock, and do nothing else; refused (exit 1) while an audit runs it (a resume of it), exit 2 when it is not stored; alone (not with --from, --resume, --account, --expect-digest, --events-out) and needs --database-url", Sources: cli.EnvVars("LEDGER_AUDIT_DROP_STOP"),
			Validator: func(v string) error { _, err := parseDropStop(v); return err }},
		&cli.StringFlag{Name: flagExpectDigest, Usage: "with --from: refuse the checkpoint (exit 1, nothing stored) unless its digest is this one, as a clean audit printed it when it stored it: an anchor kept outside the database, which catches a checkpoint edited with its digests; with --resume, the stop point's, as the stopped audit printed it", Sources: cli.EnvVars("LEDGER_AUDIT_EXPECT_DIGEST")},
		&cli.BoolFlag{Name: flagResume, Usage: "fold on from the stop point a stopped full audit stored (SIGINT, SIGTERM) to the head, and report as one run through; refused (exit 1: start over without it) for a stop point edited since, of another build or store, whose sets are gone or not its own, run with other --verify-chain, --read-models or --max-violations than these, or with a read model whose checkpoint is before the stop; exit 2 when none is stored; not with --from or --account (needs --database-url)", Sources: cli.EnvVars("LEDGER_AUDIT_RESUME")},
		&cli.BoolFlag{Name: flagSaveCheckpoint, Value: true, Usage: "store a clean audit's result as an audit checkpoint for --from (needs --database-url; not with --account)", Sources: cli.EnvVars("LEDGER_AUDIT_SAVE_CHECKPOINT")},
		&cli.BoolFlag{Name: flagEventsOut, Usage: "compare LEDGER_EVENTS with the event store (invariant 8: every stored event up to the publisher's checkpoint, in order, none unstored; needs --database-url and NATS)", Sources: cli.EnvVars("LEDGER_AUDIT_EVENTS_OUT")},
		&cli.BoolFlag{Name: flagRepair, Usage: "with --events-out: republish the missing events under their IDs (takes the publisher's lease: stop the publishers first)", Sources: cli.EnvVars("LEDGER_AUDIT_REPAIR")},
		&cli.IntFlag{Name: flagMaxGaps, Value: audit.DefaultMaxGaps, Usage: "with --events-out: missing events kept to name and republish (all are counted; a repair of more takes several runs)", Sources: cli.EnvVars("LEDGER_AUDIT_MAX_GAPS"),
			Validator: func(n int) error {
				if n < 1 {
					return fmt.Errorf("--%s: %d: at least 1", flagMaxGaps, n)
				}
				return nil
			}},
	)
	flags = append(flags, config.NATSFlags()...)
	flags = append(flags, config.ReadToolFlags()...)
	return &cli.Command{
		Name:  "audit",
		Usage: "check the ledger against its own events; exit 1 on any violation",
		Description: "Folds every event of the event store with the domain's Evolve and checks the invariants of\n" +
			"PROTOCOL.md §6: (1) every idempotency key decided once, (2) money conserved per currency,\n" +
			"in-flight transfers included, (3) every balance equal to the fold and within its overdraft,\n" +
			"available = balance - held, (5) revisions gapless and event IDs unique; and (4) compares\n" +
			"every read model, as of its checkpoint, with the fold. --verify-chain also recomputes the\n" +
			"hash chains (tamper evidence). --events-out checks (8) that LEDGER_EVENTS holds every stored\n" +
			"event up to the publisher's checkpoint, in order, and none the store lacks; --repair\n" +
			"republishes the missing ones under their IDs. A clean audit of the whole ledger, every read\n" +
			"model at its head, stores its result as an audit checkpoint (the report says why it stored\n" +
			"none) and prints its digest; --from <id|last> then checks only the events after it (a\n" +
			"nightly audit costs the day's events), and --expect-digest <digest> refuses it (exit 1)\n" +
			"unless it is the checkpoint that digest was printed for. Prints a report; exits 1 naming\n" +
			"each violation; stopped (SIGINT, SIGTERM) it exits 3 and says how far it had folded. A\n" +
			"full audit of the whole ledger with its sets in a schema of its own (its role may CREATE\n" +
			"in the database) stopped once it has read its first page finishes that page and stores a\n" +
			"stop point at its end, and prints its ID and digest;\n" +
			"--resume [--expect-digest <digest>] folds on from it and reports as one run through;\n" +
			"--drop-stop <id|last> drops it and its sets instead. Any other stopped audit stores nothing.\n" +
			"A full audit of the whole ledger keeps the expected rows of entries and balance_history in an\n" +
			"unlinked file of $TMPDIR until a digest differs (about 130 bytes a row: 850 MB at 10,000,000\n" +
			"events); where /tmp is a tmpfs, point TMPDIR at a disk.",
		Flags:  flags,
		Action: runAudit,
	}
}

func runAudit(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() != 0 {
		return config.Exit(2, fmt.Errorf("audit takes no arguments (use --account ID)"))
	}
	log, finishProfiles, err := config.ReadToolStart(cmd, os.Stderr)
	if err != nil {
		return err
	}
	defer finishProfiles()
	if cmd.String(flagDropStop) != "" {
		return dropStop(ctx, cmd, log)
	}
	stores, err := config.OpenStores(ctx, cmd, log, config.Opening{ReadModels: true, IfNamed: true, Audit: true})
	if err != nil {
		return err
	}
	defer stores.Close()
	opts := audit.Options{Account: cmd.String("account"), VerifyChain: cmd.Bool("verify-chain"), MaxViolations: int(cmd.Int("max-violations")), Logger: log}
	if cmd.String(flagFrom) != "" {
		from, _ := parseFrom(cmd.String(flagFrom)) // checked by its Validator
		opts.From = &from
	}
	if err := resumeFlags(cmd, &opts); err != nil {
		return err
	}
	if stores.Pool != nil {
		// The audit's sets that grow with history live in a session of this
		// database, read models compared or not; so do its checkpoints.
		opts.Sets = stores.Pool
		if cmd.Bool("read-models") {
			opts.ReadModels = stores.Pool
		}
		opts.SaveCheckpoint = cmd.Bool(flagSaveCheckpoint) && opts.Account == ""
	} else if opts.Resume {
		return config.Exit(2, fmt.Errorf("--%s: the stop point and its sets are kept in PostgreSQL: give --%s", flagResume, config.FlagDatabaseURL))
	} else {
		log.Warn("no PostgreSQL database (--database-url): the audit keeps every event ID and key in memory, and invariant 4 is not checked")
	}
	var folded, carried int64 // where a stopped audit stood
	bar, finish := func(int64, int64) {}, func(bool) {}
	if cmd.Bool("progress") {
		bar, finish = config.EventsProgress(ctx, os.Stderr, stores.Store, "auditing")
	}
	opts.Progress = func(done, c int64) { folded, carried = done, c; bar(done, c) }
	if cmd.Bool(flagEventsOut) {
		closeNATS, err := eventsOutOptions(cmd, &opts)
		if err != nil {
			return err
		}
		defer closeNATS()
	} else if cmd.Bool(flagRepair) {
		return config.Exit(2, fmt.Errorf("--%s repairs what --%s finds: give both", flagRepair, flagEventsOut))
	}
	rep, err := audit.Run(ctx, stores.Store, opts)
	finish(err == nil)
	if err != nil && rep != nil && rep.Checkpoint != nil {
		// The checkpoint is stored (only dropping the oldest failed, a stop
		// included): its verdict, ID and digest are what the next --from needs.
		log.Warn("audit checkpoint stored; dropping the oldest checkpoints failed, the next save drops them", "checkpoint", rep.Checkpoint.ID, "err", err)
		return auditVerdict(cmd, rep)
	}
	if err != nil && ctx.Err() != nil {
		return auditStopped(ctx, cmd, rep, err, folded, carried)
	}
	if errors.Is(err, audit.ErrNoStopPoint) {
		return config.Exit(2, err)
	}
	if err != nil {
		return err
	}
	return auditVerdict(cmd, rep)
}

// resumeFlags sets --resume and --expect-digest, which needs --from or
// --resume; --resume with --from or --account is invalid (exit 2).
func resumeFlags(cmd *cli.Command, opts *audit.Options) error {
	opts.Resume = cmd.Bool(flagResume)
	if opts.Resume && (opts.From != nil || opts.Account != "") {
		return config.Exit(2, fmt.Errorf("--%s folds on a stopped full audit of the whole ledger: not with --%s or --account", flagResume, flagFrom))
	}
	if opts.ExpectDigest = cmd.String(flagExpectDigest); opts.ExpectDigest != "" && opts.From == nil && !opts.Resume {
		return config.Exit(2, fmt.Errorf("--%s is a checkpoint's or a stop point's digest: give the checkpoint (--%s) or --%s", flagExpectDigest, flagFrom, flagResume))
	}
	return nil
}

// auditStopped says where a stopped audit stood and, when it stored one, its
// stop point's ID and digest (on the output, as JSON with --json), else why
// it stored none (the audit's error, err), and exits 3.
func auditStopped(ctx context.Context, cmd *cli.Command, rep *audit.Report, err error, folded, carried int64) error {
	where := fmt.Sprintf("after %d events folded", folded)
	if carried > 0 {
		where += fmt.Sprintf(" past its checkpoint's %d", carried)
	}
	if rep == nil || rep.Stop == nil {
		return stopped(ctx, "audit", where, fmt.Sprintf("no verdict and nothing stored (%v): run it again", err))
	}
	st := rep.Stop
	if cmd.Bool("json") {
		if err := writeJSON(outputOf(cmd), rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(outputOf(cmd), "stop point %d stored at %s after %d events (digest %s): ledger audit --%s --%s %s folds on from it\n",
			st.ID, st.Position, st.Events, st.Digest, flagResume, flagExpectDigest, st.Digest)
	}
	return stopped(ctx, "audit", where, fmt.Sprintf("no verdict; stop point %d stored (digest %s): resume with --%s", st.ID, st.Digest, flagResume))
}

// auditVerdict prints the audit's report and exits 1 on a violation.
func auditVerdict(cmd *cli.Command, rep *audit.Report) error {
	w := outputOf(cmd)
	if cmd.Bool("json") {
		if err := writeJSON(w, rep); err != nil {
			return err
		}
	} else {
		rep.Write(w)
	}
	if !rep.OK() {
		first := ""
		if len(rep.Violations) > 0 {
			first = ": " + rep.Violations[0].String()
		}
		return config.Exit(1, fmt.Errorf("audit failed: %d violations%s", rep.ViolationCount, first))
	}
	return nil
}

// parseFrom reads --from: a checkpoint's ID, or last (0).
func parseFrom(v string) (int64, error) { return parseID(flagFrom, "an audit checkpoint's", v) }

// parseDropStop reads --drop-stop: a stop point's ID, or last (0).
func parseDropStop(v string) (int64, error) { return parseID(flagDropStop, "a stop point's", v) }

// parseID reads flag's value v: whose ID (1, 2, ...), or last (0).
func parseID(flag, whose, v string) (int64, error) {
	if v == "last" {
		return 0, nil
	}
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("--%s %q: %s ID (1, 2, ...) or last", flag, v, whose)
	}
	return id, nil
}

const (
	flagFrom           = "from"
	flagResume         = "resume"
	flagExpectDigest   = "expect-digest"
	flagSaveCheckpoint = "save-checkpoint"
	flagEventsOut      = "events-out"
	flagRepair         = "repair"
	flagMaxGaps        = "max-gaps"
	flagDropStop       = "drop-stop"
)

// eventsOutOptions connects to NATS for --events-out (and --repair); the
// returned function closes the connection.
func eventsOutOptions(cmd *cli.Command, opts *audit.Options) (func(), error) {
	if opts.ReadModels == nil {
		return nil, config.Exit(2, fmt.Errorf("--%s needs the read-model database (--database-url, --read-models): the publisher's checkpoint is there", flagEventsOut))
	}
	natsURL, err := config.FromDataDir(cmd, config.FlagNATSURL, func(i config.DevInfo) string { return i.NATSURL })
	if err != nil {
		return nil, err
	}
	nopts := config.NATSFromCommand(cmd)
	nopts.URL = natsURL
	nc, err := nopts.Connect("audit")
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	opts.EventsOut = &audit.EventsOutOptions{JS: js, Repair: cmd.Bool(flagRepair), MaxGaps: cmd.Int(flagMaxGaps)}
	return nc.Close, nil
}
