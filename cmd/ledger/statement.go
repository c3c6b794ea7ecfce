package main

import (
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
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
		&cli.StringFlag{Name: "by", Value: query.ByRecord, Usage: "the time --from and --to bound: record (when the ledger recorded each entry, at) or effective (when the money moved, effective_at: a late settlement falls in the period it settles)", Sources: cli.EnvVars("LEDGER_STATEMENT_BY")},
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
			"With --by effective the period bounds each entry's effective time (effective_at) instead:\n" +
			"the entries are listed in effective order (ties in record order) with the balance they\n" +
			"leave in that order, after an opening balance of everything effective before --from.\n" +
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
	By               string // query.ByRecord or query.ByEffective
	Opening, Closing int64
	Entries          []client.Entry
	// Balances are the balance after each entry, in the statement's order:
	// its balance_after by record time; by effective time, the running sum.
	Balances []int64
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
	if by := cmd.String("by"); by != query.ByRecord && by != query.ByEffective {
		return config.Exit(exitUsage, fmt.Errorf("statement: --by %q: record or effective", by))
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
	read := readStatement
	if cmd.String("by") == query.ByEffective {
		read = readEffectiveStatement
	}
	st, err := read(ctx, nc, cmd.Args().First(), cmd.String("from"), to, cmd.Duration("timeout"))
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
	st := &statement{Account: account, From: from, To: to, By: query.ByRecord}
	entries, err := entriesOf(ctx, nc, client.EntriesQuery{AccountID: account, From: instant(from), To: instant(to)}, timeout)
	if err != nil {
		return nil, err
	}
	st.Entries = entries
	for _, e := range entries {
		st.Balances = append(st.Balances, e.BalanceAfter)
	}
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

// readEffectiveStatement reads the entries effective within the period, puts
// them in effective order (ties in record order) and runs the balance over
// them from the opening balance: the sum of every entry effective before the
// period (an account's balance is the sum of its entries), read page by page
// as readStatement reads what lies before an empty period.
func readEffectiveStatement(ctx context.Context, nc *nats.Conn, account, from, to string, timeout time.Duration) (*statement, error) {
	st := &statement{Account: account, From: from, To: to, By: query.ByEffective}
	entries, err := entriesOf(ctx, nc, client.EntriesQuery{AccountID: account, From: instant(from), To: instant(to), By: query.ByEffective}, timeout)
	if err != nil {
		return nil, err
	}
	if from != "" {
		before, err := entriesOf(ctx, nc, client.EntriesQuery{AccountID: account, To: instant(from), By: query.ByEffective}, timeout)
		if err != nil {
			return nil, err
		}
		for _, e := range before {
			st.Opening += e.Amount
		}
	}
	slices.SortStableFunc(entries, func(x, y client.Entry) int { return cmp.Compare(effectiveOf(x), effectiveOf(y)) })
	st.Entries, st.Closing = entries, st.Opening
	for _, e := range entries {
		st.Closing += e.Amount
		st.Balances = append(st.Balances, st.Closing)
	}
	return st, nil
}

// effectiveOf is an entry's effective time in nanoseconds since 1970, for
// ordering (the query answers RFC 3339 in UTC, checked when it was decoded).
func effectiveOf(e client.Entry) int64 {
	t, err := time.Parse(time.RFC3339Nano, e.EffectiveAt)
	if err != nil {
		return 0
	}
	return t.UnixNano()
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

// bounds is a bound of the period as the opening and closing rows show it: in
// the column of the time it bounds (at, or effective_at with --by effective).
func (st *statement) bounds(bound string) (at, effective string) {
	if st.By == query.ByEffective {
		return "", bound
	}
	return bound, ""
}

func (st *statement) period() string {
	from := st.From
	if from == "" {
		from = "the first entry"
	}
	return "from " + from + " to " + st.To
}

func (st *statement) writeTable(w io.Writer) {
	bound := "at"
	if st.By == query.ByEffective {
		bound = "effective_at"
	}
	fmt.Fprintf(w, "statement of %s, %s (%s < to)\n", st.Account, st.period(), bound)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tEFFECTIVE\tREVISION\tTYPE\tAMOUNT\tBALANCE\tKEY\tTRANSFER\tTRANSACTION")
	fmt.Fprintf(tw, "\t\t\topening balance\t\t%d\t\t\t\n", st.Opening)
	for i, e := range st.Entries {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%+d\t%d\t%s\t%s\t%s\n", e.At, e.EffectiveAt, e.Revision, e.Type, e.Amount, st.Balances[i], e.IdempotencyKey, e.TransferID, e.TransactionID)
	}
	fmt.Fprintf(tw, "\t\t\tclosing balance\t\t%d\t\t\t\n", st.Closing)
	tw.Flush()
	fmt.Fprintf(w, "%d entries\n", len(st.Entries))
}

func (st *statement) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	// effective_at is the last column, after those of v1.1, so that imports
	// that read columns by position keep working.
	rows := [][]string{{"account_id", "at", "revision", "type", "amount", "balance_after", "idempotency_key", "transfer_id", "transaction_id", "event_id", "metadata", "effective_at"}}
	at, effective := st.bounds(st.From)
	rows = append(rows, []string{st.Account, at, "", "opening_balance", "", strconv.FormatInt(st.Opening, 10), "", "", "", "", "", effective})
	for i, e := range st.Entries {
		md := ""
		if len(e.Metadata) > 0 {
			b, err := json.Marshal(e.Metadata)
			if err != nil {
				return fmt.Errorf("statement: %w", err)
			}
			md = string(b)
		}
		rows = append(rows, []string{st.Account, e.At, strconv.FormatInt(e.Revision, 10), e.Type, strconv.FormatInt(e.Amount, 10),
			strconv.FormatInt(st.Balances[i], 10), e.IdempotencyKey, e.TransferID, e.TransactionID, e.EventID, md, e.EffectiveAt})
	}
	at, effective = st.bounds(st.To)
	rows = append(rows, []string{st.Account, at, "", "closing_balance", "", strconv.FormatInt(st.Closing, 10), "", "", "", "", "", effective})
	if err := cw.WriteAll(rows); err != nil {
		return fmt.Errorf("statement: %w", err)
	}
	return nil
}
