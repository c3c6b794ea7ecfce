package config

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v3"
)

// Main runs app with the process's arguments and exits: 0 on success, else
// the error's exit code (a cli.ExitCoder, such as Exit's; ExitUsage for a
// wrong command line) or 1, after printing its message, if any, to stderr
// after the app's name. Both programs' main is
// this call; app should set ExitErrHandler to a no-op, so that Main prints.
func Main(app *cli.Command) {
	UsageErrorsExit(app, ExitUsage)
	err := app.Run(context.Background(), os.Args)
	if err == nil {
		return
	}
	code := 1
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		code = ec.ExitCode()
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(os.Stderr, app.Name+":", msg)
	}
	os.Exit(code)
}

// ExitUsage is the exit status of a wrong command line (an unknown flag, a
// flag without its value, a required flag missing), as Go's flag package and
// POSIX utilities use it: a script can tell it from a refusal (1), which means
// the command was sent and answered.
const ExitUsage = 2

// UsageErrorsExit makes every command of the tree rooted at c exit with code
// on a usage error that the CLI library detects, instead of its default 1,
// printing the error and where to find the usage. A command's own
// OnUsageError is kept.
func UsageErrorsExit(c *cli.Command, code int) {
	if c.OnUsageError == nil {
		c.OnUsageError = func(_ context.Context, cmd *cli.Command, err error, _ bool) error {
			return Exit(code, fmt.Errorf("%w (see %s --help)", err, cmd.FullName()))
		}
	}
	for _, sub := range c.Commands {
		UsageErrorsExit(sub, code)
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
