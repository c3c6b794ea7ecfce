package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

// Exit statuses of `ledger post`.
const (
	exitApplied  = 0                // the ledger answered applied
	exitAnswered = 1                // the ledger answered something else (printed)
	exitUsage    = config.ExitUsage // the command line is wrong
	exitNoReply  = 3                // no answer: the outcome is unknown, retry with the same key
)

// postField maps a flag to a body field.
type postField struct {
	flag, field, usage string
	integer            bool
}

var postFields = []postField{
	{"account", "account_id", "account_id", false},
	{"amount", "amount", "amount in minor units (an integer)", true},
	{"currency", "currency", "currency (three upper-case letters)", false},
	{"from", "from", "source account of a transfer", false},
	{"to", "to", "destination account of a transfer, or the account a capture_hold credits", false},
	{"transfer", "transfer_id", "transfer_id", false},
	{"transaction", "transaction_id", "transaction_id of post_transaction", false},
	{"hold", "hold_id", "hold_id", false},
	{"original-key", "original_key", "idempotency key of the command a refund reverses", false},
	{"overdraft-limit", "overdraft_limit", "overdraft limit of a new account, in minor units (an integer)", true},
	{"expires-at", "expires_at", "expiry of a hold (RFC 3339)", false},
	{"effective-at", "effective_at", "when the money moved in the world (RFC 3339), for a late booking or an import: never after the ledger's time (5 s of skew), never before an account's effective opening", false},
	{"expected-revision", "expected_revision", "apply only if the account's revision is this one, else rejected revision_mismatch (deposit, withdraw, place_hold, capture_hold, release_hold, close_account)", true},
}

func postCommand() *cli.Command {
	types := make([]string, len(domain.ClientCommandTypes))
	for i, t := range domain.ClientCommandTypes {
		types[i] = string(t)
	}
	flags := []cli.Flag{
		&cli.StringFlag{Name: "key", Aliases: []string{"k"}, Usage: "idempotency key (required unless --json carries one)", Sources: cli.EnvVars("LEDGER_POST_KEY")},
	}
	for _, f := range postFields {
		flags = append(flags, &cli.StringFlag{Name: f.flag, Category: "body", Usage: f.usage, Sources: cli.EnvVars("LEDGER_POST_" + envName(f.flag))})
	}
	flags = append(flags,
		&cli.BoolFlag{Name: "up-to", Category: "body", Usage: "withdraw or transfer: --amount is a maximum; move what is available without the overdraft (the reply's moved)", Sources: cli.EnvVars("LEDGER_POST_UP_TO")},
		&cli.StringSliceFlag{Name: "posting", Category: "body", Usage: "a posting of post_transaction, from:to:amount:currency (repeat the flag, in order)", Sources: cli.EnvVars("LEDGER_POST_POSTING")},
		&cli.StringSliceFlag{Name: "metadata", Category: "body", Usage: "metadata entry key=value (repeat the flag) of open_account or of a command that moves or reserves money", Sources: cli.EnvVars("LEDGER_POST_METADATA")},
		&cli.StringFlag{Name: "json", Category: "body", Usage: "the body as JSON: sent as is, or with the field flags merged into it", Sources: cli.EnvVars("LEDGER_POST_JSON")},
		&cli.BoolFlag{Name: "jetstream", Usage: "publish with js.Publish to LEDGER_COMMANDS; the ledger acknowledges once the outcome is durable (print it with --query)", Sources: cli.EnvVars("LEDGER_POST_JETSTREAM")},
		&cli.BoolFlag{Name: "query", Usage: "ask ledger.v1.query.command for the outcome of --key instead of posting", Sources: cli.EnvVars("LEDGER_POST_QUERY")},
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for a definite reply, resending meanwhile (with --file: for each batch)", Sources: cli.EnvVars("LEDGER_POST_TIMEOUT")},
		&cli.StringFlag{Name: "file", Category: "file", Usage: "send the commands of a JSON Lines file (- for standard input), one a line with its \"type\"", Sources: cli.EnvVars("LEDGER_POST_FILE")},
		&cli.IntFlag{Name: "batch-size", Category: "file", Value: defaultFileBatch, Usage: fmt.Sprintf("commands per batch with --file (1-%d)", client.MaxBatchCommands), Sources: cli.EnvVars("LEDGER_POST_BATCH_SIZE")},
		&cli.IntFlag{Name: "show-failures", Category: "file", Value: 20, Usage: "how many failing lines the summary of --file lists", Sources: cli.EnvVars("LEDGER_POST_SHOW_FAILURES")},
		&cli.BoolFlag{Name: "no-progress", Category: "file", Usage: "draw no progress bar with --file", Sources: cli.EnvVars("LEDGER_POST_NO_PROGRESS")},
		&cli.BoolFlag{Name: "compact", Usage: "print the reply on one line", Sources: cli.EnvVars("LEDGER_POST_COMPACT")},
		config.DataDirFlag(""),
	)
	flags = append(flags, config.NATSFlags()...)
	return &cli.Command{
		Name:      "post",
		Usage:     "post one command and print the reply",
		ArgsUsage: "<type>   (" + strings.Join(types, ", ") + ")",
		Description: "Sends ledger.v1.cmd.<type> as a NATS request and prints the ledger's reply (PROTOCOL.md §3),\n" +
			"resending it with the same key until the answer is definite or --timeout ends.\n" +
			"Amounts are sent as JSON integers of minor units. Exit status: 0 applied, 1 any other\n" +
			"answer (printed), 2 bad command line, 3 no answer (unknown outcome: run it again, same key).\n\n" +
			"With --file F (JSON Lines, one command a line with its \"type\"; - for standard input) it sends\n" +
			"the file's commands in batches, in order, with a progress bar, and prints a summary; it is safe to\n" +
			"run again after a crash or Ctrl-C (every line carries its key). Exit status: 0 when every line was\n" +
			"applied (now or by an earlier run), 1 when a line was rejected or invalid, 3 when stopped first.\n\n" +
			"Examples:\n  ledger post deposit --key dep-1 --account alice --amount 1000 --currency EUR\n" +
			"  ledger post --file payouts.jsonl",
		Flags:  flags,
		Action: runPost,
	}
}

func envName(flag string) string { return strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) }

func runPost(ctx context.Context, cmd *cli.Command) error {
	out := cmd.Root().Writer
	if out == nil {
		out = os.Stdout
	}
	natsURL, err := config.FromDataDir(cmd, config.FlagNATSURL, func(i config.DevInfo) string { return i.NATSURL })
	if err != nil {
		return config.Exit(exitUsage, err)
	}
	nopts := config.NATSFromCommand(cmd)
	nopts.URL = natsURL
	if cmd.IsSet("file") && !cmd.Bool("query") {
		if cmd.Args().Len() > 0 {
			return config.Exit(exitUsage, errors.New("--file takes no command type: each line names its own"))
		}
		return postFile(ctx, cmd, nopts)
	}
	ctx, cancel := context.WithTimeout(ctx, cmd.Duration("timeout"))
	defer cancel()
	if cmd.Bool("query") {
		return postQuery(ctx, cmd, out, nopts)
	}
	return postOne(ctx, cmd, out, nopts)
}

// postQuery answers --query: the outcome of --key.
func postQuery(ctx context.Context, cmd *cli.Command, out io.Writer, nopts config.NATS) error {
	if cmd.Args().Len() > 0 || cmd.String("key") == "" {
		return config.Exit(exitUsage, errors.New("--query takes --key and no command type"))
	}
	nc, err := nopts.Connect("ledger-post")
	if err != nil {
		return config.Exit(exitNoReply, err)
	}
	defer nc.Close()
	r, err := client.New(nc).Queries().Command(ctx, cmd.String("key"))
	var qe *client.QueryError
	switch {
	case errors.As(err, &qe):
		return printJSON(out, qe, "", cmd.Bool("compact"))
	case err != nil:
		return config.Exit(exitNoReply, err)
	}
	return printJSON(out, r, r.Status, cmd.Bool("compact"))
}

// postOne sends the one command the arguments describe, by request or, with
// --jetstream, to the stream.
func postOne(ctx context.Context, cmd *cli.Command, out io.Writer, nopts config.NATS) error {
	if cmd.Args().Len() != 1 {
		return config.Exit(exitUsage, errors.New("usage: ledger post <type> --key K [--field value ...] (see --help)"))
	}
	typ := cmd.Args().First()
	body, err := postBody(cmd)
	if err != nil {
		return config.Exit(exitUsage, err)
	}
	nc, err := nopts.Connect("ledger-post")
	if err != nil {
		return config.Exit(exitNoReply, err)
	}
	defer nc.Close()

	if cmd.Bool("jetstream") {
		return postJetStream(ctx, nc, out, typ, body, cmd.Bool("compact"))
	}

	// Resent, same key, until the answer is definite or --timeout ends.
	r, err := client.New(nc, client.WithoutBatching()).Send(ctx, client.Raw{Type: typ, Body: body})
	if err != nil {
		return config.Exit(exitNoReply, err)
	}
	return printJSON(out, r, r.Status, cmd.Bool("compact"))
}

// postJetStream publishes the command to the stream, deduplicated by a message
// ID made from its body, and prints the stream's ack.
func postJetStream(ctx context.Context, nc *nats.Conn, out io.Writer, typ string, body []byte, compact bool) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return config.Exit(exitNoReply, err)
	}
	hdr := nats.Header{}
	hdr.Set(jetstream.MsgIDHeader, msgID(body))
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: client.CommandSubjectPrefix + typ, Data: body, Header: hdr})
	if err != nil {
		return config.Exit(exitNoReply, fmt.Errorf("publish to %s: %w (unknown whether it is stored: publish again, same key)", natsapi.StreamName, err))
	}
	return printJSON(out, ack, client.StatusApplied, compact)
}

// postBody builds the command body from --json and the field flags.
func postBody(cmd *cli.Command) ([]byte, error) {
	raw := cmd.String("json")
	fieldsSet := cmd.IsSet("key") || cmd.IsSet("up-to") || len(cmd.StringSlice("metadata")) > 0 || len(cmd.StringSlice("posting")) > 0
	for _, f := range postFields {
		fieldsSet = fieldsSet || cmd.IsSet(f.flag)
	}
	if raw != "" && !fieldsSet {
		return []byte(raw), nil // as is, even when malformed: the ledger judges it
	}
	body := map[string]any{}
	if raw != "" {
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&body); err != nil {
			return nil, fmt.Errorf("--json must be a JSON object to merge the field flags into: %w", err)
		}
	}
	if k := cmd.String("key"); k != "" {
		body["idempotency_key"] = k
	}
	if _, ok := body["idempotency_key"]; !ok {
		return nil, errors.New("--key is required")
	}
	for _, f := range postFields {
		if !cmd.IsSet(f.flag) {
			continue
		}
		v := cmd.String(f.flag)
		if f.integer {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return nil, fmt.Errorf("--%s must be an integer, got %q", f.flag, v)
			}
			body[f.field] = json.Number(v)
			continue
		}
		body[f.field] = v
	}
	if cmd.IsSet("up-to") {
		body["up_to"] = cmd.Bool("up-to")
	}
	if ps := cmd.StringSlice("posting"); len(ps) > 0 {
		var postings []map[string]any
		for _, p := range ps {
			f := strings.Split(p, ":")
			if len(f) != 4 {
				return nil, fmt.Errorf("--posting wants from:to:amount:currency, got %q", p)
			}
			if _, err := strconv.ParseInt(f[2], 10, 64); err != nil {
				return nil, fmt.Errorf("--posting %q: the amount must be an integer of minor units", p)
			}
			postings = append(postings, map[string]any{"from": f[0], "to": f[1], "amount": json.Number(f[2]), "currency": f[3]})
		}
		body["postings"] = postings
	}
	if md := cmd.StringSlice("metadata"); len(md) > 0 {
		m := map[string]string{}
		for _, kv := range md {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("--metadata wants key=value, got %q", kv)
			}
			m[k] = v
		}
		body["metadata"] = m
	}
	return json.Marshal(body)
}

// msgID is the courtesy Nats-Msg-Id: the key and a hash of the body, so that the
// stream drops a resent copy of the same request but never a different request
// that reuses a key (the ledger must see it to answer idempotency_key_conflict).
func msgID(body []byte) string {
	var k struct {
		Key string `json:"idempotency_key"`
	}
	_ = json.Unmarshal(body, &k)
	sum := sha256.Sum256(body)
	return k.Key + "/" + hex.EncodeToString(sum[:8])
}

// printJSON prints v, indented or on one line, and chooses the exit status:
// 0 when status is applied, 1 for any other answer.
func printJSON(w io.Writer, v any, status client.Status, compact bool) error {
	var b []byte
	var err error
	if compact {
		b, err = json.Marshal(v)
	} else {
		b, err = json.MarshalIndent(v, "", "  ")
	}
	if err != nil {
		return err
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return err
	}
	if status == client.StatusApplied {
		return nil
	}
	return config.Exit(exitAnswered, nil)
}
