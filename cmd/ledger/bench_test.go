package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/urfave/cli/v3"
)

// TestBenchRefusesAnUnknownEventStore: --event-store (or LEDGER_BENCH_EVENT_STORE)
// takes postgres, kurrenttest or a KurrentDB URL; anything else, a PostgreSQL URL
// too, is refused with status 2 before anything starts.
func TestBenchRefusesAnUnknownEventStore(t *testing.T) {
	for _, c := range []struct{ flag, env string }{
		{flag: "bogus"},
		{flag: "postgres://localhost/ledger"},
		{env: "kurrent"},
	} {
		t.Setenv("LEDGER_BENCH_EVENT_STORE", c.env)
		args := []string{"ledger", "bench"}
		if c.flag != "" {
			args = append(args, "--event-store", c.flag)
		}
		var out bytes.Buffer
		a := newApp()
		a.Writer, a.ErrWriter = &out, &out
		err := a.Run(context.Background(), args)
		var ec cli.ExitCoder
		if err == nil || !errors.As(err, &ec) || ec.ExitCode() != 2 || !strings.Contains(err.Error(), "--event-store") {
			t.Errorf("%v (env %q): %v", args, c.env, err)
		}
	}
}
