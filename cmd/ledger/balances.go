package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

func balancesCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "prefix", Usage: "sum every account whose ID starts with this (literally; e.g. merchants:)", Required: true, Sources: cli.EnvVars("LEDGER_BALANCES_PREFIX")},
		&cli.StringFlag{Name: "currency", Usage: "only this currency (default: one row per currency)", Sources: cli.EnvVars("LEDGER_BALANCES_CURRENCY")},
		&cli.StringFlag{Name: "at", Usage: "the sums as of this time (RFC 3339, the record time; default: now)", Sources: cli.EnvVars("LEDGER_BALANCES_AT")},
		&cli.StringFlag{Name: "effective-at", Usage: "the sums by effective time (PROTOCOL.md §2.3; not with --at)", Sources: cli.EnvVars("LEDGER_BALANCES_EFFECTIVE_AT")},
		&cli.StringFlag{Name: "min-position", Usage: "wait (bounded) until the read model reflects this position (a reply's position)", Sources: cli.EnvVars("LEDGER_BALANCES_MIN_POSITION")},
		&cli.BoolFlag{Name: "json", Usage: "print the query's reply as JSON", Sources: cli.EnvVars("LEDGER_BALANCES_JSON")},
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for an answer", Sources: cli.EnvVars("LEDGER_BALANCES_TIMEOUT")},
		config.DataDirFlag(""),
	}
	flags = append(flags, config.NATSFlags()...)
	return &cli.Command{
		Name:  "balances",
		Usage: "print the balances summed over every account whose ID starts with a prefix",
		Description: "Asks ledger.v1.query.balances (from the read models: run the projector, or ledger dev) for\n" +
			"the sums per currency of balance, held and available over the accounts, open or closed,\n" +
			"whose ID starts with --prefix, now, as of --at, or with everything effective by\n" +
			"--effective-at, and prints them as a table or, with\n" +
			"--json, as the query's reply. Amounts are minor units. Exit status 0, 1 when the ledger\n" +
			"refused the query (printed), 2 on a bad command line, 3 when no answer came.",
		Flags:  flags,
		Action: runBalances,
	}
}

func runBalances(ctx context.Context, cmd *cli.Command) error {
	q := client.BalancesQuery{Prefix: cmd.String("prefix"), Currency: cmd.String("currency"), MinPosition: cmd.String("min-position")}
	var err error
	if q.At, err = timeFlag(cmd, "at"); err != nil {
		return err
	}
	if q.EffectiveAt, err = timeFlag(cmd, "effective-at"); err != nil {
		return err
	}
	nc, err := connectNATS(cmd, "ledger-balances")
	if err != nil {
		return err
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, cmd.Duration("timeout"))
	defer cancel()
	sums, err := client.New(nc).Queries().Balances(rctx, q)
	var qe *client.QueryError
	switch {
	case errors.As(err, &qe):
		return config.Exit(exitAnswered, fmt.Errorf("balances: %s: %s", qe.Code, qe.Message))
	case err != nil:
		return config.Exit(exitNoReply, fmt.Errorf("balances: %s: %w", query.QueryBalances, err))
	}
	w := outputOf(cmd)
	if cmd.Bool("json") {
		return writeJSON(w, sums)
	}
	writeBalances(w, sums)
	return nil
}

func writeBalances(w io.Writer, b client.Balances) {
	asOf := "now"
	switch {
	case b.AsOf != "":
		asOf = "as of " + b.AsOf
	case b.AsOfEffective != "":
		asOf = "with everything effective by " + b.AsOfEffective
	}
	fmt.Fprintf(w, "balances of the accounts starting with %q, %s (read model at %s)\n", b.Prefix, asOf, b.ProjectedPosition)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CURRENCY\tBALANCE\tHELD\tAVAILABLE\tACCOUNTS\t")
	for _, r := range b.Balances {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t\n", r.Currency, r.Balance, r.Held, r.Available, r.Accounts)
	}
	tw.Flush()
	if len(b.Balances) == 0 {
		fmt.Fprintln(w, "no account matches")
	}
}
