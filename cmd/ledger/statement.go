package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

func statementCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "from", Usage: "start of the period, inclusive (RFC 3339; default: the account's first entry)", Sources: cli.EnvVars("LEDGER_STATEMENT_FROM")},
		&cli.StringFlag{Name: "to", Usage: "end of the period, exclusive (RFC 3339; default: now)", Sources: cli.EnvVars("LEDGER_STATEMENT_TO")},
		&cli.BoolFlag{Name: "csv", Usage: "print CSV (one row per entry, between an opening_balance and a closing_balance row)", Sources: cli.EnvVars("LEDGER_STATEMENT_CSV")},
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for each page", Sources: cli.EnvVars("LEDGER_STATEMENT_TIMEOUT")},
		config.DataDirFlag(""),
	}
	flags = append(flags, config.NATSFlags()...)
	return &cli.Command{
		Name:      "statement",
		Usage:     "print an account's statement for a period, with its opening and closing balance",
		ArgsUsage: "<account>",
		Description: "Pages through ledger.v1.query.entries (from the read models: run the projector, or\n" +
			"ledger dev) for the entries with from <= at < to, oldest first, and prints them between the\n" +
			"opening balance (the balance before the period's first entry) and the closing balance (after\n" +
			"its last), as a table or, with --csv, as CSV for a spreadsheet or an accounting import.\n" +
			"Amounts are minor units. Exit status 0, 1 when the account has no statement, 2 on a bad\n" +
			"command line, 3 when no answer came.",
		Flags:  flags,
		Action: runStatement,
	}
}

// statement is an account's entries over a period.
type statement struct {
	Account          string
	From, To         string
	Opening, Closing int64
	Entries          []client.Entry
}

func runStatement(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() != 1 {
		return config.Exit(exitUsage, errors.New("statement: name one account"))
	}
	for _, f := range []string{"from", "to"} {
		if _, err := timeFlag(cmd, f); err != nil {
			return err
		}
	}
	nc, err := connectNATS(cmd, "ledger-statement")
	if err != nil {
		return err
	}
	defer nc.Close()
	to := cmd.String("to")
	if to == "" {
		to = time.Now().UTC().Format(time.RFC3339Nano)
	}
	st, err := readStatement(ctx, nc, cmd.Args().First(), cmd.String("from"), to, cmd.Duration("timeout"))
	if err != nil {
		return err
	}
	w := outputOf(cmd)
	if cmd.Bool("csv") {
		return st.writeCSV(w)
	}
	st.writeTable(w)
	return nil
}

// readStatement reads the period's entries page by page, and, when the period
// has none, the balance before it from the entries before it.
func readStatement(ctx context.Context, nc *nats.Conn, account, from, to string, timeout time.Duration) (*statement, error) {
	st := &statement{Account: account, From: from, To: to}
	entries, err := entriesOf(ctx, nc, client.EntriesQuery{AccountID: account, From: instant(from), To: instant(to)}, timeout)
	if err != nil {
		return nil, err
	}
	st.Entries = entries
	if len(entries) > 0 {
		first, last := entries[0], entries[len(entries)-1]
		st.Opening, st.Closing = first.BalanceAfter-first.Amount, last.BalanceAfter
		return st, nil
	}
	if from != "" {
		before, err := entriesOf(ctx, nc, client.EntriesQuery{AccountID: account, To: instant(from)}, timeout)
		if err != nil {
			return nil, err
		}
		if len(before) > 0 {
			st.Opening = before[len(before)-1].BalanceAfter
		}
	}
	st.Closing = st.Opening
	return st, nil
}

// instant is an RFC 3339 time of a flag (checked before), nil for "".
func instant(s string) *time.Time {
	if s == "" {
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil
	}
	return &t
}

// entriesOf pages through ledger.v1.query.entries, each page asked (again
// while unanswered) within timeout.
func entriesOf(ctx context.Context, nc *nats.Conn, q client.EntriesQuery, timeout time.Duration) ([]client.Entry, error) {
	q.Limit = query.MaxEntriesLimit
	queries := client.New(nc).Queries()
	var out []client.Entry
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		page, err := queries.Entries(rctx, q)
		cancel()
		var qe *client.QueryError
		switch {
		case errors.As(err, &qe):
			return nil, config.Exit(exitAnswered, fmt.Errorf("statement: %s: %s", qe.Code, qe.Message))
		case err != nil:
			return nil, config.Exit(exitNoReply, fmt.Errorf("statement: %s: %w", query.QueryEntries, err))
		}
		out = append(out, page.Entries...)
		if page.NextAfterRevision == nil {
			return out, nil
		}
		q.AfterRevision = page.NextAfterRevision
	}
}

func (st *statement) period() string {
	from := st.From
	if from == "" {
		from = "the first entry"
	}
	return "from " + from + " to " + st.To
}

func (st *statement) writeTable(w io.Writer) {
	fmt.Fprintf(w, "statement of %s, %s (at < to)\n", st.Account, st.period())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tREVISION\tTYPE\tAMOUNT\tBALANCE\tKEY\tTRANSFER\tTRANSACTION")
	fmt.Fprintf(tw, "\t\topening balance\t\t%d\t\t\t\n", st.Opening)
	for _, e := range st.Entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%+d\t%d\t%s\t%s\t%s\n", e.At, e.Revision, e.Type, e.Amount, e.BalanceAfter, e.IdempotencyKey, e.TransferID, e.TransactionID)
	}
	fmt.Fprintf(tw, "\t\tclosing balance\t\t%d\t\t\t\n", st.Closing)
	tw.Flush()
	fmt.Fprintf(w, "%d entries\n", len(st.Entries))
}

func (st *statement) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	rows := [][]string{{"account_id", "at", "revision", "type", "amount", "balance_after", "idempotency_key", "transfer_id", "transaction_id", "event_id", "metadata"}}
	rows = append(rows, []string{st.Account, st.From, "", "opening_balance", "", strconv.FormatInt(st.Opening, 10), "", "", "", "", ""})
	for _, e := range st.Entries {
		md := ""
		if len(e.Metadata) > 0 {
			b, err := json.Marshal(e.Metadata)
			if err != nil {
				return fmt.Errorf("statement: %w", err)
			}
			md = string(b)
		}
		rows = append(rows, []string{st.Account, e.At, strconv.FormatInt(e.Revision, 10), e.Type, strconv.FormatInt(e.Amount, 10),
			strconv.FormatInt(e.BalanceAfter, 10), e.IdempotencyKey, e.TransferID, e.TransactionID, e.EventID, md})
	}
	rows = append(rows, []string{st.Account, st.To, "", "closing_balance", "", strconv.FormatInt(st.Closing, 10), "", "", "", "", ""})
	if err := cw.WriteAll(rows); err != nil {
		return fmt.Errorf("statement: %w", err)
	}
	return nil
}
