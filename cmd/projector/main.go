// Command projector keeps the ledger's read models (PostgreSQL) up to date with the
// event store and answers queries from them: `run` projects continuously and
// serves ledger.v1.query.* over NATS and /v1/... over HTTP, `rebuild` builds a new
// generation of the read models beside the live one and switches to it once it
// checks out, `status` shows each projection's checkpoint, lag and generation.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/adapters/httpapi"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/projections"
)

const (
	flagProjection   = "projection"
	flagBatchSize    = "batch-size"
	flagPollInterval = "poll-interval"
	flagMaxWait      = "max-wait"
	flagQueries      = "queries"
	flagQueueGroup   = "queue-group"
	flagNATS         = "nats"
	flagMigrate      = "migrate"
	flagJSON         = "json"
	flagShutdown     = "shutdown-timeout"
	flagPublish      = "publish"
	flagEventsMaxAge = "events-max-age"
	flagIndexMemory  = "index-memory"
)

func storeFlags() []cli.Flag {
	return []cli.Flag{
		config.DataDirFlag(""),
		&cli.StringFlag{Name: config.FlagDatabaseURL, Usage: "PostgreSQL of the read models (postgres://...)", Sources: cli.EnvVars(config.EnvDatabaseURL)},
		&cli.StringFlag{Name: config.FlagEventStoreURL, Usage: "event store: postgres://..., kurrentdb://... or esdb://... (default: --database-url)", Sources: cli.EnvVars(config.EnvEventStoreURL)},
	}
}

// projectionFlag names the projections to act on; a name of none, or one
// named twice (projections.Select), is a usage error as the command line is read, before `run` migrates or `rebuild`
// opens anything.
func projectionFlag() cli.Flag {
	return &cli.StringSliceFlag{Name: flagProjection, Usage: "projection to act on, repeatable: " + strings.Join(projections.Names, ", ") + " (default: all)", Sources: cli.EnvVars("LEDGER_PROJECTOR_PROJECTIONS"),
		Validator: func(names []string) error {
			_, err := projections.Select(names)
			return err
		}}
}

func newApp() *cli.Command {
	return &cli.Command{
		Name:  "projector",
		Usage: "keep the ledger's read models up to date and answer queries from them",
		Description: "Every flag can also be set by the environment variable shown in its help. With\n" +
			"--data-dir pointing at a running `ledger dev`, the URLs come from its dev.json.",
		Commands:       []*cli.Command{runCommand(), rebuildCommand(), statusCommand()},
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
	}
}

func main() { config.Main(newApp()) }

// open opens the read-model pool and the event store every subcommand uses.
func open(ctx context.Context, cmd *cli.Command, log *slog.Logger, migrate bool) (*config.Stores, error) {
	return config.OpenStores(ctx, cmd, log, config.Opening{ReadModels: true, Migrate: migrate})
}

func runCommand() *cli.Command {
	flags := append(storeFlags(),
		projectionFlag(),
		&cli.StringFlag{Name: config.FlagHTTPAddr, Value: "127.0.0.1:8081", Usage: "listen address of the HTTP queries, /healthz, /readyz and /metrics (empty: none)", Sources: cli.EnvVars("LEDGER_PROJECTOR_HTTP_ADDR")},
		&cli.BoolFlag{Name: flagNATS, Value: true, Usage: "answer ledger.v1.query.* over NATS", Sources: cli.EnvVars("LEDGER_PROJECTOR_NATS")},
		&cli.BoolFlag{Name: flagPublish, Value: true, Usage: "publish every event to the JetStream stream LEDGER_EVENTS (PROTOCOL.md §4.1; one publisher at a time holds a lease in the database)", Sources: cli.EnvVars("LEDGER_PROJECTOR_PUBLISH")},
		config.ReplicasFlag("", "replicas of LEDGER_EVENTS (the publisher declares the stream; 3 on a 3-node JetStream cluster)"),
		&cli.DurationFlag{Name: flagEventsMaxAge, Value: 30 * 24 * time.Hour, Usage: "how long LEDGER_EVENTS keeps an event (the publisher declares the stream)", Sources: cli.EnvVars("LEDGER_EVENTS_MAX_AGE")},
		&cli.StringSliceFlag{Name: flagQueries, Value: slices.Clone(query.ReadModelQueries),
			Usage:   "queries answered over NATS; add command to answer ledger.v1.query.command from the read model (then run ledger serve with --serve-command-query=false, which otherwise answers it from the event store: one responder per subject)",
			Sources: cli.EnvVars("LEDGER_PROJECTOR_QUERIES")},
		&cli.StringFlag{Name: flagQueueGroup, Value: natsapi.DefaultQueryQueueGroup, Usage: "NATS queue group of the query responders", Sources: cli.EnvVars("LEDGER_PROJECTOR_QUEUE_GROUP")},
		&cli.IntFlag{Name: flagBatchSize, Value: 5000, Usage: "events per batch (one transaction)", Sources: cli.EnvVars("LEDGER_PROJECTOR_BATCH_SIZE")},
		&cli.DurationFlag{Name: flagPollInterval, Value: 50 * time.Millisecond, Usage: "wait of a caught-up projector before it reads again", Sources: cli.EnvVars("LEDGER_PROJECTOR_POLL_INTERVAL")},
		&cli.DurationFlag{Name: flagMaxWait, Value: 5 * time.Second, Usage: "longest wait of a query for its min_position", Sources: cli.EnvVars("LEDGER_QUERY_MAX_WAIT")},
		&cli.BoolFlag{Name: flagMigrate, Value: true, Usage: "apply the PostgreSQL migrations at start", Sources: cli.EnvVars("LEDGER_MIGRATE")},
		&cli.DurationFlag{Name: flagShutdown, Value: 30 * time.Second, Usage: "bound on a graceful stop", Sources: cli.EnvVars("LEDGER_SHUTDOWN_TIMEOUT")},
	)
	flags = append(flags, config.NATSFlags()...)
	flags = append(flags, config.LogFlags()...)
	return &cli.Command{
		Name:  "run",
		Usage: "project continuously and answer queries (NATS and HTTP)",
		Description: "Follows the event store's \"all\" from each projection's checkpoint in batches; each\n" +
			"batch's read-model rows and its checkpoint commit in one transaction that compare-and-sets\n" +
			"the checkpoint, so several instances may run at once. Answers ledger.v1.query.account,\n" +
			"entries, balance, balances and transfer (and command with --queries) over NATS and GET\n" +
			"/v1/accounts/{id}, /v1/accounts/{id}/entries, /v1/accounts/{id}/balance, /v1/balances,\n" +
			"/v1/transfers/{id} and /v1/commands/{key} over HTTP. With\n" +
			"--publish (the default) it also publishes every event, in order and never before it is\n" +
			"stored, to the JetStream stream LEDGER_EVENTS on ledger.v1.events.<category>.<type> with\n" +
			"Nats-Msg-Id = the event ID (PROTOCOL.md §4.1); of several instances one publishes at a time\n" +
			"(a lease in the database) and another takes over when it stops. Stops cleanly on SIGINT or\n" +
			"SIGTERM.",
		Flags:  flags,
		Action: runRun,
	}
}

func runRun(ctx context.Context, cmd *cli.Command) error {
	log, err := config.LoggerFromCommand(cmd, os.Stderr)
	if err != nil {
		return config.Exit(2, err)
	}
	c, err := open(ctx, cmd, log, cmd.Bool(flagMigrate))
	if err != nil {
		return err
	}
	defer c.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	runner, err := projections.NewRunner(c.Pool, c.Store, projections.Options{
		Projections: cmd.StringSlice(flagProjection), BatchSize: int(cmd.Int(flagBatchSize)), PollInterval: cmd.Duration(flagPollInterval),
		Logger: log.With("component", "projector"), Metrics: projections.NewMetrics(reg),
	})
	if err != nil {
		return config.Exit(2, err)
	}
	qlog := log.With("component", "query")
	r := &projectorRun{cmd: cmd, log: log, qlog: qlog, c: c, reg: reg,
		svc: query.New(c.Pool, query.Options{MaxWait: cmd.Duration(flagMaxWait), Logger: qlog, Metrics: query.NewMetrics(reg)})}
	defer r.undo()
	if err := r.startNATS(ctx); err != nil {
		return err
	}
	srv, err := r.startHTTP()
	if err != nil {
		return err
	}
	log.Info("projector running", "database", config.Redact(c.DatabaseURL), "eventstore", config.Redact(c.EventStoreURL))
	err = runner.Run(ctx)
	log.Info("stopping")
	return r.stopHTTP(srv, err)
}

// projectorRun holds what runRun's steps share, and what to undo when it
// returns (last started, first undone).
type projectorRun struct {
	cmd       *cli.Command
	log, qlog *slog.Logger
	c         *config.Stores
	reg       *prometheus.Registry
	svc       *query.Service
	undos     []func()
}

func (r *projectorRun) undo() {
	for i := len(r.undos) - 1; i >= 0; i-- {
		r.undos[i]()
	}
}

// startNATS connects to NATS when --nats or --publish asks for it, answers
// the read queries over it (--nats) and publishes the events (--publish).
func (r *projectorRun) startNATS(ctx context.Context) error {
	cmd, log := r.cmd, r.log
	if !cmd.Bool(flagNATS) && !cmd.Bool(flagPublish) {
		return nil
	}
	natsURL, err := config.FromDataDir(cmd, config.FlagNATSURL, func(i config.DevInfo) string { return i.NATSURL })
	if err != nil {
		return err
	}
	nopts := config.NATSFromCommand(cmd)
	nopts.URL = natsURL
	nc, err := nopts.Connect("projector")
	if err != nil {
		return err
	}
	r.undos = append(r.undos, func() { _ = nc.Drain() })
	if cmd.Bool(flagNATS) {
		resp, err := natsapi.ServeReadQueries(nc, r.svc, natsapi.ReadQueryOptions{Queries: cmd.StringSlice(flagQueries), QueueGroup: cmd.String(flagQueueGroup), Logger: r.qlog})
		if err != nil {
			return err
		}
		r.undos = append(r.undos, func() { resp.Stop() })
		log.Info("answering queries over NATS", "url", config.Redact(nc.ConnectedUrl()), "queries", cmd.StringSlice(flagQueries))
	}
	if cmd.Bool(flagPublish) {
		pub, err := projections.NewPublisher(r.c.Pool, r.c.Store, nc, projections.PublisherOptions{
			MaxAge: cmd.Duration(flagEventsMaxAge), Replicas: cmd.Int(config.FlagJetStreamReplicas), Logger: log.With("component", "publisher"), Registry: r.reg,
		})
		if err != nil {
			return err
		}
		r.undos = append(r.undos, pub.Start(ctx))
		log.Info("publishing events", "stream", projections.EventsStream, "url", config.Redact(nc.ConnectedUrl()))
	}
	return nil
}

// startHTTP answers the queries, the checks and the metrics over HTTP when
// --http-addr is set (nil server otherwise).
func (r *projectorRun) startHTTP() (*httpapi.Server, error) {
	addr := r.cmd.String(config.FlagHTTPAddr)
	if addr == "" {
		return nil, nil
	}
	c := r.c
	srv := httpapi.New(httpapi.Options{Addr: addr, Gatherer: r.reg, Logger: r.log})
	httpapi.QueryRoutes(srv, r.svc)
	srv.AddCheck("database", func(ctx context.Context) error { return c.Pool.Ping(ctx) })
	srv.AddCheck("eventstore", func(ctx context.Context) error { _, err := c.Store.Head(ctx); return err })
	if err := srv.Start(); err != nil {
		return nil, err
	}
	r.log.Info("answering queries over HTTP", "url", srv.URL())
	return srv, nil
}

// stopHTTP drains and shuts srv down within --shutdown, joining its error to
// the runner's err.
func (r *projectorRun) stopHTTP(srv *httpapi.Server, err error) error {
	if srv == nil {
		return err
	}
	srv.SetDraining()
	sctx, cancel := context.WithTimeout(context.Background(), r.cmd.Duration(flagShutdown))
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		err = errors.Join(err, serr)
	}
	return err
}

func rebuildCommand() *cli.Command {
	flags := append(storeFlags(),
		projectionFlag(),
		&cli.IntFlag{Name: flagBatchSize, Value: 5000, Usage: "events per batch (one transaction)", Sources: cli.EnvVars("LEDGER_PROJECTOR_REBUILD_BATCH_SIZE")},
		&cli.BoolFlag{Name: "progress", Value: true, Usage: "show a progress bar on stderr (events/s, time left)", Sources: cli.EnvVars("LEDGER_PROJECTOR_PROGRESS")},
		&cli.BoolFlag{Name: "fresh", Usage: "drop the generations a stopped rebuild left and build anew (default: resume them from their checkpoints)", Sources: cli.EnvVars("LEDGER_PROJECTOR_REBUILD_FRESH")},
		&cli.IntFlag{Name: flagIndexMemory, Usage: fmt.Sprintf("maintenance_work_mem in MiB of each session building a new generation's indexes after the load (the sorts' memory; one session per projection at once), 0 (the server's setting) to %d", projections.MaxIndexMemoryMiB), Sources: cli.EnvVars("LEDGER_PROJECTOR_REBUILD_INDEX_MEMORY"),
			Validator: func(n int) error {
				if n < 0 || n > projections.MaxIndexMemoryMiB {
					return fmt.Errorf("%w: %d", projections.ErrIndexMemory, n)
				}
				return nil
			}},
	)
	flags = append(flags, config.ReadToolFlags()...)
	return &cli.Command{
		Name:  "rebuild",
		Usage: "build the read models anew beside the live ones, check them, then switch",
		Description: "Builds a new generation of each projection's tables from the start of the event store,\n" +
			"while the live generation keeps answering queries (and a running projector keeps it\n" +
			"current). The new generation is then checked against a fold of the event store (row\n" +
			"counts and a digest of every table); only if it matches are readers switched to it, in one\n" +
			"transaction, and the old generation dropped. A generation that does not match, or whose\n" +
			"indexes fail to build (a row loaded twice), is dropped while the others switch, and the\n" +
			"command exits 1 naming it and its first differing rows; run it again to build that one\n" +
			"afresh. Stopped (SIGINT, SIGTERM) before a generation's switch, during the build, the\n" +
			"check or the switches, it leaves that generation at its checkpoint and exits 3, and the\n" +
			"next rebuild resumes it (--fresh: builds anew); so does a check that could not be done (a\n" +
			"lost connection), which is no verdict (exit 1): run it again.",
		Flags:  flags,
		Action: runRebuild,
	}
}

func runRebuild(ctx context.Context, cmd *cli.Command) error {
	log, finishProfiles, err := config.ReadToolStart(cmd, os.Stderr)
	if err != nil {
		return err
	}
	defer finishProfiles()
	c, err := open(ctx, cmd, log, false)
	if err != nil {
		return err
	}
	defer c.Close()
	opts := projections.RebuildOptions{
		Projections: cmd.StringSlice(flagProjection), BatchSize: int(cmd.Int(flagBatchSize)),
		Check: audit.VerifyGeneration(c.Pool, c.Store), Logger: log, Fresh: cmd.Bool("fresh"),
		IndexMemoryMiB: int(cmd.Int(flagIndexMemory)),
	}
	finish := func(bool) {}
	if cmd.Bool("progress") {
		opts.Progress, finish = config.EventsProgress(ctx, os.Stderr, c.Store, "rebuilding")
	}
	start := time.Now()
	res, err := projections.Rebuild(ctx, c.Pool, c.Store, opts)
	finish(err == nil)
	w := cmd.Root().Writer
	if w == nil {
		w = os.Stdout
	}
	for _, r := range res {
		fmt.Fprintf(w, "%-9s generation %d -> %d: %d events, checked and live at %s\n", r.Projection, r.Previous, r.Generation, r.Events, r.Position)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "rebuilt in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

func statusCommand() *cli.Command {
	flags := append(storeFlags(),
		&cli.BoolFlag{Name: flagJSON, Usage: "print JSON", Sources: cli.EnvVars("LEDGER_PROJECTOR_STATUS_JSON")},
	)
	flags = append(flags, config.LogFlags()...)
	return &cli.Command{
		Name:   "status",
		Usage:  "show each projection's checkpoint, lag and generation",
		Flags:  flags,
		Action: runStatus,
	}
}

func runStatus(ctx context.Context, cmd *cli.Command) error {
	log, err := config.LoggerFromCommand(cmd, os.Stderr)
	if err != nil {
		return config.Exit(2, err)
	}
	c, err := open(ctx, cmd, log, false)
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := projections.ReadStatus(ctx, c.Pool, c.Store)
	if err != nil {
		return err
	}
	w := cmd.Root().Writer
	if w == nil {
		w = os.Stdout
	}
	if cmd.Bool(flagJSON) {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(w, st)
	return nil
}

func printStatus(w io.Writer, st []projections.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTION\tGENERATION\tSTATE\tCHECKPOINT\tHEAD\tLAG (EVENTS)\tLAG (S)\tEVENTS\tUPDATED")
	for _, s := range st {
		lag := fmt.Sprint(s.LagEvents)
		if s.LagCapped {
			lag = fmt.Sprintf(">=%d", s.LagEvents)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%.1f\t%d\t%s\n", s.Projection, s.Generation, s.State, s.Position, s.Head, lag, s.LagSeconds, s.Events, s.UpdatedAt.Format(time.RFC3339))
	}
	tw.Flush()
}
