package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
)

// EnvURL names the variable holding the URL of a server to test on instead of a
// private cluster. Its role must be allowed to create databases.
const EnvURL = "LEDGER_TEST_DATABASE_URL"

// dirPrefix names the temp directories of the shared clusters, so that clusters
// left behind by a killed test binary can be found and stopped.
const dirPrefix = "ledger-pgtest-"

const (
	startTimeout = 2 * time.Minute
	opTimeout    = time.Minute
)

var (
	mu        sync.Mutex
	cluster   *pgcluster.Cluster
	clusterEr error
	started   bool
)

// URL returns the URL of a new, empty database created for t and dropped when
// t ends. It fails t when no server is available.
func URL(t testing.TB) string {
	t.Helper()
	admin, err := adminURL()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	name := "t_" + randomHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := pgcluster.CreateDatabase(ctx, admin, name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		// The drop ends the sessions a test left open.
		if err := pgcluster.DropDatabase(ctx, admin, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	u, err := withDatabase(admin, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// Main runs the tests and then stops the shared cluster, if one was started:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit: it runs the tests, stops the shared test
// server and returns the exit code, for a TestMain with its own cleanup to do
// before it exits (deferred functions do not run past os.Exit).
func Run(m *testing.M) int {
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// adminURL is the URL of an existing database on the test server, used to create
// and drop the per-test databases.
func adminURL() (string, error) {
	if u := os.Getenv(EnvURL); u != "" {
		return u, nil
	}
	mu.Lock()
	defer mu.Unlock()
	if !started {
		started = true
		cluster, clusterEr = startShared()
	}
	if clusterEr != nil {
		return "", clusterEr
	}
	return cluster.URLFor("postgres"), nil
}

func startShared() (*pgcluster.Cluster, error) {
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("LEDGER_TEST_PG_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	reapOrphans(ctx, logger)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: dir, Logger: logger})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting a private PostgreSQL (set %s to use a server instead): %w", EnvURL, err)
	}
	return c, nil
}

func stopShared() error {
	mu.Lock()
	defer mu.Unlock()
	if cluster == nil {
		return nil
	}
	c := cluster
	cluster, clusterEr = nil, errors.New("the shared cluster was stopped")
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	err := c.Stop(ctx)
	if err == nil {
		err = os.RemoveAll(c.Dir())
	}
	return err
}

// reapOrphans stops and removes the shared clusters of test binaries that died
// without running Main's clean-up (a test timeout, a SIGKILL).
func reapOrphans(ctx context.Context, logger *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue // its owner still runs (or we cannot tell)
		}
		if err := pgcluster.StopDir(ctx, dir, logger); err != nil {
			logger.Warn("pgtest: stopping an orphaned cluster", "dir", dir, "err", err)
			continue
		}
		os.RemoveAll(dir)
	}
}

// withDatabase returns the URL u with its database replaced by name.
func withDatabase(u, name string) (string, error) {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") {
		return "", fmt.Errorf("%s must be a postgres:// URL", EnvURL)
	}
	p.Path = "/" + name
	p.RawPath = ""
	q := p.Query()
	q.Del("dbname") // would override the path
	p.RawQuery = q.Encode()
	return p.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
