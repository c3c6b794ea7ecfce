// Package embednats runs a nats-server inside the process, with JetStream on disk
// and every write synced: the NATS of `ledger dev` and of the tests.
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
	Name   string
	Logger *slog.Logger
}

// Start starts an embedded nats-server with JetStream on disk under StoreDir,
// syncing every write (sync_interval: always) so that what JetStream acknowledged
// survives a SIGKILL of this process, and waits until it accepts connections.
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
	opts := &server.Options{
		ServerName: o.Name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		SyncAlways: true, // sync_interval: always
		NoSigs:     true,
		// Leave room above the ledger's 64 KiB body limit so that an oversized
		// command still arrives and gets its invalid_request reply.
		MaxPayload: 1 << 20,
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
