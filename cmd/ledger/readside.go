package main

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/platform/config"
)

// What the read-side commands (statement, balances) share: their NATS
// connection and their time flags.

// connectNATS connects to the ledger's NATS as the command's flags say (or the
// running dev's, through --data-dir).
func connectNATS(cmd *cli.Command, name string) (*nats.Conn, error) {
	natsURL, err := config.FromDataDir(cmd, config.FlagNATSURL, func(i config.DevInfo) string { return i.NATSURL })
	if err != nil {
		return nil, config.Exit(exitUsage, err)
	}
	nopts := config.NATSFromCommand(cmd)
	nopts.URL = natsURL
	nc, err := nopts.Connect(name)
	if err != nil {
		return nil, config.Exit(exitNoReply, err)
	}
	return nc, nil
}

// timeFlag is an optional RFC 3339 time flag (nil when unset).
func timeFlag(cmd *cli.Command, name string) (*time.Time, error) {
	v := cmd.String(name)
	if v == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, config.Exit(exitUsage, fmt.Errorf("--%s %q is not an RFC 3339 time", name, v))
	}
	return &t, nil
}
