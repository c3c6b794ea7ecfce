package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v3"
)

// Environment variables. Every flag of every program has one (PROTOCOL.md §5); the
// names below are those shared by several programs.
const (
	EnvDataDir       = "LEDGER_DATA_DIR"
	EnvNATSURL       = "LEDGER_NATS_URL"
	EnvNATSCreds     = "LEDGER_NATS_CREDS"
	EnvNATSNKey      = "LEDGER_NATS_NKEY"
	EnvNATSUser      = "LEDGER_NATS_USER"
	EnvNATSPassword  = "LEDGER_NATS_PASSWORD"
	EnvNATSToken     = "LEDGER_NATS_TOKEN"
	EnvNATSTLSCert   = "LEDGER_NATS_TLS_CERT"
	EnvNATSTLSKey    = "LEDGER_NATS_TLS_KEY"
	EnvNATSTLSCA     = "LEDGER_NATS_TLS_CA"
	EnvEventStoreURL = "LEDGER_EVENTSTORE_URL"
	EnvDatabaseURL   = "LEDGER_DATABASE_URL"
	EnvHTTPAddr      = "LEDGER_HTTP_ADDR"
	EnvLogFormat     = "LEDGER_LOG_FORMAT"
	EnvLogLevel      = "LEDGER_LOG_LEVEL"
	// EnvJetStreamReplicas is --jetstream-replicas.
	EnvJetStreamReplicas = "LEDGER_JETSTREAM_REPLICAS"
)

// Flag names shared by several programs.
const (
	FlagDataDir       = "data-dir"
	FlagNATSURL       = "nats-url"
	FlagNATSCreds     = "nats-creds"
	FlagNATSNKey      = "nats-nkey"
	FlagNATSUser      = "nats-user"
	FlagNATSPassword  = "nats-password"
	FlagNATSToken     = "nats-token"
	FlagNATSTLSCert   = "nats-tls-cert"
	FlagNATSTLSKey    = "nats-tls-key"
	FlagNATSTLSCA     = "nats-tls-ca"
	FlagEventStoreURL = "eventstore-url"
	// FlagJetStreamReplicas is the replicas of the streams a program declares.
	FlagJetStreamReplicas = "jetstream-replicas"
	FlagDatabaseURL       = "database-url"
	FlagHTTPAddr          = "http-addr"
	FlagLogFormat         = "log-format"
	FlagLogLevel          = "log-level"
)

// DefaultNATSURL is the NATS server a program connects to when nothing says otherwise
// (the address `ledger dev` serves on by default).
const DefaultNATSURL = "nats://127.0.0.1:4222"

// DataDirFlag is --data-dir: the data dir of `ledger dev`, or, for the other
// commands, the data dir of a running `ledger dev` whose URLs they use.
func DataDirFlag(usage string) cli.Flag {
	if usage == "" {
		usage = "data dir of a running ledger dev: its dev.json gives the NATS and database URLs not set otherwise"
	}
	return &cli.StringFlag{Name: FlagDataDir, Usage: usage, Value: DefaultDataDir, Sources: cli.EnvVars(EnvDataDir), TakesFile: true}
}

// NATSFlags are the flags of a NATS client connection: URL, credentials, nkey, user
// and password or token, TLS.
func NATSFlags() []cli.Flag {
	cat := "NATS"
	return []cli.Flag{
		&cli.StringFlag{Name: FlagNATSURL, Category: cat, Value: DefaultNATSURL, Usage: "NATS server URL(s), comma-separated", Sources: cli.EnvVars(EnvNATSURL)},
		&cli.StringFlag{Name: FlagNATSCreds, Category: cat, Usage: "NATS credentials file (JWT and nkey seed)", Sources: cli.EnvVars(EnvNATSCreds), TakesFile: true},
		&cli.StringFlag{Name: FlagNATSNKey, Category: cat, Usage: "NATS nkey seed file", Sources: cli.EnvVars(EnvNATSNKey), TakesFile: true},
		&cli.StringFlag{Name: FlagNATSUser, Category: cat, Usage: "NATS user name", Sources: cli.EnvVars(EnvNATSUser)},
		&cli.StringFlag{Name: FlagNATSPassword, Category: cat, Usage: "NATS password (prefer the environment variable)", Sources: cli.EnvVars(EnvNATSPassword)},
		&cli.StringFlag{Name: FlagNATSToken, Category: cat, Usage: "NATS authentication token (prefer the environment variable)", Sources: cli.EnvVars(EnvNATSToken)},
		&cli.StringFlag{Name: FlagNATSTLSCert, Category: cat, Usage: "client certificate (PEM) for NATS mutual TLS", Sources: cli.EnvVars(EnvNATSTLSCert), TakesFile: true},
		&cli.StringFlag{Name: FlagNATSTLSKey, Category: cat, Usage: "client key (PEM) for NATS mutual TLS", Sources: cli.EnvVars(EnvNATSTLSKey), TakesFile: true},
		&cli.StringFlag{Name: FlagNATSTLSCA, Category: cat, Usage: "CA certificates (PEM) that sign the NATS server's certificate", Sources: cli.EnvVars(EnvNATSTLSCA), TakesFile: true},
	}
}

// NATS is a NATS client configuration.
type NATS struct {
	URL      string
	Creds    string // credentials file
	NKey     string // nkey seed file
	User     string
	Password string
	Token    string
	TLSCert  string
	TLSKey   string
	TLSCA    string
}

// NATSFromCommand reads the NATSFlags of cmd.
func NATSFromCommand(cmd *cli.Command) NATS {
	return NATS{
		URL: cmd.String(FlagNATSURL), Creds: cmd.String(FlagNATSCreds), NKey: cmd.String(FlagNATSNKey),
		User: cmd.String(FlagNATSUser), Password: cmd.String(FlagNATSPassword), Token: cmd.String(FlagNATSToken),
		TLSCert: cmd.String(FlagNATSTLSCert), TLSKey: cmd.String(FlagNATSTLSKey), TLSCA: cmd.String(FlagNATSTLSCA),
	}
}

// Options are the nats.Options of the configuration, for nats.Connect.
func (n NATS) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if n.Creds != "" && n.NKey != "" {
		return nil, errors.New("config: --nats-creds and --nats-nkey exclude each other")
	}
	if n.Creds != "" {
		opts = append(opts, nats.UserCredentials(n.Creds))
	}
	if n.NKey != "" {
		o, err := nats.NkeyOptionFromSeed(n.NKey)
		if err != nil {
			return nil, fmt.Errorf("config: nkey seed %s: %w", n.NKey, err)
		}
		opts = append(opts, o)
	}
	if n.User != "" || n.Password != "" {
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	}
	if n.Token != "" {
		opts = append(opts, nats.Token(n.Token))
	}
	if (n.TLSCert == "") != (n.TLSKey == "") {
		return nil, errors.New("config: --nats-tls-cert and --nats-tls-key go together")
	}
	if n.TLSCert != "" {
		opts = append(opts, nats.ClientCert(n.TLSCert, n.TLSKey))
	}
	if n.TLSCA != "" {
		opts = append(opts, nats.RootCAs(n.TLSCA))
	}
	return opts, nil
}

// Connect connects to NATS as name, with the configuration's options followed by
// extra. The connection retries forever once established (commands are retried by
// their clients with the same key; the service must not exit on a NATS restart).
func (n NATS) Connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := n.Options()
	if err != nil {
		return nil, err
	}
	url := n.URL
	if url == "" {
		url = DefaultNATSURL
	}
	base := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond), nats.Timeout(5 * time.Second)}
	nc, err := nats.Connect(url, append(append(base, opts...), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("config: connect to NATS at %s (%s): %w", Redact(url), n.Mode(), err)
	}
	return nc, nil
}

// Mode names how the configuration authenticates, for errors and logs: never a
// secret, only which settings are in use.
func (n NATS) Mode() string {
	var auth []string
	switch {
	case n.Creds != "":
		auth = append(auth, "credentials file "+n.Creds)
	case n.NKey != "":
		auth = append(auth, "nkey seed file "+n.NKey)
	}
	if n.User != "" {
		auth = append(auth, "user "+n.User+" with a password")
	}
	if n.Token != "" {
		auth = append(auth, "token")
	}
	if len(auth) == 0 {
		auth = append(auth, "no authentication")
	}
	switch {
	case n.TLSCert != "":
		auth = append(auth, "mutual TLS")
	case n.TLSCA != "":
		auth = append(auth, "TLS")
	}
	return "auth: " + strings.Join(auth, ", ")
}

// FlagGOGC is --gogc (LEDGER_GOGC).
const (
	FlagGOGC = "gogc"
	EnvGOGC  = "LEDGER_GOGC"
)

// DefaultGOGC is the garbage collector's target of the programs, where Go's own
// default is 100. The ledger keeps every account's key records in memory; with
// 100 the collector marked that heap about once a second on the benchmark's
// 2-core machine, and its mark phases were the main source of the latency tail
// (BENCHMARKS.md). 400 lets the heap grow to five times what is live before a
// cycle. Bound the memory with GOMEMLIMIT where it matters.
const DefaultGOGC = "400"

// ReadToolGOGC is the collector's target of the tools that read the whole
// history once (audit, rebuild, replay): what they keep live is bounded, and
// what they allocate per event is garbage at once. 400 let the peak grow to
// five times what is live (BENCHMARKS.md, "Read side at size"); 200 lets the
// heap reach three times it, which ReadToolMemoryLimit caps once the live
// heap is large: the collector's share of the rebuild's CPU samples 21.9%
// there against 26.9% at 100 and 384 MiB, of the audit's 13.8% against 17.7%
// (BENCHMARKS.md, "448 MiB and GOGC 200").
const ReadToolGOGC = "200"

// LogFlags are the flags of every program's process: --log-format, --log-level
// and --gogc (applied by LoggerFromCommand).
func LogFlags() []cli.Flag { return logFlags(DefaultGOGC) }

// ReadToolFlags are LogFlags with --gogc at ReadToolGOGC, --memory-limit at
// ReadToolMemoryLimit, and ProfileFlags: the flags of the tools that read the
// whole history (StartProfiles).
func ReadToolFlags() []cli.Flag {
	flags := append(logFlags(ReadToolGOGC), MemoryLimitFlag(FlagMemoryLimit, ReadToolMemoryLimit, "", cli.EnvVars(EnvMemoryLimit)))
	return append(flags, ProfileFlags()...)
}

func logFlags(gogc string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: FlagLogFormat, Value: "text", Usage: "log format: text or json", Sources: cli.EnvVars(EnvLogFormat)},
		&cli.StringFlag{Name: FlagLogLevel, Value: "info", Usage: "log level: debug, info, warn or error", Sources: cli.EnvVars(EnvLogLevel)},
		&cli.StringFlag{Name: FlagGOGC, Value: gogc, Usage: "garbage collector target percentage, as Go's GOGC (a positive integer, or off; a GOGC in the environment wins over this default); pair it with GOMEMLIMIT to bound memory", Sources: cli.EnvVars(EnvGOGC)},
	}
}

// SetGOGC applies a GOGC value ("off" or a positive integer).
func SetGOGC(v string) error {
	if v == "off" {
		debug.SetGCPercent(-1)
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return fmt.Errorf("config: gogc %q: want a positive integer or off", v)
	}
	debug.SetGCPercent(n)
	return nil
}

// NewLogger returns a slog.Logger writing to w in format ("text" or "json") at level.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("config: log level %q: want debug, info, warn or error", level)
	}
	hopts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, hopts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, hopts)), nil
	}
	return nil, fmt.Errorf("config: log format %q: want text or json", format)
}

// LoggerFromCommand builds the logger of cmd's LogFlags, makes it slog's
// default (Main logs a stop with it), and applies --gogc, unless it was left
// at its default and the Go runtime already took GOGC from the environment.
func LoggerFromCommand(cmd *cli.Command, w io.Writer) (*slog.Logger, error) {
	if cmd.IsSet(FlagGOGC) || os.Getenv("GOGC") == "" {
		if err := SetGOGC(cmd.String(FlagGOGC)); err != nil {
			return nil, err
		}
	}
	if err := memoryLimitFromCommand(cmd); err != nil {
		return nil, err
	}
	log, err := NewLogger(w, cmd.String(FlagLogFormat), cmd.String(FlagLogLevel))
	if err == nil {
		slog.SetDefault(log)
	}
	return log, err
}

// FromDataDir returns the value of flag on cmd when it was set (by flag or
// environment); otherwise, when cmd has a --data-dir whose dev.json exists, the
// value pick takes from it; otherwise the flag's default. Commands that accept
// --data-dir (post, replay, audit, projector) use it to reach a running `ledger dev`.
func FromDataDir(cmd *cli.Command, flag string, pick func(DevInfo) string) (string, error) {
	if cmd.IsSet(flag) {
		return cmd.String(flag), nil
	}
	dir := cmd.String(FlagDataDir)
	if dir != "" {
		info, _, err := ReadDevInfo(dir)
		switch {
		case err == nil:
			if v := pick(info); v != "" {
				return v, nil
			}
		case errors.Is(err, ErrNoDevInfo):
			if cmd.IsSet(FlagDataDir) {
				return "", err // asked for this data dir explicitly: say it has no dev
			}
		default:
			return "", err
		}
	}
	return cmd.String(flag), nil
}

// MaxJetStreamReplicas is the most replicas JetStream keeps of a stream.
const MaxJetStreamReplicas = 5

// ReplicasFlag is --jetstream-replicas (LEDGER_JETSTREAM_REPLICAS): the
// replicas of the streams the program declares, 1 to 5; 3 on a 3-node
// JetStream cluster (docs/operations.md). usage names the streams.
func ReplicasFlag(category, usage string) cli.Flag {
	return &cli.IntFlag{Name: FlagJetStreamReplicas, Category: category, Value: 1, Usage: usage, Sources: cli.EnvVars(EnvJetStreamReplicas),
		Validator: func(n int) error {
			if n < 1 || n > MaxJetStreamReplicas {
				return fmt.Errorf("--%s: %d replicas: JetStream keeps 1 to %d", FlagJetStreamReplicas, n, MaxJetStreamReplicas)
			}
			return nil
		}}
}
