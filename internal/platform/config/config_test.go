package config

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/urfave/cli/v3"
)

func TestRedact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://ledger:s3cret@db:5432/ledger?sslmode=disable", "postgres://ledger:xxxxx@db:5432/ledger?sslmode=disable"},
		{"postgres://ledger@db/ledger", "postgres://ledger@db/ledger"},
		{"postgres://db/ledger?user=u&password=s3cret", "postgres://db/ledger?password=xxxxx&user=u"},
		{"host=db user=ledger password=s3cret dbname=ledger", "host=db user=ledger password=xxxxx dbname=ledger"},
		{"host=db password='s3 cret' dbname=ledger", "host=db password=xxxxx dbname=ledger"},
		{"nats://tok3n@nats:4222", "nats://xxxxx@nats:4222"},
		{"nats://u:p@a:4222,nats://u:p@b:4222", "nats://u:xxxxx@a:4222,nats://u:xxxxx@b:4222"},
		{"kurrentdb://admin:changeit@kdb:2113?tls=false", "kurrentdb://admin:xxxxx@kdb:2113?tls=false"},
		{"esdb://kdb:2113", "esdb://kdb:2113"},
		{"kurrentdb://admin:changeit@k1:2113,k2:2113,k3:2113?tlsCAFile=/certs/ca/ca.crt", "kurrentdb://admin:xxxxx@k1:2113,k2:2113,k3:2113?tlsCAFile=/certs/ca/ca.crt"},
		{"", ""},
	} {
		got := Redact(c.in)
		if got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(got, "s3cret") || strings.Contains(got, "tok3n") || strings.Contains(got, "changeit") {
			t.Errorf("Redact(%q) leaks a secret: %q", c.in, got)
		}
	}
}

func TestDevInfoRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := ReadDevInfo(dir); err == nil {
		t.Fatal("empty dir has dev.json")
	}
	in := DevInfo{PID: os.Getpid(), NATSURL: "nats://127.0.0.1:4222", DatabaseURL: "postgres://x/y", EventStoreURL: "postgres://x/y", HTTPURL: "http://127.0.0.1:8080"}
	if err := WriteDevInfo(dir, in); err != nil {
		t.Fatal(err)
	}
	out, running, err := ReadDevInfo(dir)
	if err != nil || !running || out.NATSURL != in.NATSURL || out.HTTPURL != in.HTTPURL {
		t.Fatalf("read back %+v running=%v err=%v", out, running, err)
	}
	if err := RemoveDevInfo(dir, os.Getpid()+1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadDevInfo(dir); err != nil {
		t.Fatal("removed by another pid")
	}
	if err := RemoveDevInfo(dir, os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadDevInfo(dir); err == nil {
		t.Fatal("dev.json survived its removal")
	}
}

func TestEventStoreBackend(t *testing.T) {
	for in, want := range map[string]Backend{
		"postgres://h/db": BackendPostgres, "postgresql://h/db": BackendPostgres,
		"kurrentdb://h:2113": BackendKurrentDB, "esdb://h:2113": BackendKurrentDB, "esdb+discover://h:2113": BackendKurrentDB,
	} {
		if got, err := EventStoreBackend(in); err != nil || got != want {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	for _, bad := range []string{"mysql://h/db", "h/db", ""} {
		if _, err := EventStoreBackend(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSetGOGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, c := range []struct {
		in   string
		want int // -1: off
	}{{"400", 400}, {"100", 100}, {"off", -1}} {
		if err := SetGOGC(c.in); err != nil {
			t.Fatalf("SetGOGC(%q): %v", c.in, err)
		}
		if got := debug.SetGCPercent(100); got != c.want {
			t.Errorf("SetGOGC(%q) set %d, want %d", c.in, got, c.want)
		}
	}
	for _, bad := range []string{"", "0", "-5", "fast", "1.5"} {
		before := debug.SetGCPercent(123)
		if err := SetGOGC(bad); err == nil {
			t.Errorf("SetGOGC(%q) accepted", bad)
		}
		if got := debug.SetGCPercent(before); got != 123 {
			t.Errorf("SetGOGC(%q) changed the target to %d though it failed", bad, got)
		}
	}
}

// --gogc left at its default does not override a GOGC the runtime took from the
// environment; set explicitly, it wins.
func TestGOGCFlagYieldsToTheEnvironment(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	run := func(args ...string) {
		t.Helper()
		cmd := &cli.Command{Name: "x", Flags: LogFlags(), Action: func(ctx context.Context, cmd *cli.Command) error {
			_, err := LoggerFromCommand(cmd, io.Discard)
			return err
		}}
		if err := cmd.Run(context.Background(), append([]string{"x"}, args...)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("GOGC", "250")
	debug.SetGCPercent(250) // as the runtime did at start
	run()
	if got := debug.SetGCPercent(250); got != 250 {
		t.Errorf("default --gogc with GOGC=250 in the environment set %d", got)
	}
	run("--gogc", "300")
	if got := debug.SetGCPercent(100); got != 300 {
		t.Errorf("--gogc 300 set %d", got)
	}
	t.Setenv("GOGC", "")
	run()
	if got := debug.SetGCPercent(100); got != 400 {
		t.Errorf("no GOGC, default --gogc set %d, want %s", got, DefaultGOGC)
	}
}

func TestParseMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"384MiB": 384 << 20, "1GiB": 1 << 30, "2TiB": 2 << 40, "512KiB": 512 << 10,
		"1000B": 1000, "123456": 123456, "off": math.MaxInt64,
	} {
		if got, err := ParseMemoryLimit(in); err != nil || got != want {
			t.Errorf("ParseMemoryLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1MiB", "384MB", "1.5GiB", "MiB", "9000000TiB", "Off"} {
		if n, err := ParseMemoryLimit(bad); err == nil {
			t.Errorf("ParseMemoryLimit(%q) accepted as %d", bad, n)
		}
	}
}

// --memory-limit left at its default does not override a GOMEMLIMIT the
// runtime took from the environment; set explicitly, it wins; a command
// without the flag (LogFlags) leaves the limit alone; a bad value fails and
// changes nothing.
func TestMemoryLimitFlag(t *testing.T) {
	const userLimit = 300 << 20
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	limit := func() int64 { return debug.SetMemoryLimit(-1) } // -1 reads it
	run := func(flags []cli.Flag, args ...string) error {
		t.Helper()
		cmd := &cli.Command{Name: "x", Flags: flags, Action: func(ctx context.Context, cmd *cli.Command) error {
			_, err := LoggerFromCommand(cmd, io.Discard)
			return err
		}}
		return cmd.Run(context.Background(), append([]string{"x"}, args...))
	}
	t.Setenv("GOMEMLIMIT", "300MiB")
	debug.SetMemoryLimit(userLimit) // as the runtime did at start
	if err := run(ReadToolFlags()); err != nil || limit() != userLimit {
		t.Errorf("default --memory-limit with GOMEMLIMIT=300MiB: limit %d (%v), want %d", limit(), err, userLimit)
	}
	if err := run(ReadToolFlags(), "--memory-limit", "1GiB"); err != nil || limit() != 1<<30 {
		t.Errorf("--memory-limit 1GiB: limit %d (%v)", limit(), err)
	}
	if err := run(ReadToolFlags(), "--memory-limit", "1GB"); err == nil || limit() != 1<<30 ||
		!strings.Contains(err.Error(), "--memory-limit (LEDGER_MEMORY_LIMIT)") {
		t.Errorf("--memory-limit 1GB: limit %d (%v), want an error naming the flag and the limit unchanged", limit(), err)
	}
	t.Setenv("GOMEMLIMIT", "")
	if want, err := ParseMemoryLimit(ReadToolMemoryLimit); err != nil || want == userLimit {
		t.Fatalf("the default %s: %d, %v (it must differ from the user's limit to be told apart)", ReadToolMemoryLimit, want, err)
	} else if err := run(ReadToolFlags()); err != nil || limit() != want {
		t.Errorf("no GOMEMLIMIT, default --memory-limit: limit %d (%v), want %s", limit(), err, ReadToolMemoryLimit)
	}
	debug.SetMemoryLimit(userLimit)
	if err := run(LogFlags()); err != nil || limit() != userLimit {
		t.Errorf("a command without --memory-limit changed the limit to %d (%v)", limit(), err)
	}
	restore, err := SetMemoryLimit("off", true)
	if err != nil || limit() != math.MaxInt64 {
		t.Fatalf("SetMemoryLimit(off): limit %d (%v)", limit(), err)
	}
	if restore(); limit() != userLimit {
		t.Errorf("restore put back %d, want %d", limit(), userLimit)
	}
}

// TestExitStatus: an error a command returns once a stop signal ended its
// context exits ExitStopped when the stop caused it (it wraps
// context.Canceled or the context's cause: a cancelled connect, a read tool's
// "stopped"); any other error keeps its own code, or 1, whenever the signal
// landed: a verdict (an audit's violations, a failed drain) is not a stop.
// On main before this table the verdict rows exited ExitStopped.
func TestExitStatus(t *testing.T) {
	stopped, stop := context.WithCancel(context.Background())
	stop()
	signal := errors.New("terminated signal received")
	signalled, end := context.WithCancelCause(context.Background())
	end(signal)
	running := context.Background()
	for _, c := range []struct {
		ctx  context.Context
		err  error
		want int
	}{
		{running, Exit(2, context.Canceled), 2},
		{running, Exit(0, nil), 0},
		{running, io.EOF, 1},
		{stopped, Exit(2, context.Canceled), ExitStopped},
		{stopped, fmt.Errorf("query: %w", context.Canceled), ExitStopped},
		{signalled, fmt.Errorf("audit stopped (%w) after 3 events", signal), ExitStopped},
		{signalled, Exit(2, fmt.Errorf("migrations: %w", context.Canceled)), ExitStopped},
		{stopped, Exit(1, io.EOF), 1},
		{signalled, Exit(1, errors.New("audit failed: 3 violations")), 1},
		{signalled, errors.Join(nil, fmt.Errorf("node: nats drain: %w", context.DeadlineExceeded)), 1},
		{stopped, io.EOF, 1},
	} {
		if got := ExitStatus(c.ctx, c.err); got != c.want {
			t.Errorf("ExitStatus(%v, %v) = %d, want %d", c.ctx.Err(), c.err, got, c.want)
		}
	}
}
