// Package embednats runs a nats-server inside the process, with JetStream on disk:
// the NATS of `ledger dev` and of the tests.
//
// Durability. Nothing the ledger acknowledges rests on JetStream's files: a command
// is acknowledged by the ledger's reply (request-reply, and js.Publish, whose
// stream LEDGER_COMMANDS is NoAck) or by the consumer's ack, and either comes only
// after its outcome is durable in the event store. The stream is the intake's
// buffer and record of what arrived. Each message is written to its file as it is
// stored (the server flushes in place), so a killed process loses nothing the
// stream held; the fsync that guards it against a crash of the machine runs every
// SyncInterval (default 1s), not per message. Syncing every message (SyncAlways)
// caps the stream at about 1,800 messages/s on this project's 2-core machine:
// past that the server drops captured commands from its ingest queue
// (BENCHMARKS.md), which loses far more of the record than a 1s window would.
package embednats

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configure an embedded nats-server.
type Options struct {
	// Addr is host:port; port 0 picks a free one.
	Addr string
	// StoreDir holds JetStream's files.
	StoreDir string
	// Name is the server name (default "ledger-dev").
	Name string
	// SyncInterval is how often JetStream fsyncs its files (default 1s; see the
	// package comment). SyncAlways fsyncs every write instead.
	SyncInterval time.Duration
	SyncAlways   bool
	Logger       *slog.Logger
	// User and Password, when set, are required of every client.
	User, Password string
	// ClusterName, ClusterAddr (host:port) and Routes (nats-route://host:port
	// of the other nodes) make the server a node of a JetStream cluster.
	ClusterName string
	ClusterAddr string
	Routes      []string
	// ClusterAdvertise, when set, is the route address the node tells the
	// others, instead of ClusterAddr; NoAdvertise keeps the cluster's client
	// addresses from its clients, which then use only the URLs they were
	// given (the chaos suite puts its proxies there).
	ClusterAdvertise string
	NoAdvertise      bool
	// MonitorAddr, when set, is the host:port of the HTTP monitoring
	// endpoints (/jsz names the JetStream meta leader).
	MonitorAddr string
}

// MaxPayload is the largest message the embedded servers take (PROTOCOL.md
// v1.2 §2.2: 8 MiB, the reply to any batch within the limits fits).
const MaxPayload = 8 << 20

// DefaultSyncInterval is Options.SyncInterval's default.
const DefaultSyncInterval = time.Second

// Start starts an embedded nats-server with JetStream on disk under StoreDir and
// waits until it accepts connections.
func Start(o Options) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return nil, fmt.Errorf("embednats: nats address %q: %w", o.Addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embednats: nats address %q: %w", o.Addr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if o.Name == "" {
		o.Name = "ledger-dev"
	}
	if o.SyncInterval < 0 {
		return nil, fmt.Errorf("embednats: negative sync interval %s", o.SyncInterval)
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	opts := &server.Options{
		ServerName:   o.Name,
		Host:         host,
		Port:         port,
		JetStream:    true,
		StoreDir:     o.StoreDir,
		SyncInterval: o.SyncInterval,
		SyncAlways:   o.SyncAlways,
		NoSigs:       true,
		// PROTOCOL.md v1.2 §2.2: the ledger's servers allow 8 MiB messages, so
		// that the reply to every batch within its limits fits (and an
		// oversized command or batch still arrives and gets its
		// invalid_request reply).
		MaxPayload: MaxPayload,
		Username:   o.User,
		Password:   o.Password,
	}
	if o.ClusterName != "" {
		if err := clusterOptions(opts, o); err != nil {
			return nil, err
		}
	}
	if o.MonitorAddr != "" {
		mhost, mport, err := net.SplitHostPort(o.MonitorAddr)
		if err != nil {
			return nil, fmt.Errorf("embednats: monitor address %q: %w", o.MonitorAddr, err)
		}
		if opts.HTTPPort, err = strconv.Atoi(mport); err != nil {
			return nil, fmt.Errorf("embednats: monitor address %q: %w", o.MonitorAddr, err)
		}
		opts.HTTPHost = mhost
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embednats: nats-server: %w", err)
	}
	if o.Logger != nil {
		s.SetLoggerV2(&natsLogger{l: o.Logger.With("component", "nats-server")}, false, false, false)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embednats: nats-server on %s did not become ready", o.Addr)
	}
	return s, nil
}

// natsLogger sends the server's log to slog.
type natsLogger struct{ l *slog.Logger }

func (n *natsLogger) Noticef(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Warnf(format string, v ...any)   { n.l.Warn(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Fatalf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Errorf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Debugf(format string, v ...any)  { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Tracef(format string, v ...any)  {}

// ParseSync reads a sync setting as the flag --nats-sync spells it: "always", or
// a positive duration such as "1s".
func ParseSync(s string) (interval time.Duration, always bool, err error) {
	if s == "always" {
		return 0, true, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, false, fmt.Errorf("nats sync %q: want \"always\" or a positive duration such as 1s", s)
	}
	return d, false, nil
}
