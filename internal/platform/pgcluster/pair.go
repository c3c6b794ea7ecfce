package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// walKeepMiB is the WAL a pair's primary keeps for a standby that fell behind
// (wal_keep_size), and for a rewound one to replay from the point it diverged.
const walKeepMiB = 256

// zombieGrace bounds the wait for a killed process to be reaped.
const zombieGrace = 5 * time.Second

// syncTimeout bounds the wait for a standby to become synchronous.
const syncTimeout = 2 * time.Minute

// PairOptions configure StartPair.
type PairOptions struct {
	// Dirs hold the two nodes, each as Options.Dir does. The first node is the
	// primary of a new pair.
	Dirs [2]string
	// Ports are the nodes' TCP ports on 127.0.0.1; 0 picks a free one. A node
	// keeps its port through failovers, so URL stays the same.
	Ports [2]int
	// Fsync as in Options. The commit waits for the standby either way.
	Fsync bool
	// Logger receives what the harness does; nil uses slog.Default().
	Logger *slog.Logger
}

// Pair is a PostgreSQL primary and its synchronous standby, the production
// shape of docs/operations.md: a commit returns once the standby has its WAL
// (synchronous_commit = on, synchronous_standby_names = '*'). It fails over as
// a platform (Patroni, CloudNativePG) does: Crash the primary, Promote the
// standby, Rejoin the old primary as the new one's standby (pg_rewind). Every
// client reaches it by URL, one multi-host URL with
// target_session_attrs=read-write that finds the primary wherever it is.
type Pair struct {
	mu      sync.Mutex
	nodes   [2]*Cluster
	opts    [2]Options
	primary int // index in nodes
	log     *slog.Logger
}

// StartPair starts the pair in opts.Dirs, making the nodes when missing: the
// first by initdb, the second by pg_basebackup -R from it. A pair made before
// is started in the roles it had (the node with standby.signal is the
// standby); when both nodes are primaries (one was promoted and the other not
// rejoined yet), the one on the later timeline stays primary and the other is
// rewound.
func StartPair(ctx context.Context, po PairOptions) (*Pair, error) {
	log := po.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Pair{log: log.With("component", "pgcluster.pair")}
	for i := range p.opts {
		if po.Dirs[i] == "" {
			return nil, fmt.Errorf("pgcluster: PairOptions.Dirs[%d] is empty", i)
		}
		p.opts[i] = Options{Dir: po.Dirs[i], Port: po.Ports[i], Fsync: po.Fsync, Replication: true,
			Logger: log.With("node", i)}
	}
	primary, err := p.roles(ctx)
	if err != nil {
		return nil, err
	}
	p.primary = primary
	if err := p.startNode(ctx, primary, nil); err != nil {
		return nil, err
	}
	standby := 1 - primary
	switch {
	case !hasCluster(p.opts[standby].Dir):
		err = p.startNode(ctx, standby, p.nodes[primary])
	case !isStandby(p.opts[standby].Dir):
		err = p.rewind(ctx, standby)
	default:
		err = p.startNode(ctx, standby, nil)
	}
	if err == nil {
		err = p.requireSync(ctx)
	}
	if err != nil {
		p.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	return p, nil
}

func hasCluster(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, dataSubdir, "PG_VERSION"))
	return err == nil
}

func isStandby(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, dataSubdir, "standby.signal"))
	return err == nil
}

// roles picks the primary of the nodes on disk.
func (p *Pair) roles(ctx context.Context) (int, error) {
	var exists, standby [2]bool
	for i, o := range p.opts {
		exists[i], standby[i] = hasCluster(o.Dir), isStandby(o.Dir)
	}
	switch {
	case !exists[0] && exists[1]:
		return 0, fmt.Errorf("pgcluster: %s holds no cluster but %s does: make the pair from the first", p.opts[0].Dir, p.opts[1].Dir)
	case !exists[1] || !standby[0] && standby[1]:
		return 0, nil
	case standby[0] && !standby[1]:
		return 1, nil
	case standby[0] && standby[1]:
		return 0, fmt.Errorf("pgcluster: both %s and %s are standbys: promote one (pg_ctl promote)", p.opts[0].Dir, p.opts[1].Dir)
	}
	var tli [2]int
	for i := range tli {
		c, err := newCluster(p.opts[i])
		if err != nil {
			return 0, err
		}
		if tli[i], err = c.timeline(ctx); err != nil {
			return 0, err
		}
	}
	p.log.Warn("both nodes are primaries; the one on the later timeline stays primary", "timelines", tli)
	if tli[1] > tli[0] {
		return 1, nil
	}
	return 0, nil
}

// timeline is the timeline of the cluster's latest checkpoint (pg_controldata).
func (c *Cluster) timeline(ctx context.Context) (int, error) {
	out, err := c.run(ctx, "pg_controldata", "-D", c.dataDir)
	if err != nil {
		return 0, fmt.Errorf("pgcluster: pg_controldata: %w: %s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Latest checkpoint's TimeLineID" {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("pgcluster: pg_controldata of %s shows no timeline", c.dataDir)
}

// startNode starts node i (a standby of from when it has no cluster yet) and
// remembers its port, so that the pair's URL does not change.
func (p *Pair) startNode(ctx context.Context, i int, from *Cluster) error {
	o := p.opts[i]
	o.standbyOf = from
	c, err := Start(ctx, o)
	if err != nil {
		return err
	}
	p.nodes[i], p.opts[i].Port = c, c.Port()
	return nil
}

// basebackup makes Dir a streaming standby of from (pg_basebackup -R: a copy
// with standby.signal and primary_conninfo), into a side directory renamed
// when complete, as initdb does. Nothing is done when Dir holds a cluster.
func (c *Cluster) basebackup(ctx context.Context, from *Cluster, fsync bool) error {
	if err := c.savePassword(from.pw); err != nil {
		return err
	}
	if hasCluster(c.dir) {
		return nil
	}
	initDir, err := c.makeInitDir()
	if err != nil {
		return err
	}
	args := []string{"-D", initDir, "--write-recovery-conf", "--wal-method=stream", "--checkpoint=fast",
		"-h", "127.0.0.1", "-p", strconv.Itoa(from.port), "-U", Superuser, "--no-password"}
	if !fsync {
		args = append(args, "--no-sync")
	}
	start := time.Now()
	if out, err := c.runEnv(ctx, []string{"PGPASSWORD=" + c.pw}, "pg_basebackup", args...); err != nil {
		return fmt.Errorf("pgcluster: pg_basebackup: %w: %s", err, out)
	}
	_ = os.Remove(c.dataDir)
	if err := os.Rename(initDir, c.dataDir); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	c.log.Info("made a standby", "of_port", from.port, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// URL is the multi-host URL of the Database database: both nodes, and
// target_session_attrs=read-write, so a client connects to whichever is the
// primary (log it only through config.Redact).
func (p *Pair) URL() string { return p.URLFor(Database) }

// URLFor is the multi-host URL of another database of the pair.
func (p *Pair) URLFor(database string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	hosts := make([]string, len(p.opts))
	for i, o := range p.opts {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(o.Port))
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(Superuser, p.nodes[p.primary].pw),
		Host:     strings.Join(hosts, ","),
		Path:     "/" + database,
		RawQuery: "sslmode=disable&target_session_attrs=read-write",
	}
	return u.String()
}

// Primary is the node that takes writes (after a Promote, the promoted one).
func (p *Pair) Primary() *Cluster {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[p.primary]
}

// Standby is the other node: the synchronous standby, or the failed primary
// between Promote and Rejoin.
func (p *Pair) Standby() *Cluster {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[1-p.primary]
}

// Crash kills the primary's processes at once (SIGKILL), as a machine that
// dies: what it committed is what its standby had confirmed.
func (p *Pair) Crash(ctx context.Context) error {
	return p.Primary().Kill(ctx)
}

// Promote makes the standby the primary (pg_ctl promote) once the primary is
// gone, then does what a platform does in its non-strict mode: the promoted
// node, which has no standby yet, stops waiting for one
// (synchronous_standby_names empty), and takes a checkpoint so that pg_rewind
// sees its new timeline. It refuses while the primary still answers: two
// primaries would each take writes.
func (p *Pair) Promote(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	old, s := p.nodes[p.primary], p.nodes[1-p.primary]
	if old.answers() {
		return fmt.Errorf("pgcluster: the primary on port %d still answers: Crash or Stop it before promoting", old.port)
	}
	started := time.Now()
	if out, err := s.run(ctx, "pg_ctl", "promote", "-D", s.dataDir, "-w", "-t", "60", "-s"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl promote: %w: %s", err, out)
	}
	if err := s.exec(ctx, syncStatements("")...); err != nil {
		return err
	}
	p.primary = 1 - p.primary
	p.log.Info("promoted the standby", "port", s.port, "took", time.Since(started).Round(time.Millisecond))
	return nil
}

// Rejoin makes the node that is not the primary its synchronous standby again:
// stopped if it runs, rewound to where it left the primary's history
// (pg_rewind, which throws away what it committed that the primary never
// had), restarted as a standby, and the primary set to wait for it.
func (p *Pair) Rejoin(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.rewind(ctx, 1-p.primary); err != nil {
		return err
	}
	return p.requireSync(ctx)
}

func (p *Pair) rewind(ctx context.Context, i int) error {
	c := p.nodes[i]
	if c == nil {
		var err error
		if c, err = newCluster(p.opts[i]); err != nil {
			return err
		}
	}
	if err := c.halt(ctx); err != nil {
		return err
	}
	src := p.nodes[p.primary]
	if err := c.savePassword(src.pw); err != nil {
		return err
	}
	source := fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=postgres sslmode=disable", src.port, Superuser)
	started := time.Now()
	out, err := c.runEnv(ctx, []string{"PGPASSWORD=" + src.pw}, "pg_rewind",
		"--target-pgdata="+c.dataDir, "--source-server="+source, "--write-recovery-conf", "--no-sync")
	if err != nil {
		return fmt.Errorf("pgcluster: pg_rewind: %w: %s", err, out)
	}
	c.log.Info("rewound", "source_port", src.port, "took", time.Since(started).Round(time.Millisecond),
		"pg_rewind", lastLine(out))
	return p.startNode(ctx, i, nil)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}

// requireSync makes the primary wait for its standby on every commit
// (synchronous_standby_names = '*') and waits until the standby streams as
// synchronous.
func (p *Pair) requireSync(ctx context.Context) error {
	return p.setSync(ctx, true)
}

// SetSynchronous makes the primary wait for its standby on every commit (on:
// the pair's shape) or not (off: it commits as a lone primary does, the
// standby still streaming and replaying, asynchronously), takes a checkpoint,
// and returns once the standby streams as synchronous (on) or asynchronous
// (off). A benchmark measures the standby's round trip with it on one cluster
// and its data.
func (p *Pair) SetSynchronous(ctx context.Context, on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setSync(ctx, on)
}

func (p *Pair) setSync(ctx context.Context, on bool) error {
	pr := p.nodes[p.primary]
	names, state := "", "async"
	if on {
		names, state = "*", "sync"
	}
	if err := pr.exec(ctx, syncStatements(names)...); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	for {
		n, err := pr.standbysIn(ctx, state)
		if err == nil && n > 0 {
			p.log.Info("standby streams", "sync_state", state, "primary_port", pr.port, "standby_port", p.nodes[1-p.primary].port)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: the standby did not stream as %s with the primary on port %d: %w (last: %v)", state, pr.port, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// syncStatements set synchronous_standby_names on a primary, reload its
// configuration and take a checkpoint.
func syncStatements(names string) []string {
	return []string{"ALTER SYSTEM SET synchronous_standby_names = '" + names + "'", "SELECT pg_reload_conf()", "CHECKPOINT"}
}

// standbysIn is the number of standbys streaming to c in sync_state state
// (sync, async).
func (c *Cluster) standbysIn(ctx context.Context, state string) (int, error) {
	conn, err := pgx.Connect(ctx, c.URLFor("postgres"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = $1 AND state = 'streaming'", state).Scan(&n)
	return n, err
}

// exec runs statements, one after another, on c's postgres database.
func (c *Cluster) exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, c.URLFor("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgcluster: %s: %w", s, err)
		}
	}
	return nil
}

// answers reports whether the server accepts a connection within a second.
func (c *Cluster) answers() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URLFor("postgres"))
	if err != nil {
		return false
	}
	conn.Close(context.Background())
	return true
}

// Stop stops both nodes (a frozen one is thawed first; a crashed one leaves
// nothing to stop).
func (p *Pair) Stop(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, i := range []int{p.primary, 1 - p.primary} {
		if c := p.nodes[i]; c != nil {
			errs = append(errs, c.halt(ctx))
		}
	}
	return errors.Join(errs...)
}

// halt stops the server if it runs (thawing it first: it may be frozen) and
// removes the postmaster.pid a killed one left.
func (c *Cluster) halt(ctx context.Context) error {
	if _, err := c.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	if pid := c.postmasterPID(); pid > 0 && alive(pid) {
		return c.Stop(ctx)
	}
	if err := os.Remove(filepath.Join(c.dataDir, "postmaster.pid")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// Kill kills the server's processes (SIGKILL; all of them stopped first, so
// none goes on after another died) and waits until they are gone.
func (c *Cluster) Kill(ctx context.Context) error {
	pids, err := c.Signal(syscall.SIGSTOP)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// Wait until they are reaped, not only dead: a new postmaster takes a
	// zombie's PID in its socket's lock file for a live postmaster. A zombie
	// init has not reaped within zombieGrace counts as gone.
	deadline := time.Now().Add(zombieGrace)
	for _, pid := range pids {
		for st, ok := procStat(pid); ok && (st.state != "Z" || time.Now().Before(deadline)); st, ok = procStat(pid) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("pgcluster: process %d survived SIGKILL: %w", pid, ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	c.log.Info("postgres killed", "port", c.port, "processes", len(pids))
	return nil
}

// Signal sends sig to the server's processes, the postmaster and its
// children (SIGSTOP freezes the server, SIGCONT thaws it), and returns them.
// A server that does not run has none.
func (c *Cluster) Signal(sig syscall.Signal) ([]int, error) {
	pm := c.postmasterPID()
	if pm <= 0 || !alive(pm) {
		return nil, nil
	}
	pids := append([]int{pm}, children(pm)...)
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return nil, fmt.Errorf("pgcluster: signal %v to %d: %w", sig, pid, err)
		}
	}
	return pids, nil
}

func (c *Cluster) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	st, ok := procStat(pid)
	return ok && st.state != "Z"
}

type stat struct {
	state string
	ppid  int
}

// procStat reads /proc/<pid>/stat: "pid (comm) state ppid ...", comm being
// anything up to the last ')'.
func procStat(pid int) (stat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return stat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return stat{state: f[0], ppid: ppid}, true
}

// children are the processes whose parent is pid.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStat(n); ok && st.ppid == pid {
			out = append(out, n)
		}
	}
	return out
}
