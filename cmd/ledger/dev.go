package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/devenv"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
)

const flagStandby = "standby"

func devCommand() *cli.Command {
	flags := []cli.Flag{
		config.DataDirFlag("directory of JetStream's files, the private PostgreSQL cluster and dev.json"),
		&cli.StringFlag{Name: "nats-addr", Value: "127.0.0.1:4222", Usage: "listen address of the embedded NATS server (port 0: any free port)", Sources: cli.EnvVars("LEDGER_NATS_ADDR")},
		&cli.BoolFlag{Name: "nats-auth", Usage: "make the embedded NATS server require a user and a password, generated at start and written into the NATS URL of <data-dir>/dev.json (mode 0600), for a machine that is not yours alone", Sources: cli.EnvVars("LEDGER_DEV_NATS_AUTH")},
		&cli.StringFlag{Name: "nats-sync", Value: embednats.DefaultSyncInterval.String(), Usage: "how often JetStream fsyncs its files: a duration, or always (every message; caps the command stream at a few thousand messages/s). Acknowledged outcomes never depend on it: they are durable in the event store first", Sources: cli.EnvVars("LEDGER_NATS_SYNC")},
		&cli.StringFlag{Name: config.FlagHTTPAddr, Value: "127.0.0.1:8080", Usage: "listen address of the HTTP API (port 0: any free port)", Sources: cli.EnvVars(config.EnvHTTPAddr)},
		&cli.StringFlag{Name: config.FlagDatabaseURL, Usage: "use this PostgreSQL instead of a private cluster under --data-dir", Sources: cli.EnvVars(config.EnvDatabaseURL)},
		&cli.StringFlag{Name: config.FlagEventStoreURL, Usage: "event store (default: the PostgreSQL database)", Sources: cli.EnvVars(config.EnvEventStoreURL)},
		&cli.BoolFlag{Name: flagStandby, Usage: "run the private PostgreSQL as a primary and a synchronous standby (<data-dir>/postgres-standby), reached by one multi-host URL: the production shape, to kill the primary by hand and promote the standby (docs/operations.md)", Sources: cli.EnvVars("LEDGER_DEV_STANDBY")},
	}
	flags = append(flags, serviceFlags()...)
	flags = append(flags, config.LogFlags()...)
	flags = append(flags, config.ProfileFlags()...)
	return &cli.Command{
		Name:  "dev",
		Usage: "run everything in one process: NATS, PostgreSQL, the ledger, the HTTP API",
		Description: "Starts an embedded NATS server (JetStream on disk, synced every --nats-sync), PostgreSQL\n" +
			"(LEDGER_DATABASE_URL, or a private cluster under --data-dir started from the local\n" +
			"server binaries), applies the migrations and runs the ledger with its background\n" +
			"processes. It writes <data-dir>/dev.json so that `ledger post --data-dir` and the other\n" +
			"commands find it. Stop with Ctrl-C (SIGINT) or SIGTERM. Killed and restarted on the same\n" +
			"--data-dir, it loses nothing it acknowledged.",
		Flags:  flags,
		Action: runDev,
	}
}

func runDev(ctx context.Context, cmd *cli.Command) error {
	log, finishProfiles, err := config.ReadToolStart(cmd, os.Stderr)
	if err != nil {
		return err
	}
	defer finishProfiles()
	dir, err := filepath.Abs(cmd.String(config.FlagDataDir))
	if err != nil {
		return config.Exit(2, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	unlock, err := lockDataDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	devOpts, err := devOptions(cmd, dir, log)
	if err != nil {
		return config.Exit(2, err)
	}

	env, err := devenv.Start(ctx, devOpts)
	if err != nil {
		return err
	}
	info := env.Info()
	if err := config.WriteDevInfo(dir, info); err != nil {
		log.Error("write dev.json", "err", err)
	}
	printDevBanner(cmd.Root().Writer, dir, info, env)

	var cause error
	select {
	case <-ctx.Done():
		log.Info("stopping", "reason", "signal")
	case cause = <-env.Node.Done():
		log.Error("stopping", "reason", cause)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cmd.Duration(flagShutdownTimeout))
	defer cancel()
	_ = config.RemoveDevInfo(dir, os.Getpid())
	if err := env.Stop(sctx); err != nil {
		return errors.Join(cause, err)
	}
	log.Info("stopped")
	return cause
}

// devOptions reads the flags of `ledger dev` into the environment's options
// (a usage error when they do not go together).
func devOptions(cmd *cli.Command, dir string, log *slog.Logger) (devenv.Options, error) {
	opts, err := serviceOptions(cmd, log)
	if err != nil {
		return devenv.Options{}, err
	}
	opts.Runners = append(opts.Runners, devRunners(opts.Intake.Replicas)...)
	syncEvery, syncAlways, err := embednats.ParseSync(cmd.String("nats-sync"))
	if err != nil {
		return devenv.Options{}, err
	}
	if cmd.Bool(flagStandby) && cmd.String(config.FlagDatabaseURL) != "" {
		return devenv.Options{}, fmt.Errorf("--%s makes a standby of the private cluster: not with --%s", flagStandby, config.FlagDatabaseURL)
	}
	return devenv.Options{
		DataDir:          dir,
		NATSAddr:         cmd.String("nats-addr"),
		NATSAuth:         cmd.Bool("nats-auth"),
		NATSSyncInterval: syncEvery,
		NATSSyncAlways:   syncAlways,
		HTTPAddr:         cmd.String(config.FlagHTTPAddr),
		DatabaseURL:      cmd.String(config.FlagDatabaseURL),
		EventStoreURL:    cmd.String(config.FlagEventStoreURL),
		Standby:          cmd.Bool(flagStandby),
		Node:             opts,
		Logger:           log,
	}, nil
}

func printDevBanner(w io.Writer, dir string, info config.DevInfo, env *devenv.Env) {
	if w == nil {
		w = os.Stdout
	}
	pg := "PostgreSQL"
	switch {
	case env.Pair != nil:
		pg = "PostgreSQL (private primary and synchronous standby)"
	case env.PG != nil:
		pg = "PostgreSQL (private cluster)"
	}
	fmt.Fprintf(w, "ledger dev is running\n")
	fmt.Fprintf(w, "  NATS        %s\n", config.Redact(info.NATSURL))
	if info.HTTPURL != "" {
		fmt.Fprintf(w, "  HTTP        %s  (/healthz /readyz /metrics)\n", info.HTTPURL)
	}
	fmt.Fprintf(w, "  %-11s %s\n", "database", config.Redact(info.DatabaseURL))
	if info.EventStoreURL != info.DatabaseURL {
		fmt.Fprintf(w, "  %-11s %s\n", "eventstore", config.Redact(info.EventStoreURL))
	}
	fmt.Fprintf(w, "  data dir    %s  (%s, JetStream, dev.json)\n", dir, pg)
	if env.Pair != nil {
		fmt.Fprintf(w, "  primary     port %d, %s/data\n", env.Pair.Primary().Port(), env.Pair.Primary().Dir())
		fmt.Fprintf(w, "  standby     port %d, %s/data  (fail over: kill the primary's postmaster, then pg_ctl promote -D <its data>)\n", env.Pair.Standby().Port(), env.Pair.Standby().Dir())
	}
	fmt.Fprintf(w, "Post a command:  go run ./cmd/ledger post open_account --key k-open-alice --account alice --currency EUR\n")
	fmt.Fprintf(w, "Stop with Ctrl-C.\n")
}

// lockDataDir keeps two `ledger dev` off one data dir. The lock is an flock, so a
// killed process releases it with its file descriptors.
func lockDataDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "dev.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another `ledger dev` runs on %s", dir)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}
