package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/adapters/httpapi"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

// Runner is a background task of an instance (the transfer process, the projector).
// Run blocks until ctx ends (return nil or ctx's error then); any other return is a
// failure that stops the instance (Done).
type Runner struct {
	Name string
	Run  func(ctx context.Context, n *Node) error
}

// TransferProcess is the runner of the transfer process (internal/ledger's
// Process) on the instance's command service and store: it finishes sagas left
// half-way by a crash and expires holds. Every step it takes is idempotent, so
// one per instance is harmless. `ledger serve` and `ledger dev` run it, and so
// do the tests that start instances.
func TransferProcess(opts ledger.ProcessOptions) Runner {
	return Runner{Name: "transfer-process", Run: func(ctx context.Context, n *Node) error {
		return ledger.NewProcess(n.Ledger, n.Store, opts).Run(ctx)
	}}
}

// Options configure Start.
type Options struct {
	// Name names the instance: NATS connection name and event metadata producer
	// (default "ledger-<hostname>-<pid>").
	Name string
	// NATS is the connection to make; ignored when Conn is set.
	NATS config.NATS
	// Conn, when set, is used instead of connecting; the Node drains it on Stop.
	Conn *nats.Conn
	// EventStoreURL names the event store (postgres://, kurrentdb://, esdb://);
	// ignored when Store is set.
	EventStoreURL string
	// Store, when set, is used instead of opening EventStoreURL; Stop closes it.
	Store eventstore.Store
	// DatabaseURL is the PostgreSQL of the read models, for the runners.
	DatabaseURL string
	// HTTPAddr is where /healthz, /readyz and /metrics listen ("" for none).
	HTTPAddr string
	// Pprof serves /debug/pprof/ on HTTPAddr (httpapi.Options.Pprof).
	Pprof bool
	// DisableCommandQuery leaves ledger.v1.query.command to another service (the
	// read side); by default the intake answers it from the event store.
	DisableCommandQuery bool
	Intake              natsapi.Options
	Ledger              ledger.Options
	Runners             []Runner
	// Registry receives the metrics (default: a new registry with the Go and
	// process collectors).
	Registry *prometheus.Registry
	Logger   *slog.Logger
}

// Node is a running ledger instance. Its fields are for runners and tests.
type Node struct {
	Name          string
	NC            *nats.Conn
	Store         eventstore.Store
	Ledger        *ledger.Service
	Intake        *natsapi.Intake
	HTTP          *httpapi.Server // nil without HTTPAddr
	Registry      *prometheus.Registry
	DatabaseURL   string
	EventStoreURL string
	Logger        *slog.Logger

	cancelRunners context.CancelFunc
	runners       sync.WaitGroup
	done          chan error
	failOnce      sync.Once
	stopOnce      sync.Once
	stopErr       error
}

// Start assembles and starts an instance. On error everything started is undone.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	n = newNode(&opts)
	defer func() {
		if err != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = n.Stop(sctx)
		}
	}()
	if err := n.connectNATS(opts); err != nil {
		return n, err
	}
	if err := n.openStore(ctx, opts); err != nil {
		return n, err
	}
	n.Ledger = ledger.New(n.Store, n.ledgerOptions(opts))
	iopts := n.intakeOptions(opts)
	n.Intake = natsapi.New(n.NC, n.Ledger, iopts)
	if err := n.startHTTP(opts, iopts.Lookup); err != nil {
		return n, err
	}
	if err := n.Intake.Start(ctx); err != nil {
		return n, err
	}
	n.startRunners(opts.Runners)
	return n, nil
}

// newNode fills opts' defaults (logger, name, registry) and returns the Node
// they describe, nothing started yet.
func newNode(opts *Options) *Node {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.Name == "" {
		host, _ := os.Hostname()
		opts.Name = fmt.Sprintf("ledger-%s-%d", host, os.Getpid())
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return &Node{Name: opts.Name, Registry: reg, DatabaseURL: opts.DatabaseURL, EventStoreURL: opts.EventStoreURL, Logger: log, done: make(chan error, 1)}
}

// connectNATS takes opts.Conn or connects with opts.NATS.
func (n *Node) connectNATS(opts Options) (err error) {
	log := n.Logger
	n.NC = opts.Conn
	if n.NC == nil {
		n.NC, err = opts.NATS.Connect(opts.Name,
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil { // nil: our own drain or close
					log.Warn("nats disconnected", "err", err)
				}
			}),
			nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", config.Redact(c.ConnectedUrl())) }),
			nats.ClosedHandler(func(*nats.Conn) { n.fail(errors.New("node: NATS connection closed")) }),
		)
		if err != nil {
			return err
		}
	}
	log.Info("nats connected", "url", config.Redact(n.NC.ConnectedUrl()))
	return nil
}

// openStore takes opts.Store or opens opts.EventStoreURL.
func (n *Node) openStore(ctx context.Context, opts Options) (err error) {
	n.Store = opts.Store
	if n.Store == nil {
		if n.Store, err = config.OpenEventStore(ctx, opts.EventStoreURL, n.Logger); err != nil {
			return err
		}
		n.Logger.Info("event store open", "url", config.Redact(opts.EventStoreURL))
	}
	return nil
}

// ledgerOptions are opts.Ledger with the instance's defaults filled in.
func (n *Node) ledgerOptions(opts Options) ledger.Options {
	lopts := opts.Ledger
	if lopts.Producer == "" {
		lopts.Producer = opts.Name
	}
	if lopts.Logger == nil {
		lopts.Logger = n.Logger.With("component", "ledger")
	}
	if lopts.Metrics == nil {
		lopts.Metrics = n.Registry
	}
	return lopts
}

// intakeOptions are opts.Intake with the instance's defaults filled in (call
// it once n.Ledger is set: it answers the command query by default).
func (n *Node) intakeOptions(opts Options) natsapi.Options {
	iopts := opts.Intake
	if iopts.Metrics == nil {
		iopts.Metrics = natsapi.NewMetrics(n.Registry)
	}
	if iopts.Logger == nil {
		iopts.Logger = n.Logger
	}
	if iopts.Lookup == nil && !opts.DisableCommandQuery {
		iopts.Lookup = n.Ledger
	}
	return iopts
}

// startHTTP serves the health checks and metrics on opts.HTTPAddr, if any, and
// the transaction lookup when the intake's lookup answers it.
func (n *Node) startHTTP(opts Options, lookup natsapi.CommandLookup) error {
	if opts.HTTPAddr == "" {
		return nil
	}
	n.HTTP = httpapi.New(httpapi.Options{Addr: opts.HTTPAddr, Gatherer: n.Registry, Pprof: opts.Pprof, Logger: n.Logger})
	n.HTTP.AddCheck("nats", func(context.Context) error {
		if !n.NC.IsConnected() {
			return fmt.Errorf("nats %s", n.NC.Status())
		}
		return nil
	})
	n.HTTP.AddCheck("eventstore", func(ctx context.Context) error {
		_, err := n.Store.Head(ctx)
		return err
	})
	n.HTTP.AddCheck("intake", func(context.Context) error { return n.Intake.Ready() })
	if tl, ok := lookup.(natsapi.TransactionLookup); ok {
		n.HTTP.Handle("GET /v1/transactions/{id}", natsapi.TransactionHTTP(tl))
	}
	return n.HTTP.Start()
}

// startRunners runs each runner in its own goroutine until Stop; a runner's
// failure fails the instance (Done).
func (n *Node) startRunners(runners []Runner) {
	log := n.Logger
	rctx, cancel := context.WithCancel(context.Background())
	n.cancelRunners = cancel
	for _, r := range runners {
		n.runners.Add(1)
		go func() {
			defer n.runners.Done()
			log.Info("runner started", "runner", r.Name)
			err := r.Run(rctx, n)
			if err != nil && rctx.Err() == nil {
				log.Error("runner failed", "runner", r.Name, "err", err)
				n.fail(fmt.Errorf("node: runner %s: %w", r.Name, err))
				return
			}
			log.Info("runner stopped", "runner", r.Name)
		}()
	}
}

// Done delivers an error when the instance can no longer work (a runner failed,
// the NATS connection closed for good). Stop it then.
func (n *Node) Done() <-chan error { return n.done }

func (n *Node) fail(err error) {
	n.failOnce.Do(func() { n.done <- err })
}

// HTTPURL is the base URL of the HTTP endpoints ("" without HTTP).
func (n *Node) HTTPURL() string {
	if n.HTTP == nil {
		return ""
	}
	return n.HTTP.URL()
}

// Stop takes the instance down in order: /readyz turns 503; the intake stops taking
// commands and finishes those in flight; the runners are cancelled and awaited; the
// HTTP server shuts down; the NATS connection is drained; the store is closed.
// ctx bounds the whole; later calls return the first call's result.
func (n *Node) Stop(ctx context.Context) error {
	n.stopOnce.Do(func() { n.stopErr = n.stop(ctx) })
	return n.stopErr
}

func (n *Node) stop(ctx context.Context) error {
	var errs []error
	if n.HTTP != nil {
		n.HTTP.SetDraining()
	}
	if n.Intake != nil {
		if err := n.Intake.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if n.cancelRunners != nil {
		n.cancelRunners()
		waited := make(chan struct{})
		go func() { n.runners.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("node: runners: %w", ctx.Err()))
		}
	}
	if n.HTTP != nil {
		if err := n.HTTP.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if n.NC != nil && !n.NC.IsClosed() {
		closed := make(chan struct{})
		n.NC.SetClosedHandler(func(*nats.Conn) { close(closed) })
		if err := n.NC.Drain(); err != nil {
			n.NC.Close()
		} else {
			select {
			case <-closed:
			case <-ctx.Done():
				n.NC.Close()
				errs = append(errs, fmt.Errorf("node: nats drain: %w", ctx.Err()))
			}
		}
	}
	if n.Store != nil {
		if err := n.Store.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
