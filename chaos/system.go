package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/platform/freeport"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/projections"
)

// suite holds what every scenario shares: the built binaries and the PostgreSQL
// cluster (each scenario gets a database of its own and a NATS of its own).
type suite struct {
	dir                     string
	ledgerBin, projectorBin string
	self                    string
	pgDir                   string
	pgPort                  int
	pgMu                    sync.Mutex
	pg                      *pgcluster.Cluster
	quick                   bool
	seed                    uint64
	verbose                 bool
	fuzzTime                time.Duration
}

func (s *suite) cluster() *pgcluster.Cluster {
	s.pgMu.Lock()
	defer s.pgMu.Unlock()
	return s.pg
}

// restartPostgres is `pg_ctl restart -m immediate`: SIGQUIT to the postmaster
// (what pg_ctl's immediate mode sends: no checkpoint, crash recovery at the next
// start), then a start on the same directory and port.
func (s *suite) restartPostgres(ctx context.Context) (time.Duration, error) {
	began := time.Now()
	pidFile := filepath.Join(s.pgDir, "data", "postmaster.pid")
	pid, err := readPID(pidFile)
	if err != nil {
		return 0, err
	}
	if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil {
		return 0, err
	}
	for i := 0; i < 300; i++ { // bounded: 30 s
		if syscall.Kill(pid, 0) != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	c, err := pgcluster.Start(sctx, pgcluster.Options{Dir: s.pgDir, Port: s.pgPort, Fsync: true, Logger: quietLogger()})
	if err != nil {
		return 0, err
	}
	s.pgMu.Lock()
	s.pg = c
	s.pgMu.Unlock()
	return time.Since(began), nil
}

// system is one scenario's running ledger: nats-server, ledger instances and
// projectors as processes, a database of its own, and the client connection.
type system struct {
	s    *suite
	name string
	dir  string

	db    string
	dbURL string

	natsPort  int
	natsStore string
	nats      *proc
	// cluster, when set (scenario 13), is the NATS the system runs instead
	// of nats.
	cluster *natsCluster

	// URLs the services use (a proxy's in scenario 7).
	svcNATSURL string
	svcDBURL   string

	ledgerArgs []string
	ledgerEnv  []string
	svcEnv     []string // the ledgers' and the projectors'
	ledgers    []*svc
	projectors []*svc

	nc         *nats.Conn
	reconnects atomic.Int64
	kills      atomic.Int64
	pool       *pgxpool.Pool
	store      *postgres.Store
}

// svc is a ledger or projector process with its HTTP port.
type svc struct {
	*proc
	port int
	// restart serialises the restarts of the process (a killer's and a watcher's).
	restart sync.Mutex
}

func (s *svc) readyURL() string { return fmt.Sprintf("http://127.0.0.1:%d/readyz", s.port) }

func newSystem(ctx context.Context, s *suite, name string) (*system, error) {
	sys := &system{s: s, name: name, dir: filepath.Join(s.dir, name), db: "chaos_" + name}
	if err := os.MkdirAll(sys.dir, 0o755); err != nil {
		return nil, err
	}
	if err := pgcluster.RecreateDatabase(ctx, s.cluster().URL(), sys.db); err != nil {
		return nil, err
	}
	sys.dbURL = s.cluster().URLFor(sys.db)
	sys.svcDBURL = sys.dbURL
	var err error
	if sys.natsPort, err = freeport.Loopback(); err != nil {
		return nil, err
	}
	sys.natsStore = filepath.Join(sys.dir, "nats")
	sys.nats = &proc{name: "nats-server", bin: s.self, args: []string{"nats-server", "--store", sys.natsStore, "--port", strconv.Itoa(sys.natsPort)}, log: filepath.Join(sys.dir, "nats.log")}
	sys.svcNATSURL = sys.natsURL()
	return sys, nil
}

func (sys *system) natsURL() string {
	if sys.cluster != nil {
		return sys.cluster.directURL()
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", sys.natsPort)
}

func (sys *system) startNATS(ctx context.Context) error {
	if sys.cluster != nil {
		return sys.cluster.start(ctx)
	}
	if err := sys.nats.start(); err != nil {
		return err
	}
	return waitTCP(ctx, fmt.Sprintf("127.0.0.1:%d", sys.natsPort), 30*time.Second)
}

// connect opens the client's NATS connection (reconnecting forever, counted) and
// the checker's pool and store.
func (sys *system) connect(ctx context.Context, url string) error {
	nc, err := nats.Connect(url,
		nats.Name("chaos-client"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectHandler(func(*nats.Conn) { sys.reconnects.Add(1) }),
		nats.DisconnectErrHandler(func(*nats.Conn, error) {}),
		nats.Timeout(2*time.Second),
	)
	if err != nil {
		return err
	}
	sys.nc = nc
	cfg, err := pgxpool.ParseConfig(sys.dbURL)
	if err != nil {
		return err
	}
	postgres.WatchSyncReplication(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	sys.pool = pool
	sys.store = postgres.New(pool)
	return nil
}

func (sys *system) newLedger(i int) (*svc, error) {
	port, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	args := []string{"serve",
		"--nats-url", sys.svcNATSURL,
		"--eventstore-url", sys.svcDBURL,
		"--database-url", sys.svcDBURL,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", port),
		"--instance-name", fmt.Sprintf("ledger-%d", i),
		"--shutdown-timeout", "10s",
	}
	args = append(args, sys.ledgerArgs...)
	p := &proc{name: fmt.Sprintf("ledger-%d", i), bin: sys.s.ledgerBin, args: args, env: append(append([]string(nil), sys.ledgerEnv...), sys.svcEnv...), log: filepath.Join(sys.dir, fmt.Sprintf("ledger-%d.log", i))}
	return &svc{proc: p, port: port}, nil
}

func (sys *system) newProjector(i int) (*svc, error) {
	port, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	args := []string{"run",
		"--nats-url", sys.svcNATSURL,
		"--eventstore-url", sys.svcDBURL,
		"--database-url", sys.svcDBURL,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", port),
		"--shutdown-timeout", "10s",
	}
	p := &proc{name: fmt.Sprintf("projector-%d", i), bin: sys.s.projectorBin, args: args, env: sys.svcEnv, log: filepath.Join(sys.dir, fmt.Sprintf("projector-%d.log", i))}
	return &svc{proc: p, port: port}, nil
}

// startSvc starts a service and waits until its /readyz answers 200.
func (sys *system) startSvc(ctx context.Context, v *svc) error {
	if err := v.start(); err != nil {
		return err
	}
	if err := waitHTTP(ctx, v.readyURL(), 60*time.Second, v.running); err != nil {
		return fmt.Errorf("%s: %w (log: %s)", v.name, err, v.log)
	}
	return nil
}

// up starts nats-server, nLedgers ledgers and nProjectors projectors and connects
// the client.
func (sys *system) up(ctx context.Context, nLedgers, nProjectors int) error {
	if err := sys.startNATS(ctx); err != nil {
		return err
	}
	if err := sys.connect(ctx, sys.natsURL()); err != nil {
		return err
	}
	for i := 0; i < nLedgers; i++ {
		l, err := sys.newLedger(i)
		if err != nil {
			return err
		}
		if err := sys.startSvc(ctx, l); err != nil {
			return err
		}
		sys.ledgers = append(sys.ledgers, l)
	}
	for i := 0; i < nProjectors; i++ {
		p, err := sys.newProjector(i)
		if err != nil {
			return err
		}
		if err := sys.startSvc(ctx, p); err != nil {
			return err
		}
		sys.projectors = append(sys.projectors, p)
	}
	return nil
}

// down stops everything (SIGTERM, then SIGKILL).
func (sys *system) down() {
	if sys.nc != nil {
		sys.nc.Close()
	}
	for _, p := range sys.projectors {
		p.stop(10 * time.Second)
	}
	for _, l := range sys.ledgers {
		l.stop(10 * time.Second)
	}
	if sys.cluster != nil {
		sys.cluster.stop()
	} else if sys.nats != nil {
		sys.nats.stop(5 * time.Second)
	}
	if sys.pool != nil {
		sys.pool.Close()
	}
}

// consumerInfo returns the durable consumer's state.
func (sys *system) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	js, err := jetstream.New(sys.nc)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := js.Consumer(cctx, natsapi.StreamName, natsapi.DefaultDurable)
	if err != nil {
		return nil, err
	}
	return c.Info(cctx)
}

// dlqCount is the number of messages in the dead-letter stream.
func (sys *system) dlqCount(ctx context.Context) (uint64, error) {
	js, err := jetstream.New(sys.nc)
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := js.Stream(cctx, natsapi.DLQStreamName)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(cctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// quiesce waits (bounded) until the JetStream consumer has nothing pending and
// every projection's checkpoint reached the store's head.
func (sys *system) quiesce(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		last = sys.quiet(ctx)
		if last == nil {
			// Twice, a moment apart: a redelivery may be about to land.
			time.Sleep(300 * time.Millisecond)
			if last = sys.quiet(ctx); last == nil {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not quiet after %s: %w", timeout, last)
}

func (sys *system) quiet(ctx context.Context) error {
	info, err := sys.consumerInfo(ctx)
	if err != nil {
		return err
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		return fmt.Errorf("consumer: %d pending, %d awaiting ack", info.NumPending, info.NumAckPending)
	}
	if len(sys.projectors) == 0 {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	head, err := sys.store.Head(qctx)
	if err != nil {
		return err
	}
	cps, err := projections.Checkpoints.LiveByName(qctx, sys.pool)
	if err != nil {
		return err
	}
	if len(cps) == 0 {
		return errors.New("no checkpoints")
	}
	for name, p := range cps {
		if p.Compare(head) != 0 {
			return fmt.Errorf("projection %s at %s, head %s", name, p, head)
		}
	}
	pub, err := projections.Checkpoints.Published(qctx, sys.pool)
	if err != nil {
		return err
	}
	if pub.Compare(head) != 0 {
		return fmt.Errorf("events publisher at %s, head %s", pub, head)
	}
	return nil
}

// eventsOut runs the audit's events-out check on LEDGER_EVENTS (nil when the
// system runs no projector, whose processes publish).
func (sys *system) eventsOut(ctx context.Context) (*EventsOut, error) {
	if len(sys.projectors) == 0 {
		return nil, nil
	}
	js, err := jetstream.New(sys.nc)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	found, err := audit.EventsOut(cctx, sys.store, sys.pool, audit.EventsOutOptions{JS: js})
	if err != nil {
		return nil, err
	}
	return &found, nil
}

// dlqReasons counts the dead letters by their reason header (bounded read).
func (sys *system) dlqReasons(ctx context.Context) (map[string]int, error) {
	js, err := jetstream.New(sys.nc)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(cctx, natsapi.DLQStreamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	batch, err := c.FetchNoWait(1000)
	if err != nil {
		return nil, err
	}
	for m := range batch.Messages() {
		out[m.Headers().Get(natsapi.HeaderDLQReason)]++
	}
	return out, batch.Error()
}
