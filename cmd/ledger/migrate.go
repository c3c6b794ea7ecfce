package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/pressly/goose/v3"
	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/migrations"
)

const flagMigrateTo = "to"

func migrateCommand() *cli.Command {
	db := func() []cli.Flag {
		return []cli.Flag{
			&cli.StringFlag{Name: config.FlagDatabaseURL, Usage: "the PostgreSQL to migrate (postgres://...): the read models' and, when it is another, the event store's in a second run", Sources: cli.EnvVars(config.EnvDatabaseURL)},
			config.DataDirFlag(""),
		}
	}
	return &cli.Command{
		Name:  "migrate",
		Usage: "apply, list or roll back this build's database migrations",
		Description: "Runs this build's migrations (the SQL files and the Go ones, which goose's CLI over\n" +
			"migrations/ does not have) on one PostgreSQL, under the advisory lock `ledger serve --migrate`\n" +
			"takes, so that two at once wait for each other. docs/operations.md says what each rollback\n" +
			"leaves. Exit status 0, 1 when a migration failed (printed; the versions done are kept),\n" +
			"2 on a bad command line.",
		Commands: []*cli.Command{
			{Name: "up", Usage: "apply every migration not yet applied", Flags: db(), Action: runMigrateUp},
			{Name: "status", Usage: "list this build's migrations, applied (with when) or pending", Flags: db(), Action: runMigrateStatus},
			{
				Name: "down", Usage: "roll back every applied migration above --to, newest first",
				Flags:  append(db(), &cli.Int64Flag{Name: flagMigrateTo, Usage: "the version to roll back to (0: every migration)", Required: true, Sources: cli.EnvVars("LEDGER_MIGRATE_TO")}),
				Action: runMigrateDown,
			},
		},
	}
}

// migrateURL is the database a migrate subcommand acts on.
func migrateURL(cmd *cli.Command) (string, error) {
	db, err := config.FromDataDir(cmd, config.FlagDatabaseURL, func(i config.DevInfo) string { return i.DatabaseURL })
	if err == nil && db == "" {
		err = config.Exit(exitUsage, errors.New("no database: set --database-url (LEDGER_DATABASE_URL) or --data-dir of a running `ledger dev`"))
	}
	return db, err
}

func runMigrateUp(ctx context.Context, cmd *cli.Command) error {
	u, err := migrateURL(cmd)
	if err != nil {
		return err
	}
	if err := migrations.Up(ctx, u); err != nil {
		return config.Exit(1, err)
	}
	return runMigrateStatus(ctx, cmd)
}

func runMigrateDown(ctx context.Context, cmd *cli.Command) error {
	u, err := migrateURL(cmd)
	if err != nil {
		return err
	}
	to := cmd.Int64(flagMigrateTo)
	if to < 0 {
		return config.Exit(exitUsage, errors.New("--to: must be 0 or more"))
	}
	down, err := migrations.DownTo(ctx, u, to)
	for _, v := range down {
		fmt.Fprintf(outputOf(cmd), "rolled back %05d\n", v)
	}
	if err != nil {
		return config.Exit(1, err)
	}
	return nil
}

func runMigrateStatus(ctx context.Context, cmd *cli.Command) error {
	u, err := migrateURL(cmd)
	if err != nil {
		return err
	}
	st, err := migrations.Status(ctx, u)
	if err != nil {
		return config.Exit(1, err)
	}
	w := tabwriter.NewWriter(outputOf(cmd), 0, 4, 2, ' ', 0)
	for _, m := range st {
		applied := "pending"
		if m.State == goose.StateApplied {
			applied = "applied " + m.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
		}
		fmt.Fprintf(w, "%05d\t%s\t%s\n", m.Source.Version, applied, m.Source.Path)
	}
	return w.Flush()
}
