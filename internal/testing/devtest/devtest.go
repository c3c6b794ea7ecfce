// Package devtest is the tests' one environment: the real servers the ledger
// runs on (an embedded nats-server with JetStream in a temp dir, a fresh
// migrated PostgreSQL database from internal/testing/pgtest), the event store
// of every backend and Stores to run a test on each, a controllable Clock,
// the bounded polls Eventually and Await, the readers of a store (ReadAll,
// SettledAll, StreamEvents, Account, Receive), the runners of a test (Go,
// CatchUp), the commands a test builds and runs as a user does (Program,
// RunPrograms), and Failure to show a checker failing.
//
// Packages whose own (in-package) tests import devtest cannot be imported by
// it: internal/app/ledger, internal/adapters/natsapi, internal/platform/config,
// projections (BenchmarkAuditCheckpointDigest), nor what imports them
// (internal/app/audit, internal/platform/node): the helpers that need the
// audit are projections/projtest's.
package devtest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

// NATS starts an embedded nats-server with JetStream for t on a free port.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	return NATSAt(t, "127.0.0.1:0", t.TempDir())
}

// NATSAt starts an embedded nats-server with JetStream on addr ("127.0.0.1:0"
// for a free port) with its JetStream store in dir: a server started again on
// the same address and directory is a restart. It is stopped when t ends.
func NATSAt(t testing.TB, addr, dir string) *server.Server {
	t.Helper()
	s, err := embednats.Start(embednats.Options{Addr: addr, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// natsClusterTries bounds the starts of a test's NATS cluster (NATSCluster).
const natsClusterTries = 3

// NATSCluster starts a 3-node JetStream cluster on loopback for t (the
// production shape's NATS) and stops it when t ends. Its nodes' ports are
// picked free before the nodes bind them (a node restarts on its own), so a
// process beside the test can take one between; a cluster that does not
// start is started again on new ports, up to natsClusterTries times, and the
// last error fails t.
func NATSCluster(t testing.TB) (*embednats.Cluster, []*server.Server) {
	t.Helper()
	var (
		c       *embednats.Cluster
		servers []*server.Server
		err     error
	)
	for try := 1; try <= natsClusterTries; try++ {
		if c, err = embednats.NewCluster("ledger", 3, t.TempDir(), embednats.Options{}); err != nil {
			t.Fatal(err)
		}
		if servers, err = c.Start(); err == nil {
			break
		}
		t.Logf("the NATS cluster, try %d of %d: %v", try, natsClusterTries, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
	return c, servers
}

// NATSWith starts a nats-server on a free port of 127.0.0.1 with the test's own
// options (authentication, TLS, JetStream...), and stops it when t ends.
func NATSWith(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	return natsWith(t, opts, nil)
}

// NATSLogged is NATSWith with the server's log (notice level and above, where
// it reports authorization and permissions violations) kept for the test.
func NATSLogged(t testing.TB, opts *server.Options) (*server.Server, *ServerLog) {
	t.Helper()
	log := &ServerLog{}
	return natsWith(t, opts, log), log
}

func natsWith(t testing.TB, opts *server.Options, log server.Logger) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	if log != nil {
		s.SetLogger(log, false, false)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return s
}

// Connect connects to s; the connection is closed when t ends.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return ConnectURL(t, s.ClientURL(), opts...)
}

// ConnectURL connects to the NATS server at url (a test's own server, or the
// one a ledger process under test runs), reconnecting without limit unless
// opts say otherwise; the connection is closed when t ends.
func ConnectURL(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// DatabaseURL is a fresh database for t with the migrations applied.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	url := pgtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	return url
}

// BenchAccounts is a pool on a fresh database with the migrations applied
// (closed when b ends) and how many accounts a benchmark loads:
// LEDGER_BENCH_ACCOUNTS, 100,000 when unset.
func BenchAccounts(b testing.TB) (*pgxpool.Pool, int) {
	b.Helper()
	n := BenchEnv("LEDGER_BENCH_ACCOUNTS", 100_000)
	pool, err := pgxpool.New(context.Background(), DatabaseURL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool, n
}

// BenchEnv is a benchmark's size from the environment variable name: its
// value when it is a positive integer, else def.
func BenchEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TimeStatements runs each of names b.N times, in turn within each round
// (so that a loaded machine's swings fall on all alike), and reports each
// one's seconds a run (<name>-s) and its time against baseline's, measured
// in the same rounds (<name>/<baseline>): the statement benchmarks' one
// timing loop.
func TimeStatements(b *testing.B, baseline string, names []string, run func(name string) error) {
	b.Helper()
	spent := map[string]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, name := range names {
			start := time.Now()
			if err := run(name); err != nil {
				b.Fatal(name, err)
			}
			spent[name] += time.Since(start)
		}
	}
	for _, name := range names {
		b.ReportMetric(spent[name].Seconds()/float64(b.N), name+"-s")
		if name != baseline {
			b.ReportMetric(spent[name].Seconds()/spent[baseline].Seconds(), name+"/"+baseline)
		}
	}
}

// Store opens the PostgreSQL event store at url; it is closed when t ends.
func Store(t testing.TB, url string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Eventually polls cond every 5ms until it holds, failing t after timeout with
// what: the tests' one such helper, with Await.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	Await(t, timeout, func() error {
		if cond() {
			return nil
		}
		return errors.New(what)
	})
}

// Await polls cond every 5ms until it returns nil, failing t after timeout
// with the last error it returned (which says how far things got).
func Await(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %v", timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ReadAll reads every event of "all" in st, page by page: the tests' one
// read-all loop.
func ReadAll(t testing.TB, st eventstore.AllReader) []eventstore.RecordedEvent {
	t.Helper()
	const page = 1000
	var out []eventstore.RecordedEvent
	after := eventstore.Start
	for {
		evs, err := st.ReadAll(context.Background(), after, page)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, evs...)
		if len(evs) < page {
			return out
		}
		after = evs[len(evs)-1].Position
	}
}

// settleWait bounds SettledAll's wait for older transactions to end.
const settleWait = 30 * time.Second

// SettledAll is every event of "all" in st once every write that ended before
// the call shows there. A reader of "all" may see a committed write only
// later: PostgreSQL's gap-safe horizon hides a transaction's events while any
// transaction of the cluster (in any database, an autovacuum's ANALYZE among
// them) that took its ID earlier runs (postgres.VisibleBelow). So
// on PostgreSQL it first waits until every transaction ID given out before
// the call has ended. A test that counts the events a step wrote counts with
// it before and after.
func SettledAll(t testing.TB, st eventstore.AllReader) []eventstore.RecordedEvent {
	t.Helper()
	Settle(t, st)
	return ReadAll(t, st)
}

// Settle returns once every write that ended before the call shows in "all"
// of st (at once but on PostgreSQL: SettledAll). A test that has the product
// read "all" (a process's pass) and takes what it found for everything
// written calls it first.
func Settle(t testing.TB, st eventstore.AllReader) {
	t.Helper()
	if w, ok := st.(storeOnly); ok {
		st = w.Store
	}
	if pg, ok := st.(*postgres.Store); ok {
		settle(t, pg.Pool())
	}
}

// settle waits until every transaction of the cluster that had taken its ID
// when it was called has ended: the horizon of "all" has passed them.
func settle(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var next string // the first transaction ID not given out yet
	if err := pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	Eventually(t, settleWait, "the transactions older than the call to end", func() bool {
		var passed bool
		if err := pool.QueryRow(ctx, settledQuery, next).Scan(&passed); err != nil {
			t.Fatal(err)
		}
		return passed
	})
}

// settledQuery reports whether the horizon of "all" has passed every
// transaction ID below $1.
const settledQuery = `SELECT ` + postgres.VisibleBelow + ` >= $1::text::xid8`

// StreamEvents reads every event of a stream in st; none when it does not exist.
func StreamEvents(t testing.TB, st eventstore.StreamReader, stream string) []eventstore.RecordedEvent {
	t.Helper()
	evs, err := st.ReadStream(context.Background(), stream, 0, eventstore.Forwards, 0)
	if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatal(err)
	}
	return evs
}

// Account is the account aggregate folded from its stream in st, every amount
// the events state checked by the fold (a fresh account when the stream does
// not exist).
func Account(t testing.TB, st eventstore.StreamReader, id string) *domain.Account {
	t.Helper()
	acc := domain.NewAccount(id)
	for _, re := range StreamEvents(t, st, domain.AccountStream(id)) {
		m, err := domain.DecodeMetadata(re.Metadata)
		if err != nil {
			t.Fatalf("%s@%d: %v", re.Stream, re.Revision, err)
		}
		ev := domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Position: re.Position.String(), Type: re.Type, Data: re.Data, Metadata: m}
		if err := domain.EvolveAccount(acc, ev); err != nil {
			t.Fatal(err)
		}
	}
	return acc
}

// Command is a command as a test sends it: its type, its JSON body and its key.
type Command struct {
	Type string
	Body []byte
	Key  string
}

// NewCommand is the command typ with the body fields (which name its
// idempotency_key).
func NewCommand(typ string, fields map[string]any) Command {
	b, err := json.Marshal(fields)
	if err != nil {
		panic(err)
	}
	key, _ := fields["idempotency_key"].(string)
	return Command{Type: typ, Body: b, Key: key}
}

// Send sends c through the ledger's Go client lc (which resends it, same key,
// until its answer is definite or ctx ends) and returns the reply as the
// server's type, whose JSON the client's matches field for field
// (client/shape_test.go): the tests' one way to send a command as a client.
func Send(ctx context.Context, lc *client.Client, c Command) (reply.Reply, error) {
	cr, err := lc.Send(ctx, client.Raw{Type: c.Type, Body: c.Body})
	if err != nil {
		return reply.Reply{}, err
	}
	b, err := json.Marshal(cr)
	var r reply.Reply
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	return r, err
}

// Pair starts a PostgreSQL primary and its synchronous standby
// (pgcluster.Pair) in a temporary directory named after prefix, stopped and
// removed when t ends; nothing is migrated.
func Pair(t testing.TB, prefix string) *pgcluster.Pair {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pair, err := pgcluster.StartPair(context.Background(), pgcluster.PairOptions{Dirs: [2]string{filepath.Join(dir, "a"), filepath.Join(dir, "b")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pair.Stop(context.Background()) })
	return pair
}

// EvolveRecorded folds a stored account event into acc and returns its
// metadata, failing t when it does not decode or fold: the tests' one such
// step.
func EvolveRecorded(t testing.TB, acc *domain.Account, re eventstore.RecordedEvent) domain.Metadata {
	t.Helper()
	m, err := domain.DecodeMetadata(re.Metadata)
	if err == nil {
		err = domain.EvolveAccount(acc, domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Type: re.Type, Data: re.Data, Metadata: m})
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}
