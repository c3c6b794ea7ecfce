// Command ledger is the payment ledger's command-side program: `serve` runs the
// command service, `dev` runs everything on a laptop, `post` sends one command.
// Its subcommands are listed in one place (subcommands, below), each in a file
// of its own.
package main

import (
	"context"
	"encoding/json"
	"io"
	"os"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/node"
)

// subcommands are the commands of `ledger`, in the order `--help` lists them.
func subcommands() []*cli.Command {
	return []*cli.Command{
		auditCommand(),     // audit.go
		balancesCommand(),  // balances.go
		benchCommand(),     // bench.go
		devCommand(),       // dev.go
		migrateCommand(),   // migrate.go
		postCommand(),      // post.go
		replayCommand(),    // replay.go
		serveCommand(),     // serve.go
		statementCommand(), // statement.go
	}
}

// devRunners run inside `ledger dev` beside the command service's own runners
// (the transfer process, serviceOptions): the read side (projector.go).
func devRunners(replicas int) []node.Runner { return []node.Runner{projectorRunner(replicas)} }

func newApp() *cli.Command {
	cmds := subcommands()
	return &cli.Command{
		Name:  "ledger",
		Usage: "an event-sourced payment ledger over NATS (see PROTOCOL.md)",
		Description: "Every flag can also be set by the environment variable shown in its help.\n" +
			"Start with `ledger dev`, then `ledger post open_account --key k1 --account alice --currency EUR`.",
		Commands:              cmds,
		EnableShellCompletion: true,
		// Exit codes are chosen by the commands (config.Exit); main prints.
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
	}
}

func main() { config.Main(newApp()) }

// outputOf is where a command prints: the app's Writer (a test's), or stdout.
func outputOf(cmd *cli.Command) io.Writer {
	if w := cmd.Root().Writer; w != nil {
		return w
	}
	return os.Stdout
}

// writeJSON prints v as indented JSON (a command's --json).
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
