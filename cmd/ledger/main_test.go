package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/freeport"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

var (
	ledgerBin    = devtest.Program{Name: "ledger", Package: "."}
	projectorBin = devtest.Program{Name: "projector", Package: "../projector"}
)

func TestMain(m *testing.M) { os.Exit(devtest.RunPrograms(m)) }

// ledgerBinary builds this command once per test binary.
func ledgerBinary(t testing.TB) string { return ledgerBin.Path(t) }

// projectorBinary builds cmd/projector once per test binary.
func projectorBinary(t *testing.T) string { return projectorBin.Path(t) }

// anyPort is the listen address of an HTTP server a test does not call: the
// program binds a free port itself. (A port picked by freePort and bound later
// by a child can be taken meanwhile by another test: "address already in use".)
const anyPort = "127.0.0.1:0"

func freePort(t *testing.T) int {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// lockedBuffer collects a child's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// devProc is a `ledger dev` child process.
type devProc struct {
	t    testing.TB
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
	info config.DevInfo
}

// startDev starts `ledger dev` on dir and waits until its dev.json names it.
func startDev(t testing.TB, dir string, args []string, env []string) *devProc {
	t.Helper()
	p, err := launchDev(t, dir, args, env)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// launchDev is startDev without t.Fatal, for goroutines other than the test's.
func launchDev(t testing.TB, dir string, args []string, env []string) (*devProc, error) {
	bin := ledgerBinary(t)
	p := &devProc{t: t, out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"dev", "--data-dir", dir, "--http-addr", "127.0.0.1:0", "--log-level", "warn"}, args...)...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-p.done:
			return nil, fmt.Errorf("ledger dev exited: %v\n%s", p.err, p.out.String())
		default:
		}
		info, _, err := config.ReadDevInfo(dir)
		if err == nil && info.PID == p.cmd.Process.Pid {
			p.info = info
			return p, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("ledger dev not ready after 2m:\n%s", p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *devProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and requires a clean exit.
func (p *devProc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		p.t.Fatalf("ledger dev did not stop within 1m:\n%s", p.out.String())
	}
	if p.err != nil {
		p.t.Fatalf("ledger dev stopped with %v:\n%s", p.err, p.out.String())
	}
}

// stopClusterOnCleanup stops a private cluster left by a killed dev.
func stopClusterOnCleanup(t testing.TB, dataDir string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pgcluster.StopDir(ctx, filepath.Join(dataDir, "postgres"), nil); err != nil {
			t.Logf("stopping the private cluster: %v", err)
		}
	})
}

func TestHelpEverywhereAndEveryFlagHasAnEnvVar(t *testing.T) {
	var walk func(path string, c *cli.Command)
	walk = func(path string, c *cli.Command) {
		for _, f := range c.Flags {
			names := f.Names()
			if names[0] == "help" {
				continue
			}
			ev, ok := f.(interface{ GetEnvVars() []string })
			if !ok || len(ev.GetEnvVars()) == 0 {
				t.Errorf("%s --%s has no environment variable", path, names[0])
				continue
			}
			for _, e := range ev.GetEnvVars() {
				if !strings.HasPrefix(e, "LEDGER_") {
					t.Errorf("%s --%s: variable %s does not start with LEDGER_", path, names[0], e)
				}
			}
		}
		for _, sub := range c.Commands {
			walk(path+" "+sub.Name, sub)
		}
	}
	app := newApp()
	walk("ledger", app)

	paths := [][]string{{"--help"}}
	for _, c := range app.Commands {
		paths = append(paths, []string{c.Name, "--help"})
		for _, s := range c.Commands {
			paths = append(paths, []string{c.Name, s.Name, "--help"})
		}
	}
	for _, p := range paths {
		var out bytes.Buffer
		a := newApp()
		a.Writer, a.ErrWriter = &out, &out
		if err := a.Run(context.Background(), append([]string{"ledger"}, p...)); err != nil {
			t.Errorf("ledger %s: %v", strings.Join(p, " "), err)
		}
		if !strings.Contains(out.String(), "USAGE") {
			t.Errorf("ledger %s printed no usage:\n%s", strings.Join(p, " "), out.String())
		}
	}
}

// postCLI runs `ledger post` with args and returns its stdout (one JSON reply) and
// exit status.
func postCLI(t *testing.T, env []string, args ...string) (map[string]any, string, int) {
	t.Helper()
	out, stderr, code := runLedger(t, env, nil, append([]string{"post", "--compact"}, args...)...)
	var reply map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	if sc.Scan() {
		_ = json.Unmarshal(sc.Bytes(), &reply)
	}
	return reply, string(out) + stderr, code
}

// runLedger runs the ledger binary with args (env added, stdin fed) to its
// end and returns its stdout, its stderr and its exit status.
func runLedger(t testing.TB, env []string, stdin []byte, args ...string) ([]byte, string, int) {
	t.Helper()
	return runProgram(t, ledgerBinary(t), env, stdin, args...)
}

// runProgram is runLedger of the program bin.
func runProgram(t testing.TB, bin string, env []string, stdin []byte, args ...string) ([]byte, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s %v: %v", filepath.Base(bin), args, err)
		}
		code = ee.ExitCode()
	}
	return out, stderr.String(), code
}

// TestBadCommandLinesExit2: a command line the CLI library refuses (an unknown
// flag, a flag without its value, a required flag missing, an unknown
// command) exits 2, as the programs' help says, never 1, which a script
// reads as "sent and refused", nor 3 ("stopped: run it again"), which an
// unknown command exited before; nothing is sent (no NATS server is named
// that could answer).
func TestBadCommandLinesExit2(t *testing.T) {
	env := []string{config.EnvDataDir + "=" + t.TempDir()}
	for _, args := range [][]string{
		{"--bogus"},
		{"bogus"},
		{"post", "--bogus", "deposit"},
		{"post", "deposit", "--key", "k", "--amount"},
		{"statement", "--bogus", "alice"},
		{"balances"},
		{"balances", "--prefix"},
		{"audit", "--bogus"},
	} {
		out, stderr, code := runLedger(t, env, nil, args...)
		if code != exitUsage || !strings.Contains(stderr, "--help") {
			t.Errorf("ledger %s: exit %d, want %d and a pointer to --help:\n%s%s", strings.Join(args, " "), code, exitUsage, out, stderr)
		}
	}
}
