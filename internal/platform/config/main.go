package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v3"
)

// Main runs app with the process's arguments under a context that SIGINT or
// SIGTERM ends (the one home of both programs' signal handling; a second
// signal kills at once), and exits:
// 0 on success, else ExitStatus's code, after logging a stop and printing
// the error's message, if any, to stderr after the app's name. Both
// programs' main is this call; app should set ExitErrHandler to a no-op, so
// that Main prints.
func Main(app *cli.Command) {
	UsageErrorsExit(app, ExitUsage)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal kills at once
	err := app.Run(ctx, os.Args)
	if err == nil {
		return
	}
	code := ExitStatus(ctx, err) // before stop, which ends ctx too
	stop()
	if code == ExitStopped {
		slog.Warn(app.Name+" stopped", "cause", context.Cause(ctx), "err", err)
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(os.Stderr, app.Name+":", msg)
	}
	os.Exit(code)
}

// ExitStopped is the exit status of a command that SIGINT or SIGTERM
// stopped before its end, wherever the stop landed (opening the stores,
// checking their migrations, the work): not done and no verdict, run it
// again (a stopped rebuild resumes its generations from their checkpoints,
// a file of commands answers what was decided as duplicates). A server
// (dev, serve, projector run), whose end a signal is, exits 0 when it
// stopped cleanly, 1 when its stop failed (a drain past its timeout). The
// same 3 as `ledger post`'s "no answer".
const ExitStopped = 3

// ExitStatus is the exit status of err (not nil), returned by a command run
// under ctx: ExitStopped when the stop signal that ended ctx caused err (err
// wraps context.Canceled or ctx's cause: a cancelled connection, migrations
// check or query, a read tool's or rebuild's "stopped"); else the error's
// code (a cli.ExitCoder, such as Exit's) or 1. A verdict is not a stop: a
// signal that lands after the work ended (an audit's violations, a rejected
// post, a server's failed drain) leaves the verdict's code.
func ExitStatus(ctx context.Context, err error) int {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.Cause(ctx))) {
		return ExitStopped
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

// ExitUsage is the exit status of a wrong command line (an unknown flag, a
// flag without its value, a required flag missing), as Go's flag package and
// POSIX utilities use it: a script can tell it from a refusal (1), which means
// the command was sent and answered.
const ExitUsage = 2

// UsageErrorsExit makes every command of the tree rooted at c exit with code
// on a usage error that the CLI library detects, instead of its default 1,
// printing the error and where to find the usage; and on an unknown command
// (unknownCommand). A command's own OnUsageError and Action are kept.
func UsageErrorsExit(c *cli.Command, code int) {
	if c.OnUsageError == nil {
		c.OnUsageError = func(_ context.Context, cmd *cli.Command, err error, _ bool) error {
			return Exit(code, fmt.Errorf("%w (see %s --help)", err, cmd.FullName()))
		}
	}
	if c.Action == nil && len(c.Commands) > 0 {
		c.Action = unknownCommand(code)
	}
	for _, sub := range c.Commands {
		UsageErrorsExit(sub, code)
	}
}

// unknownCommand is the action of a command of commands that has none of
// its own: an argument that names none of them exits with code, naming it;
// none shows the help, as the CLI library's default action does. (That
// action says "No help topic for 'x'" and exits 3, which is ExitStopped: a
// script would run the typo again.)
func unknownCommand(code int) cli.ActionFunc {
	return func(_ context.Context, cmd *cli.Command) error {
		if cmd.Args().Present() {
			return Exit(code, fmt.Errorf("unknown command %q (see %s --help)", cmd.Args().First(), cmd.FullName()))
		}
		if cmd.Root() == cmd {
			return cli.ShowRootCommandHelp(cmd)
		}
		return cli.ShowSubcommandHelp(cmd)
	}
}

// Exit returns an error that makes Main exit with code; Main prints err's
// message (nothing when err is nil).
func Exit(code int, err error) error { return &exitError{code: code, err: err} }

// exitError carries an exit status out of an action.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }
func (e *exitError) ExitCode() int { return e.code }
