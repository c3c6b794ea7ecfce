// Command clientsuite runs EventStore-Client-Go v4's own test suite against
// kurrenttest: the stream, $all, subscription, authentication and TLS cases of
// the client's esdb/*_test.go files, read from the module cache (they are the
// client's and are not kept in this repository), with testdata/harness_test.go
// in place of the suite's containers_test.go, which starts KurrentDB containers.
//
//	go run ./eventstore/kurrentdb/kurrenttest/clientsuite
//
// It runs the suite twice, as the client's CI does: insecure
// (EVENTSTORE_INSECURE=true) and secure (false). Each run has two test servers,
// "empty" and "populated" (seeded with the parts of the suite's dataset that
// cases depend on by count only); the secure run's speak TLS only, with a node
// certificate of a CA made here (internal/testing/testcert), and know the users admin
// and ops (password changeit), as a fresh secure node does. The CA, the node
// certificate and an untrusted CA are written where the suite reads them
// (certs/, beside esdb/). It copies the test files into a temporary module that
// requires what this module requires (so the client runs over the same gRPC and
// protobuf as the ledger's), and runs the included cases there. It exits
// non-zero unless every included case passed in its run: a case that failed,
// was skipped or did not run counts against it. docs/kurrentdb.md ("The
// client's own test suite") lists the cases left out and why.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
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
	"github.com/ledgerworks/ledger/internal/testing/testcert"
)

const clientModule = "github.com/EventStore/EventStore-Client-Go/v4"

// harness replaces the suite's containers_test.go.
//
//go:embed testdata/harness_test.go
var harness []byte

// streamCases are the cases of TestStreams that must pass in both runs, by
// their full test names.
var streamCases = []string{
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
	"TestStreams/DeleteTests/canDeleteStream",
	"TestStreams/DeleteTests/canTombstoneStream",
	"TestStreams/DeleteTests/detectStreamDeleted",
	"TestStreams/ConnectionTests/closeConnection",
}

// secureCases must pass in the secure run besides streamCases: the suite skips
// them when insecure.
var secureCases = []string{
	"TestStreams/AppendTests/appendToSystemStreamWithIncorrectCredentials",
	"TestStreams/ReadStreamTests/readStreamWithCredentialsOverride",
	"TestStreams/TLSTests/Default",
	"TestStreams/TLSTests/DefaultsWithCertificate",
	"TestStreams/TLSTests/WithoutCertificateAndVerify",
	"TestStreams/TLSTests/testTLSWithoutCertificate(",
	"TestStreams/TLSTests/WithCertificate",
	"TestStreams/TLSTests/WithCertificateFromAbsoluteFile",
	"TestStreams/TLSTests/WithCertificateFromRelativeFile",
	"TestStreams/TLSTests/WithInvalidCertificate",
	"TestStreams/AuthenticationTests/callWithTLSAndInvalidOverrideCredentials",
}

// A run is the suite run once, insecure or secure, with the cases that must
// pass in it.
type run struct {
	name   string
	secure bool
	cases  []string
}

var runs = []run{
	{"insecure", false, streamCases},
	{"secure", true, slices.Concat(streamCases, secureCases)},
}

// users are the secure servers' users: a fresh secure node's defaults.
var users = []kurrenttest.User{
	{Name: "admin", Password: "changeit", Admin: true},
	{Name: "ops", Password: "changeit"},
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
	pattern := flag.String("run", "", "run these cases (a go test -run pattern) instead of the included ones, and do not require them to pass")
	only := flag.String("mode", "", `run the suite only "insecure" or only "secure" (default: both)`)
	verbose := flag.Bool("v", false, "print every case's output, not only the failing ones'")
	keep := flag.Bool("keep", false, "keep the temporary module and print where it is")
	flag.Parse()
	if err := suite(*pattern, *only, *verbose, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "clientsuite:", err)
		os.Exit(1)
	}
}

func suite(pattern, only string, verbose, keep bool) error {
	selected := runs
	if only != "" {
		i := slices.IndexFunc(runs, func(r run) bool { return r.name == only })
		if i < 0 {
			return fmt.Errorf("-mode %q: want insecure or secure", only)
		}
		selected = runs[i : i+1]
	}
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
	certs, err := writeCerts(filepath.Join(tmp, "certs"))
	if err != nil {
		return err
	}

	fmt.Printf("clientsuite: the tests of %s %s against kurrenttest\n", clientModule, client.Version)
	var problems []string
	for _, r := range selected {
		if err := r.test(ctx, tmp, certs, pattern, verbose); err != nil {
			problems = append(problems, r.name+" run: "+err.Error())
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// certificates is what the secure servers and the suite use: the node's
// certificate and the CA that signed it.
type certificates struct {
	node tls.Certificate
	ca   *testcert.CA
}

// writeCerts makes a CA, a node certificate it signs (for 127.0.0.1) and an
// untrusted CA, and writes the files the suite's cases read, laid out as the
// client repository's docker-compose.yml makes them with es-gencert-cli:
// ca/ca.crt, node/node.crt and node/node.key, untrusted-ca/ca.crt. (It makes no
// user certificates: the cases that use them are left out.)
func writeCerts(dir string) (certificates, error) {
	ca, err := testcert.MakeCA()
	if err != nil {
		return certificates{}, err
	}
	node, err := ca.Make("eventstoredb-node", true)
	if err != nil {
		return certificates{}, err
	}
	untrusted, err := testcert.MakeCA()
	if err != nil {
		return certificates{}, err
	}
	pair, err := tls.X509KeyPair(node.CertPEM, node.KeyPEM)
	if err != nil {
		return certificates{}, err
	}
	for name, b := range map[string][]byte{
		"ca/ca.crt":           ca.CertPEM,
		"node/node.crt":       node.CertPEM,
		"node/node.key":       node.KeyPEM,
		"untrusted-ca/ca.crt": untrusted.CertPEM,
	} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return certificates{}, err
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return certificates{}, err
		}
	}
	return certificates{node: pair, ca: ca}, nil
}

// test runs the suite once in the temporary module dir, with its own two
// servers, and fails unless every included case passed (with pattern, it runs
// those cases instead and fails if go test does).
func (r run) test(ctx context.Context, dir string, certs certificates, pattern string, verbose bool) error {
	var opts []kurrenttest.Option
	if r.secure {
		opts = append(opts, kurrenttest.WithTLS(certs.node), kurrenttest.WithUsers(users...))
	}
	empty, err := kurrenttest.New(opts...)
	if err != nil {
		return err
	}
	defer empty.Stop()
	populated, err := kurrenttest.New(opts...)
	if err != nil {
		return err
	}
	defer populated.Stop()
	if err := seed(ctx, populated, r.secure, certs.ca); err != nil {
		return fmt.Errorf("seeding the populated server: %w", err)
	}

	want := []string(nil)
	if pattern == "" {
		pattern, want = runPattern(r.cases), r.cases
	}
	fmt.Printf("clientsuite: %s run (EVENTSTORE_INSECURE=%t)\n", r.name, !r.secure)
	cmd := exec.CommandContext(ctx, "go", "test", "-json", "-count=1", "-timeout=5m", "-run", pattern, "./esdb")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"),
		fmt.Sprintf("EVENTSTORE_INSECURE=%t", !r.secure),
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

	if err := r.verdict(cases, want); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("go test: %w", werr)
	}
	return nil
}

// verdict prints how each case ended and fails unless every included case
// (want; nil when a pattern chose the cases) passed.
func (r run) verdict(cases []result, want []string) error {
	ended := make(map[string]string)
	for _, c := range cases {
		ended[c.name] = c.action
		fmt.Printf("%-4s %s %s\n", c.action, r.name, c.name)
	}
	var bad []string
	for _, name := range want {
		if a := ended[name]; a != "pass" {
			if a == "" {
				a = "did not run"
			}
			bad = append(bad, r.name+" "+name+": "+a)
		}
	}
	if want != nil {
		fmt.Printf("clientsuite: %s run: %d of the %d included cases passed\n", r.name, len(want)-len(bad), len(want))
	}
	for _, b := range bad {
		fmt.Println("  " + b)
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
// stream dataset20M-0 with 6,000 events. A secure server is written to as
// admin, trusting ca.
func seed(ctx context.Context, s *kurrenttest.Server, secure bool, ca *testcert.CA) error {
	cfg, err := esdb.ParseConnectionString(s.ConnectionString())
	if err != nil {
		return err
	}
	if secure {
		cfg.Username, cfg.Password, cfg.RootCAs = users[0].Name, users[0].Password, ca.Pool()
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
