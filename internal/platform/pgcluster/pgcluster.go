package pgcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/platform/freeport"
)

// Database is the database Start creates and URL points at.
const Database = "ledger"

// Superuser is the cluster's superuser role. It authenticates with
// scram-sha-256 and a password generated when the cluster is made, kept in
// Dir/superuser.password (mode 0600) and in the URLs (config.Redact hides it in
// logs): a private cluster on a shared machine is not open to every local user.
const Superuser = "postgres"

// Layout of Options.Dir.
const (
	dataSubdir = "data"      // PGDATA
	initSubdir = "data.init" // initdb target, renamed to data when complete
	sockSubdir = "sock"      // unix_socket_directories (when the path is short enough)
	logName    = "postgres.log"
	pwName     = "superuser.password" // the superuser's password, mode 0600
	confName   = "ledger.conf"        // included at the end of postgresql.conf, rewritten on each start
)

// maxWALMiB is a durable cluster's max_wal_size: WAL a million accounts'
// random writes fill between two timed checkpoints (docs/operations.md).
const maxWALMiB = 8192

// backendFlushKiB is a durable cluster's backend_flush_after (docs/operations.md).
const backendFlushKiB = 256

// maxSocketPath is the usable length of sun_path on Linux (108 bytes with the NUL).
const maxSocketPath = 107

// Options configure Start.
type Options struct {
	// Dir holds the cluster (Dir/data), its log and its socket directory. It is
	// created when missing; a cluster already in it is reused.
	Dir string
	// Port is the TCP port on 127.0.0.1; 0 picks a free one.
	Port int
	// Fsync makes the cluster durable (fsync, synchronous_commit, full_page_writes on).
	// Leave it off for tests.
	Fsync bool
	// Logger receives what the harness does; nil uses slog.Default().
	Logger *slog.Logger
	// Replication readies the cluster for a pair (pair.go): a synchronous
	// standby, and pg_rewind after a failover (wal_log_hints and
	// full_page_writes on, WAL kept for a standby that fell behind).
	Replication bool

	// standbyOf, when Dir holds no cluster yet, makes it a streaming standby of
	// that cluster (pg_basebackup -R) instead of a new one (initdb).
	standbyOf *Cluster
}

// Cluster is a running private PostgreSQL cluster.
type Cluster struct {
	dir     string
	dataDir string
	sockDir string
	logFile string
	binDir  string
	port    int
	log     *slog.Logger
	cred    *syscall.Credential // non-nil when the server runs as another OS user
	pw      string              // the superuser's password
}

// Start starts (initialising it first when needed) the cluster in opts.Dir and
// makes sure the database Database exists. A server still running in Dir (its
// parent was killed) is reused when it listens on the wanted port; a stale
// postmaster.pid (its process is gone or is not a postmaster of Dir) is removed.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c, err := newCluster(opts)
	if err != nil {
		return nil, err
	}
	log := c.log
	if err := c.prepareDirs(); err != nil {
		return nil, err
	}
	unlock, err := c.lockDir(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if opts.standbyOf != nil {
		err = c.basebackup(ctx, opts.standbyOf, opts.Fsync)
	} else if err = c.password(); err == nil {
		err = c.initdb(ctx, opts.Fsync)
	}
	if err != nil {
		return nil, err
	}

	running, err := c.checkRunning(ctx)
	if err != nil {
		return nil, err
	}
	if running != 0 && (opts.Port == 0 || opts.Port == running) {
		c.port = running
		log.Info("reusing running postgres", "port", c.port)
	} else {
		if running != 0 {
			log.Info("restarting running postgres on another port", "port", running, "want", opts.Port)
			if err := c.Stop(ctx); err != nil {
				return nil, err
			}
		}
		if err := c.start(ctx, opts); err != nil {
			return nil, err
		}
	}
	if err := c.secure(ctx); err != nil {
		return nil, err
	}
	if err := c.ensureDatabase(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// newCluster is the Cluster of opts.Dir, not started.
func newCluster(opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("pgcluster: Options.Dir is empty")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Cluster{
		dir:     dir,
		dataDir: filepath.Join(dir, dataSubdir),
		sockDir: filepath.Join(dir, sockSubdir),
		logFile: filepath.Join(dir, logName),
		log:     log.With("component", "pgcluster", "dir", dir),
	}
	if c.binDir, err = FindBinDir(); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		if c.cred, err = postgresCredential(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// password reads the superuser's password from Dir, or makes one (32 random
// bytes, hex) when there is none.
func (c *Cluster) password() error {
	p := filepath.Join(c.dir, pwName)
	b, err := os.ReadFile(p)
	if err == nil {
		if c.pw = strings.TrimSpace(string(b)); c.pw == "" {
			return fmt.Errorf("pgcluster: %s is empty", p)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pgcluster: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return c.savePassword(hex.EncodeToString(raw[:]))
}

// savePassword makes pw the superuser's password of Dir (a standby's is its
// primary's: the cluster is a copy).
func (c *Cluster) savePassword(pw string) error {
	c.pw = pw
	p := filepath.Join(c.dir, pwName)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(c.pw+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// hba is the cluster's pg_hba.conf: every connection authenticates with
// scram-sha-256.
const hba = `# Written by ledger's pgcluster: password authentication (scram-sha-256) only.
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
host  all all ::1/128 scram-sha-256
host  replication all 127.0.0.1/32 scram-sha-256
`

// secure makes a cluster made before passwords (trust authentication) ask for
// one: it sets the superuser's password and rewrites pg_hba.conf. A cluster
// whose pg_hba.conf is already ours is left as it is.
func (c *Cluster) secure(ctx context.Context) error {
	p := filepath.Join(c.dataDir, "pg_hba.conf")
	cur, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if string(cur) == hba {
		return nil
	}
	if err := c.waitReady(ctx, c.port, 30*time.Second); err != nil {
		return err
	}
	u := c.URLFor("postgres")
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	// The password travels as a SCRAM verifier computed here, not in clear text:
	// the server never logs it (a statement error would show only the verifier).
	verifier, err := scramVerifier(c.pw)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "ALTER ROLE "+pgx.Identifier{Superuser}.Sanitize()+" PASSWORD "+quoteLiteral(verifier)); err != nil {
		return fmt.Errorf("pgcluster: set the superuser's password: %w", err)
	}
	if err := c.writeOwned(p, hba); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgcluster: reload: %w", err)
	}
	c.log.Info("password authentication on (scram-sha-256)", "password_file", filepath.Join(c.dir, pwName))
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// writeOwned writes a file of the server's (mode 0600, owned by the server's
// OS user when that is another one).
func (c *Cluster) writeOwned(p, content string) error {
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Lchown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	return nil
}

// scramVerifier is the SCRAM-SHA-256 verifier of a password as PostgreSQL stores
// it (RFC 5802, 7677; 4096 iterations, a random 16-byte salt).
func scramVerifier(password string) (string, error) {
	const iterations = 4096
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("pgcluster: %w", err)
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("pgcluster: %w", err)
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	stored := sha256.Sum256(mac(salted, "Client Key"))
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(stored[:]), b64(mac(salted, "Server Key"))), nil
}

// URL is the connection URL of the Database database (TCP, the superuser with
// its password: log it only through config.Redact).
func (c *Cluster) URL() string { return c.URLFor(Database) }

// URLFor is the connection URL of another database of the cluster.
func (c *Cluster) URLFor(database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(Superuser, c.pw),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port is the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Dir is the cluster's directory (absolute).
func (c *Cluster) Dir() string { return c.dir }

// Stop shuts the server down (pg_ctl stop -m fast) and waits for it. Stopping a
// server that does not run is not an error.
func (c *Cluster) Stop(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", "fast", "-w", "-t", "60", "-s")
	if err != nil {
		if _, statErr := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); errors.Is(statErr, fs.ErrNotExist) {
			return nil // it stopped anyway (or was not running)
		}
		return fmt.Errorf("pgcluster: pg_ctl stop: %w: %s", err, out)
	}
	c.log.Info("postgres stopped", "port", c.port)
	return nil
}

// StopDir stops the server running on the cluster in dir, if any, without
// starting anything: the clean-up of a cluster whose owner died.
func StopDir(ctx context.Context, dir string, logger *slog.Logger) error {
	c, err := newCluster(Options{Dir: dir, Logger: logger})
	if err != nil {
		return err
	}
	return c.Stop(ctx)
}

// FindBinDir locates the PostgreSQL server binaries: $LEDGER_PG_BINDIR, then
// `pg_config --bindir`, then the newest /usr/lib/postgresql/*/bin, then $PATH.
func FindBinDir() (string, error) {
	has := func(d string) bool {
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(d, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("LEDGER_PG_BINDIR"); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("pgcluster: LEDGER_PG_BINDIR=%s has no initdb/pg_ctl/postgres", d)
	}
	if pc, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pc, "--bindir").Output(); err == nil {
			if d := strings.TrimSpace(string(out)); has(d) {
				return d, nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { // newest major version first
		vi, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dirs[i])), 64)
		vj, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dirs[j])), 64)
		return vi > vj
	})
	dirs = append(dirs, "/usr/local/pgsql/bin", "/usr/pgsql/bin")
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", errors.New("pgcluster: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; install them or set LEDGER_PG_BINDIR")
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root needs a postgres OS user to run the server as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgcluster: postgres user has uid %q gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepareDirs creates Dir and its socket directory and, when the server runs as
// another user, hands them over and makes Dir's ancestors traversable.
func (c *Cluster) prepareDirs() error {
	for _, d := range []string{c.dir, c.sockDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	if f, err := os.OpenFile(c.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	} else {
		f.Close()
	}
	if c.cred == nil {
		return nil
	}
	uid, gid := int(c.cred.Uid), int(c.cred.Gid)
	for _, p := range []string{c.dir, c.sockDir, c.logFile} {
		if err := os.Lchown(p, uid, gid); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	// The data directory must belong to the server's user entirely (a previous run
	// as another user, or a copy, may have left it otherwise).
	if fi, err := os.Stat(c.dataDir); err == nil && !ownedBy(fi, uid) {
		if err := chownTree(c.dataDir, uid, gid); err != nil {
			return err
		}
	}
	return c.ensureTraversable(uid, gid)
}

func ownedBy(fi fs.FileInfo, uid int) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == uid
}

func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// ensureTraversable adds the search (x) bit for others to each ancestor of Dir the
// server's user could not otherwise pass through (typical: a 0700 temp dir of root).
func (c *Cluster) ensureTraversable(uid, gid int) error {
	for p := filepath.Dir(c.dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode().Perm()
		can := ok && (int(st.Uid) == uid && mode&0o100 != 0 ||
			int(st.Gid) == gid && mode&0o010 != 0 ||
			mode&0o001 != 0)
		if !can {
			c.log.Warn("making directory traversable for the postgres user", "path", p)
			if err := os.Chmod(p, fi.Mode()|0o001); err != nil {
				return fmt.Errorf("pgcluster: %s is not traversable by the postgres user: %w", p, err)
			}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// lockDir serialises Starts on one Dir (two `ledger dev` at once): an flock on
// Dir/start.lock, held until Start returns, waited for as long as ctx allows.
func (c *Cluster) lockDir(ctx context.Context) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(c.dir, "start.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("pgcluster: lock %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("pgcluster: waiting for another Start on %s: %w", c.dir, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// makeInitDir makes the empty side directory a new cluster is made in (by
// initdb or pg_basebackup), owned by the server's user, and refuses a data
// directory that holds something but no cluster.
func (c *Cluster) makeInitDir() (string, error) {
	if entries, err := os.ReadDir(c.dataDir); err == nil && len(entries) > 0 {
		return "", fmt.Errorf("pgcluster: %s is not empty and holds no cluster", c.dataDir)
	}
	initDir := filepath.Join(c.dir, initSubdir)
	if err := os.RemoveAll(initDir); err != nil {
		return "", fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.Mkdir(initDir, 0o700); err != nil {
		return "", fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Lchown(initDir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return "", fmt.Errorf("pgcluster: %w", err)
		}
	}
	return initDir, nil
}

// initdb creates the cluster unless Dir already holds one. It initialises into a
// side directory and renames it, so a crash during initdb never leaves a half
// cluster that a later Start would take for a complete one.
func (c *Cluster) initdb(ctx context.Context, fsync bool) error {
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err == nil {
		return nil
	}
	initDir, err := c.makeInitDir()
	if err != nil {
		return err
	}
	// initdb reads the password from a file of the server's user, removed after.
	pwFile := filepath.Join(c.dir, "initdb.pwfile")
	if err := os.WriteFile(pwFile, []byte(c.pw+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Lchown(pwFile, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	args := []string{"-D", initDir, "-U", Superuser, "--auth=scram-sha-256", "--pwfile=" + pwFile, "--encoding=UTF8", "--locale=C"}
	if !fsync {
		args = append(args, "--no-sync")
	}
	start := time.Now()
	out, err := c.run(ctx, "initdb", args...)
	if rerr := os.Remove(pwFile); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("pgcluster: initdb: %w: %s", err, out)
	}
	if err := c.writeOwned(filepath.Join(initDir, "pg_hba.conf"), hba); err != nil {
		return err
	}
	conf := filepath.Join(initDir, "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_, err = fmt.Fprintf(f, "\n# Written by ledger's pgcluster: settings rewritten on each start.\ninclude_if_exists = '%s'\n", confName)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_ = os.Remove(c.dataDir) // an empty leftover, if any
	if err := os.Rename(initDir, c.dataDir); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	c.log.Info("initialised cluster", "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// checkRunning returns the port of a postmaster already running on the data
// directory, or 0. A postmaster.pid whose process is gone, or is another program
// (the PID was reused after a reboot or container restart), is removed.
func (c *Cluster) checkRunning(ctx context.Context) (int, error) {
	pidFile := filepath.Join(c.dataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(lines[0]))
	port := 0
	if len(lines) > 3 {
		port, _ = strconv.Atoi(strings.TrimSpace(lines[3]))
	}
	if pid > 0 && port > 0 && c.isOurPostmaster(pid, port) {
		// Wait until it accepts connections (it may be starting or recovering).
		if err := c.waitReady(ctx, port, 30*time.Second); err == nil {
			return port, nil
		}
		c.log.Warn("postmaster of this cluster runs but does not answer; stopping it", "pid", pid)
		c.port = port
		if err := c.Stop(ctx); err != nil {
			return 0, err
		}
		return 0, nil
	}
	c.log.Warn("removing stale postmaster.pid", "pid", pid)
	if err := os.Remove(pidFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	return 0, nil
}

// isOurPostmaster reports whether pid is alive and is a postmaster serving the
// data directory: its working directory is the data directory (Linux /proc), or,
// when that cannot be read, something answers on its port.
func (c *Cluster) isOurPostmaster(pid, port int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil {
		want, _ := filepath.EvalSymlinks(c.dataDir)
		return cwd == c.dataDir || cwd == want
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func (c *Cluster) writeConf(port int, opts Options) error {
	fsync := opts.Fsync
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	sock := c.sockDir
	if len(sock)+len("/.s.PGSQL.65535.lock") > maxSocketPath {
		c.log.Info("socket directory path too long for a unix socket; TCP only", "path", sock)
		sock = ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by ledger's pgcluster on each start; edits are lost.\n")
	fmt.Fprintf(&b, "listen_addresses = '127.0.0.1'\n")
	fmt.Fprintf(&b, "port = %d\n", port)
	fmt.Fprintf(&b, "unix_socket_directories = %s\n", confQuote(sock))
	fmt.Fprintf(&b, "max_connections = 200\n")
	fmt.Fprintf(&b, "fsync = %s\n", onOff(fsync))
	if opts.Replication {
		// A pair: the commit waits for the standby (synchronous_standby_names,
		// set by the pair with ALTER SYSTEM), and pg_rewind can rewind a
		// failed primary, which needs wal_log_hints and full-page writes.
		fmt.Fprintf(&b, "synchronous_commit = on\n")
		fmt.Fprintf(&b, "full_page_writes = on\n")
		fmt.Fprintf(&b, "wal_log_hints = on\n")
		fmt.Fprintf(&b, "wal_level = replica\n")
		fmt.Fprintf(&b, "max_wal_senders = 10\n")
		fmt.Fprintf(&b, "wal_keep_size = '%dMB'\n", walKeepMiB)
		fmt.Fprintf(&b, "hot_standby = on\n")
	} else {
		fmt.Fprintf(&b, "synchronous_commit = %s\n", onOff(fsync))
		fmt.Fprintf(&b, "full_page_writes = %s\n", onOff(fsync))
	}
	if fsync {
		// A durable cluster checkpoints as a production ledger's should
		// (docs/operations.md, "PostgreSQL settings that matter").
		fmt.Fprintf(&b, "max_wal_size = '%dMB'\n", maxWALMiB)
		fmt.Fprintf(&b, "checkpoint_completion_target = 0.9\n")
		// Pages the backends write themselves go to the disk as they go,
		// not left dirty in the kernel's cache until its flusher writes
		// hundreds of MiB at once and the WAL's fsync waits behind them.
		fmt.Fprintf(&b, "backend_flush_after = '%dkB'\n", backendFlushKiB)
	}
	fmt.Fprintf(&b, "logging_collector = off\n")
	fmt.Fprintf(&b, "log_min_messages = warning\n")
	fmt.Fprintf(&b, "timezone = 'UTC'\n")
	p := filepath.Join(c.dataDir, confName)
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Lchown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	return nil
}

func confQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (c *Cluster) start(ctx context.Context, opts Options) error {
	const attempts = 3
	for attempt := 1; ; attempt++ {
		port := opts.Port
		if port == 0 {
			var err error
			if port, err = freeport.Loopback(); err != nil {
				return fmt.Errorf("pgcluster: %w", err)
			}
		}
		if err := c.writeConf(port, opts); err != nil {
			return err
		}
		logOffset := fileSize(c.logFile)
		started := time.Now()
		out, err := c.run(ctx, "pg_ctl", "start", "-D", c.dataDir, "-l", c.logFile, "-w", "-t", "60", "-s")
		if err == nil {
			c.port = port
			c.log.Info("postgres started", "port", port, "fsync", opts.Fsync, "took", time.Since(started).Round(time.Millisecond))
			return nil
		}
		tail := readFrom(c.logFile, logOffset)
		portTaken := strings.Contains(tail, "could not bind") || strings.Contains(tail, "already in use")
		if opts.Port == 0 && portTaken && attempt < attempts && ctx.Err() == nil {
			c.log.Info("port taken meanwhile; retrying on another", "port", port)
			continue
		}
		return fmt.Errorf("pgcluster: pg_ctl start: %w: %s\nserver log:\n%s", err, strings.TrimSpace(out), tail)
	}
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns what was appended to the log since offset (at most its last 4 KiB).
func readFrom(p string, offset int64) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	if size := fileSize(p); size-offset > 4096 {
		offset = size - 4096
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(bufio.NewReader(f))
	return string(b)
}

func (c *Cluster) waitReady(ctx context.Context, port int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	saved := c.port
	c.port = port
	u := c.URLFor("postgres")
	c.port = saved
	var last error
	for {
		conn, err := pgx.Connect(ctx, u)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: server on port %d not ready: %w", port, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) ensureDatabase(ctx context.Context) error {
	if err := c.waitReady(ctx, c.port, 30*time.Second); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URLFor("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", Database).Scan(&exists); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if exists {
		return nil
	}
	if err := createDatabase(ctx, conn, Database); err != nil {
		var exists bool // created concurrently?
		if qerr := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", Database).Scan(&exists); qerr == nil && exists {
			return nil
		}
		return err
	}
	c.log.Info("created database", "database", Database)
	return nil
}

// run runs one of the server binaries, as the postgres user when root, with a
// clean PG* environment, and returns its combined output.
func (c *Cluster) run(ctx context.Context, name string, args ...string) (string, error) {
	return c.runEnv(ctx, nil, name, args...)
}

// runEnv is run with more environment variables (PGPASSWORD for the client
// programs, so that no password shows in the process list).
func (c *Cluster) runEnv(ctx context.Context, extra []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.dir
	env := append([]string{"LC_ALL=C", "LANG=C", "HOME=" + c.dir}, extra...)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PG") || k == "LC_ALL" || k == "LANG" || k == "HOME" {
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = env
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// The postmaster pg_ctl starts redirects its output to the log file, but never
	// wait forever for a pipe some grandchild may hold.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}
