package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

// eventStoreFlags are the flags of the commands that read the event store alone.
func eventStoreFlags() []cli.Flag {
	return []cli.Flag{
		config.DataDirFlag(""),
		&cli.StringFlag{Name: config.FlagEventStoreURL, Usage: "event store: postgres://..., kurrentdb://... or esdb://... (default: --database-url)", Sources: cli.EnvVars(config.EnvEventStoreURL)},
		&cli.StringFlag{Name: config.FlagDatabaseURL, Usage: "PostgreSQL of the read models (postgres://...)", Sources: cli.EnvVars(config.EnvDatabaseURL)},
	}
}

// stopped is a read tool's error when a signal ended its context: where
// the work stopped and what is left; config.Main logs it and exits
// config.ExitStopped. The deferred profiles are written on the way out.
func stopped(ctx context.Context, tool, where, left string) error {
	return fmt.Errorf("%s stopped (%w) %s; %s", tool, context.Cause(ctx), where, left)
}

func replayCommand() *cli.Command {
	flags := append(eventStoreFlags(),
		&cli.Int64Flag{Name: "to-revision", Value: -1, Usage: "stop after this revision (default: the whole stream)", Sources: cli.EnvVars("LEDGER_REPLAY_TO_REVISION")},
		&cli.BoolFlag{Name: "json", Usage: "print one JSON object per event: the event and the state after it", Sources: cli.EnvVars("LEDGER_REPLAY_JSON")},
	)
	flags = append(flags, config.ReadToolFlags()...)
	return &cli.Command{
		Name:      "replay",
		Usage:     "print a stream's events and the state after each",
		ArgsUsage: "<stream>",
		Description: "Reads a stream (account-<id>, transfer-<id> or key-<key>; a bare account id means its\n" +
			"account stream) from its first event and folds each with the domain's Evolve, printing\n" +
			"the event and the state right after it. --to-revision N stops after revision N. Stopped\n" +
			"(SIGINT, SIGTERM), it ends its output after a whole event and exits 3.",
		Flags:  flags,
		Action: runReplay,
	}
}

func runReplay(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() != 1 {
		return config.Exit(2, errors.New("replay takes one stream name, e.g. account-alice"))
	}
	stream := cmd.Args().First()
	if !strings.HasPrefix(stream, domain.AccountStreamPrefix) && !strings.HasPrefix(stream, domain.TransferStreamPrefix) && !strings.HasPrefix(stream, domain.KeyStreamPrefix) {
		stream = domain.AccountStream(stream)
	}
	log, finishProfiles, err := config.ReadToolStart(cmd, os.Stderr)
	if err != nil {
		return err
	}
	defer finishProfiles()
	stores, err := config.OpenStores(ctx, cmd, log, config.Opening{ReadOnly: true})
	if err != nil {
		return err
	}
	defer stores.Close()
	store := stores.Store
	out := cmd.Root().Writer
	if out == nil {
		out = os.Stdout
	}
	// Buffered: an event's lines are five writes, which unbuffered cost five
	// system calls; the first event is flushed at once (the output starts as
	// soon as the first page is read), the rest whenever the buffer fills.
	w := bufio.NewWriterSize(out, replayBuffer)
	asJSON := cmd.Bool("json")
	n := 0
	var broken error
	err = audit.Replay(ctx, store, stream, cmd.Int64("to-revision"), func(s audit.Step) error {
		n++
		if n == 1 {
			defer w.Flush()
		}
		if asJSON {
			return printStepJSON(w, s)
		}
		printStep(w, s)
		if s.Err != nil {
			broken = s.Err
		}
		return nil
	})
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if err != nil && ctx.Err() != nil {
		return stopped(ctx, "replay", fmt.Sprintf("after %d events of %s", n, stream), "what was printed is whole")
	}
	if errors.Is(err, eventstore.ErrStreamNotFound) {
		return config.Exit(1, fmt.Errorf("stream %s has no events", stream))
	}
	if err != nil {
		return err
	}
	if broken != nil {
		return config.Exit(1, fmt.Errorf("%s does not fold at event %d: %w", stream, n-1, broken))
	}
	if !asJSON {
		fmt.Fprintf(out, "%d events\n", n)
	}
	return nil
}

// replayBuffer bounds the replay's output held before it is written.
const replayBuffer = 64 << 10

func printStep(w io.Writer, s audit.Step) {
	e, m := s.Event, s.Metadata
	fmt.Fprintf(w, "%s@%d  %s  position %s  key %q", e.Stream, e.Revision, e.Type, e.Position, m.Key)
	if m.Origin != "" {
		fmt.Fprintf(w, " (step of %q)", m.Origin)
	}
	fmt.Fprintf(w, "  at %s\n", m.At.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "    id %s  data %s\n", e.ID, e.Data)
	if s.Err != nil {
		fmt.Fprintf(w, "    !! does not fold: %v\n", s.Err)
		return
	}
	switch st := s.State.(type) {
	case *audit.AccountState:
		fmt.Fprintf(w, "    => %s %s  balance %d  held %d  available %d  overdraft %d  revision %d", st.Status, st.Currency, st.Balance, st.Held, st.Available, st.OverdraftLimit, st.Revision)
		for _, h := range st.Holds {
			fmt.Fprintf(w, "  hold %s %d %s", h.HoldID, h.Amount, h.Status)
		}
		fmt.Fprintln(w)
	case *audit.TransferState:
		fmt.Fprintf(w, "    => %s (%s) %s -> %s  %d %s  revision %d", st.Status, st.Stage, st.From, st.To, st.Amount, st.Currency, st.Revision)
		if st.Code != "" {
			fmt.Fprintf(w, "  code %s", st.Code)
		}
		for _, r := range st.Refunds {
			fmt.Fprintf(w, "  refund %q %d %s", r.Key, r.Amount, r.Stage)
		}
		fmt.Fprintln(w)
	case *audit.ClaimState:
		fmt.Fprintf(w, "    => key %q claimed by %s for %s (request %s)\n", st.Key, st.Command, st.Stream, st.Request)
	}
}

func printStepJSON(w io.Writer, s audit.Step) error {
	type event struct {
		ID       string          `json:"id"`
		Stream   string          `json:"stream"`
		Revision uint64          `json:"revision"`
		Position string          `json:"position"`
		Type     string          `json:"type"`
		Data     json.RawMessage `json:"data"`
		Metadata json.RawMessage `json:"metadata"`
	}
	out := struct {
		Event event  `json:"event"`
		State any    `json:"state,omitempty"`
		Error string `json:"error,omitempty"`
	}{Event: event{ID: s.Event.ID.String(), Stream: s.Event.Stream, Revision: s.Event.Revision, Position: s.Event.Position.String(),
		Type: s.Event.Type, Data: rawOrString(s.Event.Data), Metadata: rawOrString(s.Event.Metadata)}, State: s.State}
	if s.Err != nil {
		out.Error = s.Err.Error()
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// rawOrString keeps valid JSON as is and quotes anything else.
func rawOrString(b []byte) json.RawMessage {
	if json.Valid(b) {
		return b
	}
	q, _ := json.Marshal(string(b))
	return q
}
