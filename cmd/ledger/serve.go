package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/node"
)

// Flags of the command service, shared by serve and dev.
const (
	flagInstance        = "instance-name"
	flagQueueGroup      = "queue-group"
	flagMaxInFlight     = "max-in-flight"
	flagCommandTimeout  = "command-timeout"
	flagCacheSize       = "cache-size"
	flagCacheMemory     = "cache-memory-mib"
	flagWarmAccounts    = "warm-accounts"
	flagResidents       = "resident-accounts"
	flagRecentKeys      = "recent-keys"
	flagRecentHolds     = "recent-holds"
	flagRecentRefunds   = "recent-refunds"
	flagSnapshotEvery   = "snapshot-every"
	flagCommandQuery    = "serve-command-query"
	flagJetStream       = "jetstream"
	flagDurable         = "jetstream-durable"
	flagBackOff         = "jetstream-backoff"
	flagMaxDeliver      = "jetstream-max-deliver"
	flagLanes           = "jetstream-lanes"
	flagGrace           = "jetstream-grace"
	flagShutdownTimeout = "shutdown-timeout"
	flagMigrate         = "migrate"
	flagTransferProcess = "transfer-process"
	flagPprof           = "pprof"
)

func serviceFlags() []cli.Flag {
	cat := "command service"
	return []cli.Flag{
		&cli.StringFlag{Name: flagInstance, Category: cat, Usage: "name of this instance (NATS connection name, event metadata); default ledger-<host>-<pid>", Sources: cli.EnvVars("LEDGER_INSTANCE_NAME")},
		&cli.StringFlag{Name: flagQueueGroup, Category: cat, Value: natsapi.DefaultQueueGroup, Usage: "NATS queue group shared by the instances", Sources: cli.EnvVars("LEDGER_QUEUE_GROUP")},
		&cli.IntFlag{Name: flagMaxInFlight, Category: cat, Value: 64, Usage: "request-reply commands handled at once (back-pressure beyond)", Sources: cli.EnvVars("LEDGER_MAX_IN_FLIGHT")},
		&cli.DurationFlag{Name: flagCommandTimeout, Category: cat, Value: 15 * time.Second, Usage: "bound on handling one command", Sources: cli.EnvVars("LEDGER_COMMAND_TIMEOUT")},
		&cli.IntFlag{Name: flagCacheSize, Category: cat, Value: 100_000, Usage: "account aggregates kept in memory", Sources: cli.EnvVars("LEDGER_CACHE_SIZE")},
		&cli.IntFlag{Name: flagCacheMemory, Category: cat, Value: 512, Usage: "estimated heap (MiB) the cached account aggregates may hold; 0: bounded by --cache-size only", Sources: cli.EnvVars("LEDGER_CACHE_MEMORY_MIB")},
		&cli.IntFlag{Name: flagWarmAccounts, Category: cat, Value: 1_000_000, Usage: "after start, load up to this many of the event store's accounts in the background (PostgreSQL): into the cache up to nine tenths of --cache-size and --cache-memory-mib, then as residents up to --resident-accounts; commands do not wait for it; 0: none", Sources: cli.EnvVars("LEDGER_WARM_ACCOUNTS")},
		&cli.IntFlag{Name: flagResidents, Category: cat, Value: 2_000_000, Usage: "accounts kept in compact form (about 200 bytes each) apart from the cache, so that a command on one reads nothing from the event store: those the cache dropped and those warmed beyond it; 0: none", Sources: cli.EnvVars("LEDGER_RESIDENT_ACCOUNTS")},
		&cli.IntFlag{Name: flagRecentKeys, Category: cat, Value: 1024, Usage: "key records each cached account keeps; older keys are answered from the event store (PostgreSQL); 0 keeps every key", Sources: cli.EnvVars("LEDGER_RECENT_KEYS")},
		&cli.IntFlag{Name: flagRecentHolds, Category: cat, Value: 1024, Usage: "closed holds each cached account keeps (active holds are always kept); older ones are found by their events' subject in the event store (PostgreSQL); 0 keeps every hold", Sources: cli.EnvVars("LEDGER_RECENT_HOLDS")},
		&cli.IntFlag{Name: flagRecentRefunds, Category: cat, Value: 1024, Usage: "refunded originals each cached account keeps the refunded sum of; an older one's is summed from its refunds' subject in the event store (PostgreSQL); 0 keeps every one", Sources: cli.EnvVars("LEDGER_RECENT_REFUNDS")},
		&cli.IntFlag{Name: flagSnapshotEvery, Category: cat, Value: 1000, Usage: "events between snapshots of an account (PostgreSQL); 0 takes none", Sources: cli.EnvVars("LEDGER_SNAPSHOT_EVERY")},
		&cli.BoolFlag{Name: flagCommandQuery, Category: cat, Value: true, Usage: "answer ledger.v1.query.command from the event store", Sources: cli.EnvVars("LEDGER_SERVE_COMMAND_QUERY")},
		&cli.BoolFlag{Name: flagJetStream, Category: cat, Value: true, Usage: "declare LEDGER_COMMANDS and consume it durably", Sources: cli.EnvVars("LEDGER_JETSTREAM")},
		&cli.StringFlag{Name: flagDurable, Category: cat, Value: natsapi.DefaultDurable, Usage: "name of the durable pull consumer", Sources: cli.EnvVars("LEDGER_JETSTREAM_DURABLE")},
		&cli.StringFlag{Name: flagBackOff, Category: cat, Value: "10s,30s,1m,2m,5m,10m", Usage: "redelivery back-off; the first value is the AckWait", Sources: cli.EnvVars("LEDGER_JETSTREAM_BACKOFF")},
		&cli.IntFlag{Name: flagMaxDeliver, Category: cat, Value: 20, Usage: "deliveries of a message before it goes to the DLQ", Sources: cli.EnvVars("LEDGER_JETSTREAM_MAX_DELIVER")},
		&cli.IntFlag{Name: flagLanes, Category: cat, Value: 16, Usage: "JetStream workers (one account's commands share a lane)", Sources: cli.EnvVars("LEDGER_JETSTREAM_LANES")},
		&cli.DurationFlag{Name: flagGrace, Category: cat, Value: 2 * time.Second, Usage: "age a stream message reaches before its first delivery is handled (lets request-reply decide first)", Sources: cli.EnvVars("LEDGER_JETSTREAM_GRACE")},
		config.ReplicasFlag(cat, "replicas of the LEDGER_COMMANDS and LEDGER_DLQ streams (and of LEDGER_EVENTS under ledger dev)"),
		&cli.BoolFlag{Name: flagTransferProcess, Category: cat, Value: true, Usage: "run the transfer process (finishes sagas a crash left half-way, expires holds)", Sources: cli.EnvVars("LEDGER_TRANSFER_PROCESS")},
		&cli.DurationFlag{Name: flagShutdownTimeout, Category: cat, Value: 30 * time.Second, Usage: "bound on a graceful stop", Sources: cli.EnvVars("LEDGER_SHUTDOWN_TIMEOUT")},
		&cli.BoolFlag{Name: flagPprof, Category: cat, Usage: "serve the runtime's profiles on --http-addr under /debug/pprof/ (heap at any moment: /debug/pprof/heap); they show the process's memory: only on an address others cannot reach", Sources: cli.EnvVars("LEDGER_PPROF")},
	}
}

// serviceOptions reads serviceFlags into node options.
func serviceOptions(cmd *cli.Command, log *slog.Logger) (node.Options, error) {
	backoff, err := parseDurations(cmd.String(flagBackOff))
	if err != nil {
		return node.Options{}, fmt.Errorf("--%s: %w", flagBackOff, err)
	}
	for _, f := range []string{flagCacheMemory, flagWarmAccounts, flagResidents, flagRecentKeys, flagRecentHolds, flagRecentRefunds, flagSnapshotEvery} {
		if cmd.Int(f) < 0 {
			return node.Options{}, fmt.Errorf("--%s: %d is negative (0 means none)", f, cmd.Int(f))
		}
	}
	if cmd.Bool(flagPprof) && cmd.String(config.FlagHTTPAddr) == "" {
		return node.Options{}, fmt.Errorf("--%s serves on --%s: it is empty", flagPprof, config.FlagHTTPAddr)
	}
	grace := cmd.Duration(flagGrace)
	if grace == 0 {
		grace = -1 // zero means "no grace" on the command line
	}
	var runners []node.Runner
	if cmd.Bool(flagTransferProcess) {
		runners = append(runners, node.TransferProcess(ledger.ProcessOptions{}))
	}
	return node.Options{
		Runners:             runners,
		Name:                cmd.String(flagInstance),
		Pprof:               cmd.Bool(flagPprof),
		DisableCommandQuery: !cmd.Bool(flagCommandQuery),
		Ledger: ledger.Options{
			CacheSize:        cmd.Int(flagCacheSize),
			CacheBytes:       zeroMeansNone(int64(cmd.Int(flagCacheMemory))) << 20,
			WarmAccounts:     cmd.Int(flagWarmAccounts),
			ResidentAccounts: int(zeroMeansNone(int64(cmd.Int(flagResidents)))),
			RecentKeys:       int(zeroMeansNone(int64(cmd.Int(flagRecentKeys)))),
			RecentHolds:      int(zeroMeansNone(int64(cmd.Int(flagRecentHolds)))),
			RecentRefunds:    int(zeroMeansNone(int64(cmd.Int(flagRecentRefunds)))),
			SnapshotEvery:    int(zeroMeansNone(int64(cmd.Int(flagSnapshotEvery)))),
		},
		Intake: natsapi.Options{
			QueueGroup:       cmd.String(flagQueueGroup),
			MaxInFlight:      cmd.Int(flagMaxInFlight),
			CommandTimeout:   cmd.Duration(flagCommandTimeout),
			DisableJetStream: !cmd.Bool(flagJetStream),
			Durable:          cmd.String(flagDurable),
			BackOff:          backoff,
			MaxDeliver:       cmd.Int(flagMaxDeliver),
			Lanes:            cmd.Int(flagLanes),
			Grace:            grace,
			Replicas:         cmd.Int(config.FlagJetStreamReplicas),
		},
		Logger: log,
	}, nil
}

// zeroMeansNone maps a flag's 0 ("none", "no bound") to the options' negative
// value of the same meaning (their 0 is "the default").
func zeroMeansNone(v int64) int64 {
	if v == 0 {
		return -1
	}
	return v
}

func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%q is not a positive duration", f)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, errors.New("at least one duration is needed")
	}
	return out, nil
}

func serveCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: config.FlagEventStoreURL, Usage: "event store: postgres://..., kurrentdb://... or esdb://... (default: --database-url)", Sources: cli.EnvVars(config.EnvEventStoreURL)},
		&cli.StringFlag{Name: config.FlagDatabaseURL, Usage: "PostgreSQL of the read models (postgres://...)", Sources: cli.EnvVars(config.EnvDatabaseURL)},
		&cli.StringFlag{Name: config.FlagHTTPAddr, Value: "127.0.0.1:8080", Usage: "address of /healthz, /readyz and /metrics (empty: none)", Sources: cli.EnvVars(config.EnvHTTPAddr)},
		&cli.BoolFlag{Name: flagMigrate, Value: true, Usage: "apply the PostgreSQL migrations at start", Sources: cli.EnvVars("LEDGER_MIGRATE")},
	}
	flags = append(flags, config.NATSFlags()...)
	flags = append(flags, serviceFlags()...)
	flags = append(flags, config.LogFlags()...)
	flags = append(flags, config.ProfileFlags()...)
	return &cli.Command{
		Name:  "serve",
		Usage: "run the command service against NATS and an event store",
		Description: "Takes commands on ledger.v1.cmd.<type> (request-reply, queue group) and from the\n" +
			"LEDGER_COMMANDS JetStream stream, decides them against the event store and replies.\n" +
			"Start as many instances as you like on the same NATS and event store.",
		Flags:  flags,
		Action: runServe,
	}
}

// envFailpoints names the test-only failpoint spec read by ledger serve.
const envFailpoints = "LEDGER_FAILPOINTS"

func runServe(ctx context.Context, cmd *cli.Command) error {
	log, finishProfiles, err := config.ReadToolStart(cmd, os.Stderr)
	if err != nil {
		return err
	}
	defer finishProfiles()
	esURL := cmd.String(config.FlagEventStoreURL)
	dbURL := cmd.String(config.FlagDatabaseURL)
	if esURL == "" {
		esURL = dbURL
	}
	if esURL == "" {
		return config.Exit(2, fmt.Errorf("no event store: set %s (or %s)", config.EnvEventStoreURL, config.EnvDatabaseURL))
	}
	if _, err := config.EventStoreBackend(esURL); err != nil {
		return config.Exit(2, err)
	}
	opts, err := serviceOptions(cmd, log)
	if err != nil {
		return config.Exit(2, err)
	}
	// Test-only: LEDGER_FAILPOINTS makes the intake exit (as SIGKILL) at the
	// points it names, with their probabilities (README, operations).
	fps, err := natsapi.ParseFailpoints(os.Getenv(envFailpoints))
	if err != nil {
		return config.Exit(2, fmt.Errorf("%s: %w", envFailpoints, err))
	}
	if fps != nil {
		opts.Intake.Failpoint = natsapi.FailpointHook(fps, os.Stderr, os.Exit)
		log.Warn("failpoints enabled: this process will exit on purpose (test only)", "failpoints", natsapi.FailpointString(fps))
	}
	if cmd.Bool(flagMigrate) {
		err = config.MigrateStores(ctx, esURL, dbURL, log)
	} else {
		err = config.CheckStores(ctx, esURL, dbURL) // a build serves only the schema it needs
	}
	if err != nil {
		return err
	}
	opts.NATS = config.NATSFromCommand(cmd)
	opts.EventStoreURL = esURL
	opts.DatabaseURL = dbURL
	opts.HTTPAddr = cmd.String(config.FlagHTTPAddr)
	n, err := node.Start(ctx, opts)
	if err != nil {
		return err
	}
	log.Info("ledger serving", "nats", config.Redact(n.NC.ConnectedUrl()), "eventstore", config.Redact(esURL), "http", n.HTTPURL())
	var cause error
	select {
	case <-ctx.Done():
		log.Info("stopping", "reason", "signal")
	case cause = <-n.Done():
		log.Error("stopping", "reason", cause)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cmd.Duration(flagShutdownTimeout))
	defer cancel()
	if err := n.Stop(sctx); err != nil {
		return errors.Join(cause, err)
	}
	log.Info("stopped")
	return cause
}
