package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

// dropStop runs `ledger audit --drop-stop <id|last>`: it drops the stop
// point named and its run's sets (audit.DropStop), and does nothing else;
// exit 1 while an audit runs it, 2 when it is not stored or with a flag that
// asks for an audit.
func dropStop(ctx context.Context, cmd *cli.Command, log *slog.Logger) error {
	for _, f := range []string{flagFrom, flagResume, "account", flagExpectDigest, flagEventsOut, flagRepair} {
		if cmd.IsSet(f) {
			return config.Exit(2, fmt.Errorf("--%s drops a stop point and audits nothing: not with --%s", flagDropStop, f))
		}
	}
	id, _ := parseDropStop(cmd.String(flagDropStop)) // checked by its Validator
	stores, err := config.OpenStores(ctx, cmd, log, config.Opening{ReadModels: true})
	if err != nil {
		return err
	}
	defer stores.Close()
	dropped, sets, err := audit.DropStop(ctx, stores.Pool, id)
	switch {
	case errors.Is(err, audit.ErrStopRunning):
		return config.Exit(1, err)
	case errors.Is(err, audit.ErrNoSuchStop):
		return config.Exit(2, err)
	case err != nil:
		return err
	}
	if cmd.Bool("json") {
		return writeJSON(outputOf(cmd), struct {
			Dropped int64  `json:"dropped"`
			Sets    string `json:"sets"`
		}{dropped, sets})
	}
	_, err = fmt.Fprintf(outputOf(cmd), "stop point %d dropped, and its sets (schema %s)\n", dropped, sets)
	return err
}
