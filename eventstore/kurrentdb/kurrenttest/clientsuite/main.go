// Command clientsuite runs EventStore-Client-Go v4's own test suite against
// kurrenttest: the stream, $all and subscription cases of the client's
// esdb/*_test.go files, read from the module cache (they are the client's and
// are not kept in this repository), with testdata/harness_test.go in place of
// the suite's containers_test.go, which starts KurrentDB containers.
//
//	go run ./eventstore/kurrentdb/kurrenttest/clientsuite
//
// It starts two test servers, "empty" and "populated" (seeded with the parts of
// the suite's dataset that cases depend on by count only), copies the test
// files into a temporary module that requires what this module requires (so
// the client runs over the same gRPC and protobuf as the ledger's), and runs
// the included cases there. It exits non-zero unless every included case
// passed: a case that failed, was skipped or did not run counts against it.
// docs/kurrentdb.md ("The client's own test suite") lists the cases left out
// and why.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	_ "embed"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
)

const clientModule = "github.com/EventStore/EventStore-Client-Go/v4"

// harness replaces the suite's containers_test.go.
//
//go:embed testdata/harness_test.go
var harness []byte

// included are the cases that must pass, by their full test names.
var included = []string{
	"TestStreams/AppendTests/appendToStreamSingleEventNoStream",
	"TestStreams/AppendTests/appendWithInvalidStreamRevision",
	"TestStreams/AppendTests/metadataOperation",
	"TestStreams/ReadStreamTests/readStreamReturnsEOFAfterCompletion",
	"TestStreams/ReadStreamTests/readStreamNotFound",
	"TestStreams/ReadStreamTests/readStreamWithMaxAge",
	"TestStreams/SubscriptionTests/streamSubscriptionDeliversAllEventsInStreamAndListensForNewEvents",
	"TestStreams/SubscriptionTests/subscriptionAllFilter",
	"TestStreams/SubscriptionTests/connectionClosing",
	"TestStreams/SubscriptionTests/subscriptionAllWithCredentialsOverride",
	"TestStreams/SubscriptionTests/subscriptionToStreamCaughtUpMessage",
	"TestStreams/DeleteTests/canTombstoneStream",
	"TestStreams/DeleteTests/detectStreamDeleted",
	"TestStreams/ConnectionTests/closeConnection",
}

// The modules the suite's tests import besides the client: not required by
// this module, but in its build list (the client requires them).
var testModules = []string{"github.com/stretchr/testify", "github.com/goombaio/namegenerator"}

// datasetStream is the stream of the suite's dataset that cases read by count:
// 6,000 events, then one appended at revision 6,000.
const (
	datasetStream = "dataset20M-0"
	datasetEvents = 6_000
)

func main() {
	run := flag.String("run", "", "run these cases (a go test -run pattern) instead of the included ones, and do not require them to pass")
	verbose := flag.Bool("v", false, "print every case's output, not only the failing ones'")
	keep := flag.Bool("keep", false, "keep the temporary module and print where it is")
	flag.Parse()
	if err := suite(*run, *verbose, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "clientsuite:", err)
		os.Exit(1)
	}
}

func suite(run string, verbose, keep bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	client, err := goJSON[module](ctx, "", "mod", "download", "-json", clientModule)
	if err != nil {
		return err
	}
	if client.Dir == "" {
		return fmt.Errorf("%s: no directory in the module cache: %s", clientModule, client.Error)
	}
	ours, err := goJSON[modFile](ctx, "", "mod", "edit", "-json")
	if err != nil {
		return err
	}
	for _, path := range testModules {
		m, err := goJSON[module](ctx, "", "list", "-m", "-json", path)
		if err != nil {
			return err
		}
		ours.Require = append(ours.Require, requirement{m.Path, m.Version})
	}
	gomod, err := goEnv(ctx, "GOMOD")
	if err != nil {
		return err
	}

	tmp, err := os.MkdirTemp("", "clientsuite-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Fprintln(os.Stderr, "clientsuite: the module is in", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if err := writeModule(tmp, client, ours, filepath.Join(filepath.Dir(gomod), "go.sum")); err != nil {
		return err
	}

	empty, err := kurrenttest.New()
	if err != nil {
		return err
	}
	defer empty.Stop()
	populated, err := kurrenttest.New()
	if err != nil {
		return err
	}
	defer populated.Stop()
	if err := seed(ctx, populated); err != nil {
		return fmt.Errorf("seeding the populated server: %w", err)
	}

	pattern, want := run, []string(nil)
	if pattern == "" {
		pattern, want = runPattern(included), included
	}
	fmt.Printf("clientsuite: the tests of %s %s against kurrenttest\n", clientModule, client.Version)
	cmd := exec.CommandContext(ctx, "go", "test", "-json", "-count=1", "-timeout=5m", "-run", pattern, "./esdb")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"),
		"EVENTSTORE_INSECURE=true",
		"CLUSTER=false",
		"KURRENTTEST_EMPTY="+empty.Addr(),
		"KURRENTTEST_POPULATED="+populated.Addr(),
	)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	cases, perr := report(out, os.Stdout, verbose)
	werr := cmd.Wait()
	if perr != nil {
		return perr
	}

	ended := make(map[string]string)
	for _, c := range cases {
		ended[c.name] = c.action
		fmt.Printf("%-4s %s\n", c.action, c.name)
	}
	var bad []string
	for _, name := range want {
		if a := ended[name]; a != "pass" {
			if a == "" {
				a = "did not run"
			}
			bad = append(bad, name+": "+a)
		}
	}
	if want != nil {
		fmt.Printf("clientsuite: %d of the %d included cases passed\n", len(want)-len(bad), len(want))
	}
	for _, b := range bad {
		fmt.Println("  " + b)
	}
	if werr != nil {
		return fmt.Errorf("go test: %w", werr)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d included cases did not pass", len(bad))
	}
	return nil
}

type module struct {
	Path, Version, Dir, Error string
}

type modFile struct {
	Go      string
	Require []requirement
}

type requirement struct{ Path, Version string }

// writeModule lays out the temporary module: go.mod with mod's requirements
// (this module's, and the test modules at the versions of its build list), this
// module's go.sum, and in esdb/ the client's test files with the harness in
// place of containers_test.go.
func writeModule(dir string, client module, mod modFile, gosum string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "module clientsuite\n\ngo %s\n\nrequire (\n", mod.Go)
	for _, r := range mod.Require {
		fmt.Fprintf(&b, "\t%s %s\n", r.Path, r.Version)
	}
	b.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	sum, err := os.ReadFile(gosum)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		return err
	}

	// The cases read their expectations from ../resources/test.
	if err := copyFiles(filepath.Join(client.Dir, "resources", "test", "*"), filepath.Join(dir, "resources", "test")); err != nil {
		return err
	}
	pkg := filepath.Join(dir, "esdb")
	if err := copyFiles(filepath.Join(client.Dir, "esdb", "*_test.go"), pkg); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(pkg, "containers_test.go")); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(pkg, "kurrenttest_harness_test.go"), harness, 0o644)
}

// copyFiles copies the files that match pattern into dir, writable (the
// module cache's are read-only).
func copyFiles(pattern, dir string) error {
	files, err := filepath.Glob(pattern)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no files match %s", pattern)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// seed writes what the populated cases read of the suite's dataset: the
// stream dataset20M-0 with 6,000 events.
func seed(ctx context.Context, s *kurrenttest.Server) error {
	cfg, err := esdb.ParseConnectionString(s.ConnectionString())
	if err != nil {
		return err
	}
	cfg.Logger = esdb.NoopLogging()
	c, err := esdb.NewClient(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	const batch = 500
	for first := 0; first < datasetEvents; first += batch {
		events := make([]esdb.EventData, batch)
		for i := range events {
			events[i] = esdb.EventData{
				EventID:     uuid.New(),
				EventType:   fmt.Sprintf("eventType-%d", first+i),
				ContentType: esdb.ContentTypeJson,
				Data:        []byte(fmt.Sprintf(`{"n":%d}`, first+i)),
			}
		}
		var exp esdb.ExpectedRevision = esdb.NoStream{}
		if first > 0 {
			exp = esdb.Revision(uint64(first - 1))
		}
		if _, err := c.AppendToStream(ctx, datasetStream, esdb.AppendToStreamOptions{ExpectedRevision: exp}, events...); err != nil {
			return err
		}
	}
	return nil
}

// runPattern is a go test -run pattern for the named cases: at each level of
// the names, the alternatives found at that level. It can select more than the
// names (the product of the levels), never fewer.
func runPattern(names []string) string {
	var levels [][]string
	for _, n := range names {
		for i, part := range strings.Split(n, "/") {
			if i == len(levels) {
				levels = append(levels, nil)
			}
			q := regexp.QuoteMeta(part)
			if !slices.Contains(levels[i], q) {
				levels[i] = append(levels[i], q)
			}
		}
	}
	parts := make([]string, len(levels))
	for i, alts := range levels {
		parts[i] = "^(" + strings.Join(alts, "|") + ")$"
	}
	return strings.Join(parts, "/")
}

// testEvent is a line of go test -json.
type testEvent struct {
	Action, Test, Output string
}

// result is how a case ended: pass, fail or skip.
type result struct {
	name, action string
}

// report reads go test -json and prints the output of the cases that did not
// pass (of every test when verbose). It returns how each case ended, in the
// order they ended; a case is a test without subtests.
func report(r io.Reader, w io.Writer, verbose bool) ([]result, error) {
	var cases []result
	output := make(map[string]*bytes.Buffer)
	parents := make(map[string]bool)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev testEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Action == "" {
			fmt.Fprintln(w, sc.Text()) // not a test event
			continue
		}
		switch {
		case ev.Action == "output" || ev.Action == "build-output":
			if verbose || ev.Test == "" {
				fmt.Fprint(w, ev.Output)
				continue
			}
			if output[ev.Test] == nil {
				output[ev.Test] = new(bytes.Buffer)
			}
			output[ev.Test].WriteString(ev.Output)
		case ev.Test == "":
		case ev.Action == "run":
			if i := strings.LastIndexByte(ev.Test, '/'); i >= 0 {
				parents[ev.Test[:i]] = true
			}
		case ev.Action == "pass" || ev.Action == "fail" || ev.Action == "skip":
			if parents[ev.Test] {
				continue
			}
			cases = append(cases, result{ev.Test, ev.Action})
			if b := output[ev.Test]; b != nil && ev.Action != "pass" {
				fmt.Fprint(w, b.String())
			}
		}
	}
	return cases, sc.Err()
}

// goJSON runs a go command that prints JSON and decodes it.
func goJSON[T any](ctx context.Context, dir string, args ...string) (T, error) {
	var v T
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return v, fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return v, fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return v, nil
}

func goEnv(ctx context.Context, name string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}
