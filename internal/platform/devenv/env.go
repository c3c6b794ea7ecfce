package devenv

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
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
	"github.com/ledgerworks/ledger/internal/platform/node"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/migrations"
)

// Layout of the data dir.
const (
	NATSSubdir     = "nats"             // JetStream store
	PostgresSubdir = "postgres"         // the private cluster (when no DatabaseURL)
	StandbySubdir  = "postgres-standby" // its synchronous standby (with Standby)
)

// Options configure Start.
type Options struct {
	// DataDir holds JetStream's files, the private PostgreSQL cluster and dev.json.
	DataDir string
	// NATSAddr is the embedded server's listen address (port 0: a free one).
	NATSAddr string
	// NATSSyncInterval and NATSSyncAlways set how JetStream fsyncs its files
	// (embednats.Options: default every second).
	NATSSyncInterval time.Duration
	NATSSyncAlways   bool
	// NATSAuth makes the embedded server require a user and a password, generated
	// at start; they travel in NATSURL, which dev.json (mode 0600) holds.
	NATSAuth bool
	// HTTPAddr is where /healthz, /readyz, /metrics (and runners' routes) listen
	// ("" for no HTTP; port 0: a free one).
	HTTPAddr string
	// DatabaseURL is an existing PostgreSQL; when empty a private cluster is
	// started under DataDir.
	DatabaseURL string
	// EventStoreURL is the event store; when empty, DatabaseURL.
	EventStoreURL string
	// Standby runs the private cluster as a pair (pgcluster.Pair): a primary
	// under DataDir/postgres and its synchronous standby under
	// DataDir/postgres-standby, reached by one multi-host URL, the production
	// shape on a laptop (docs/operations.md).
	Standby bool
	// NoFsync runs the private cluster without fsync (tests only: what it
	// acknowledged would not survive a crash of the machine).
	NoFsync bool
	// Node configures the ledger node; its NATS, store URLs and HTTPAddr are filled
	// in by Start.
	Node   node.Options
	Logger *slog.Logger
}

// Env is a running development environment.
type Env struct {
	DataDir       string
	NATS          *server.Server
	NATSURL       string
	PG            *pgcluster.Cluster // nil when DatabaseURL was given, or with Standby
	Pair          *pgcluster.Pair    // with Standby
	DatabaseURL   string
	EventStoreURL string
	Node          *node.Node
	log           *slog.Logger
}

// Start brings up NATS, PostgreSQL, the migrations and a node, in that order.
// On error whatever was started is stopped.
func Start(ctx context.Context, o Options) (env *Env, err error) {
	env, err = newEnv(o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = env.Stop(sctx)
		}
	}()
	if err := env.startNATS(o); err != nil {
		return env, err
	}
	if err := env.startPostgres(ctx, o); err != nil {
		return env, err
	}
	if err := migrate(ctx, env.DatabaseURL, env.EventStoreURL); err != nil {
		return env, err
	}
	env.log.Info("migrations applied", "database", config.Redact(env.DatabaseURL))
	if err := env.startNode(ctx, o); err != nil {
		return env, err
	}
	return env, nil
}

// newEnv makes o.DataDir and returns the Env it holds, nothing started yet.
func newEnv(o Options) (*Env, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	if o.DataDir == "" {
		return nil, errors.New("devenv: DataDir is empty")
	}
	dir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	return &Env{DataDir: dir, log: log}, nil
}

// startNATS starts the embedded nats-server (with a random password under
// o.NATSAuth) and sets NATSURL.
func (env *Env) startNATS(o Options) (err error) {
	if o.NATSAddr == "" {
		o.NATSAddr = "127.0.0.1:4222"
	}
	dir := env.DataDir
	nopt := embednats.Options{Addr: o.NATSAddr, StoreDir: filepath.Join(dir, NATSSubdir), SyncInterval: o.NATSSyncInterval, SyncAlways: o.NATSSyncAlways, Logger: env.log}
	if o.NATSAuth {
		var raw [24]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return err
		}
		nopt.User, nopt.Password = "ledger", hex.EncodeToString(raw[:])
	}
	env.NATS, err = embednats.Start(nopt)
	if err != nil {
		return err
	}
	env.NATSURL = env.NATS.ClientURL()
	if o.NATSAuth {
		u, err := url.Parse(env.NATSURL)
		if err != nil {
			return err
		}
		u.User = url.UserPassword(nopt.User, nopt.Password)
		env.NATSURL = u.String()
	}
	env.log.Info("nats-server ready", "url", config.Redact(env.NATSURL), "auth", o.NATSAuth, "jetstream", filepath.Join(dir, NATSSubdir))
	return nil
}

// startPostgres takes o.DatabaseURL or starts the private cluster (a pair
// under o.Standby), and sets DatabaseURL and EventStoreURL.
func (env *Env) startPostgres(ctx context.Context, o Options) (err error) {
	dir, log := env.DataDir, env.log
	env.DatabaseURL = o.DatabaseURL
	switch {
	case o.Standby && env.DatabaseURL != "":
		return errors.New("devenv: a standby is made for the private cluster only, not for a database URL")
	case o.Standby:
		env.Pair, err = pgcluster.StartPair(ctx, pgcluster.PairOptions{
			Dirs:  [2]string{filepath.Join(dir, PostgresSubdir), filepath.Join(dir, StandbySubdir)},
			Fsync: !o.NoFsync, Logger: log,
		})
		if err != nil {
			return fmt.Errorf("devenv: private PostgreSQL pair: %w", err)
		}
		env.DatabaseURL = env.Pair.URL()
	case env.DatabaseURL == "":
		env.PG, err = pgcluster.Start(ctx, pgcluster.Options{Dir: filepath.Join(dir, PostgresSubdir), Fsync: !o.NoFsync, Logger: log})
		if err != nil {
			return fmt.Errorf("devenv: private PostgreSQL (set %s to use another): %w", config.EnvDatabaseURL, err)
		}
		env.DatabaseURL = env.PG.URL()
	}
	env.EventStoreURL = o.EventStoreURL
	if env.EventStoreURL == "" {
		env.EventStoreURL = env.DatabaseURL
	}
	return nil
}

// startNode starts the ledger node on the environment's NATS and PostgreSQL.
func (env *Env) startNode(ctx context.Context, o Options) (err error) {
	nopts := o.Node
	nopts.NATS.URL = env.NATSURL
	nopts.EventStoreURL = env.EventStoreURL
	nopts.DatabaseURL = env.DatabaseURL
	nopts.HTTPAddr = o.HTTPAddr
	if nopts.Logger == nil {
		nopts.Logger = env.log
	}
	env.Node, err = node.Start(ctx, nopts)
	return err
}

// migrate applies the migrations to the read-model database and, when it is a
// different PostgreSQL, to the event store's.
func migrate(ctx context.Context, databaseURL, eventStoreURL string) error {
	if err := migrations.Up(ctx, databaseURL); err != nil {
		return err
	}
	if eventStoreURL != databaseURL {
		if b, err := config.EventStoreBackend(eventStoreURL); err == nil && b == config.BackendPostgres {
			return migrations.Up(ctx, eventStoreURL)
		}
	}
	return nil
}

// Info is what dev.json records of the environment.
func (e *Env) Info() config.DevInfo {
	info := config.DevInfo{PID: os.Getpid(), NATSURL: e.NATSURL, DatabaseURL: e.DatabaseURL, EventStoreURL: e.EventStoreURL, StartedAt: time.Now().UTC()}
	if e.Node != nil {
		info.HTTPURL = e.Node.HTTPURL()
	}
	return info
}

// Stop stops the node (finishing the commands in flight), then NATS, then the
// private PostgreSQL cluster. ctx bounds the whole.
func (e *Env) Stop(ctx context.Context) error {
	var errs []error
	if e.Node != nil {
		if err := e.Node.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if e.NATS != nil {
		e.NATS.Shutdown()
		e.NATS.WaitForShutdown()
	}
	if e.PG != nil {
		if err := e.PG.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if e.Pair != nil {
		errs = append(errs, e.Pair.Stop(ctx))
	}
	return errors.Join(errs...)
}
