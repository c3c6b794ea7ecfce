package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// failoverClients post deposits, each client to its own account, until
// stopped, keeping every reply that was definite.
type failoverClients struct {
	mu       sync.Mutex
	sent     []crashCmd
	definite map[string]reply.Reply
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startFailoverClients(nc *nats.Conn, n int) *failoverClients {
	c := &failoverClients{definite: map[string]reply.Reply{}, stop: make(chan struct{})}
	for g := range n {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-c.stop:
					return
				default:
				}
				amount := int64(1 + (g*31+i*7)%1000)
				cmd := mkCrashCmd("deposit", fmt.Sprintf("fo-%d-%d", g, i), fmt.Sprintf("fo-%d", g), amount, map[string]any{"amount": amount, "currency": "EUR"})
				c.mu.Lock()
				c.sent = append(c.sent, cmd)
				c.mu.Unlock()
				if r, ok := sendOnce(nc, cmd, 4*time.Second); ok {
					c.mu.Lock()
					c.definite[cmd.key] = r
					c.mu.Unlock()
				}
			}
		}()
	}
	return c
}

func (c *failoverClients) halt() { close(c.stop); c.wg.Wait() }

// resendUndecided sends every command without a definite reply again, with
// its key, until it gets one (bounded), and returns how many there were.
func (c *failoverClients) resendUndecided(t *testing.T, nc *nats.Conn) int {
	t.Helper()
	retried := 0
	for _, cmd := range c.sent {
		if _, ok := c.definite[cmd.key]; ok {
			continue
		}
		retried++
		r, ok := sendOnce(nc, cmd, 2*time.Minute)
		if !ok {
			t.Fatalf("%s: no definite reply", cmd.key)
		}
		c.definite[cmd.key] = r
	}
	return retried
}

// appliedOnce checks that every command sent has exactly one set of events in
// the account streams.
func (c *failoverClients) appliedOnce(t *testing.T, store *postgres.Store) {
	t.Helper()
	perKey := map[string]int{}
	for _, ev := range devtest.ReadAll(t, store) {
		if strings.HasPrefix(ev.Stream, domain.AccountStreamPrefix) {
			m, err := domain.DecodeMetadata(ev.Metadata)
			if err != nil {
				t.Fatal(err)
			}
			perKey[m.Key]++
		}
	}
	for _, cmd := range c.sent {
		if n := perKey[cmd.key]; n != 1 {
			t.Errorf("%s applied %d times", cmd.key, n)
		}
	}
}

// probe sends new deposits until one is applied and returns how long that took.
func probe(t *testing.T, nc *nats.Conn, name string) time.Duration {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		cmd := mkCrashCmd("deposit", fmt.Sprintf("%s-%d", name, i), "fo-probe", 1, map[string]any{"amount": 1, "currency": "EUR"})
		if r, ok := sendOnce(nc, cmd, 2*time.Second); ok && r.Status == domain.StatusApplied {
			return time.Since(start)
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("%s: no command applied within 2m of the promotion", name)
		}
	}
}

// caughtUp waits until every read model and the events publisher are at the
// store's head and returns how long that took.
func caughtUp(t *testing.T, url string, store eventstoreHead) time.Duration {
	t.Helper()
	start := time.Now()
	pool, err := projections.NewPool(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	devtest.Eventually(t, 2*time.Minute, "read models and LEDGER_EVENTS at the store's head", func() bool {
		ctx := context.Background()
		head, err := store.Head(ctx)
		if err != nil {
			return false
		}
		live, err := projections.Checkpoints.Live(ctx, pool)
		if err != nil {
			return false
		}
		for _, l := range live {
			if l.Position.Compare(head) < 0 {
				return false
			}
		}
		pub, err := projections.Checkpoints.Published(ctx, pool)
		return err == nil && pub.Compare(head) >= 0
	})
	return time.Since(start)
}

type eventstoreHead interface {
	Head(ctx context.Context) (eventstore.Position, error)
}

// TestFailoverOnAPair runs `ledger dev` (the command service, the projector,
// the publisher) on a PostgreSQL primary with a synchronous standby through
// one multi-host URL, with eight clients depositing, and fails the pair over
// three times: the primary SIGKILLed and the standby promoted, then the old
// primary rewound into the new one's standby; in the second round the standby
// is frozen (SIGSTOP) for 4 s first, so that commits wait on it and the
// commands time out (indefinite: committed on the primary alone). Every key
// without a definite reply is then sent again with the same key: each is
// applied exactly once on the promoted database, the read models and
// LEDGER_EVENTS agree with it (`ledger audit --events-out`, through the same
// URL). The time until a command is applied after each promotion, and until
// the read models and LEDGER_EVENTS caught up after the last, are logged
// (RELIABILITY.md), never asserted.
func TestFailoverOnAPair(t *testing.T) {
	ctx := context.Background()
	pair, dev, natsURL := devOnAPair(t, "failover", "--command-timeout", "3s", "--jetstream-grace", "500ms")
	url := pair.URL()
	nc := devtest.ConnectURL(t, natsURL, nats.ReconnectWait(50*time.Millisecond))
	const clients = 8
	for g := range clients + 1 {
		id := fmt.Sprintf("fo-%d", g)
		if g == clients {
			id = "fo-probe"
		}
		if r, ok := sendOnce(nc, mkCrashCmd("open_account", "open-"+id, id, 0, map[string]any{"currency": "EUR"}), 20*time.Second); !ok || r.Status != domain.StatusApplied {
			t.Fatalf("open %s: %+v", id, r)
		}
	}

	cl := startFailoverClients(nc, clients)
	var again, fromCrash []time.Duration
	for round := range 3 {
		time.Sleep(time.Second) // load before the fault
		if round == 1 {
			if _, err := pair.Standby().Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			time.Sleep(4 * time.Second)
		}
		if err := pair.Crash(ctx); err != nil {
			t.Fatal(err)
		}
		crashed := time.Now()
		if _, err := pair.Standby().Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := pair.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		again = append(again, probe(t, nc, fmt.Sprintf("probe-%d", round)))
		fromCrash = append(fromCrash, time.Since(crashed))
		if err := pair.Rejoin(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	cl.halt()

	store := devtest.Store(t, url)
	caught := caughtUp(t, url, store)
	retried := cl.resendUndecided(t, nc)
	slices.Sort(again)
	slices.Sort(fromCrash)
	t.Logf("failover: %d commands sent, %d without a definite reply retried; a command applied %v after each promotion (p50 %v, worst %v), %v after each crash (promotion included; p50 %v, worst %v); read models and LEDGER_EVENTS at the head %v after the clients stopped",
		len(cl.sent), retried, again, again[len(again)/2], again[len(again)-1], fromCrash, fromCrash[len(fromCrash)/2], fromCrash[len(fromCrash)-1], caught)

	balance := map[string]int64{}
	for _, c := range cl.sent {
		if r := cl.definite[c.key]; r.Status != domain.StatusApplied {
			t.Errorf("%s: %+v", c.key, r)
		}
		balance[c.account] += c.amount
	}
	projtest.AuditOK(t, store, nil)
	cl.appliedOnce(t, store)
	for id, want := range balance {
		if acc := devtest.Account(t, store, id); acc.Balance != want {
			t.Errorf("%s: balance %d, sent %d", id, acc.Balance, want)
		}
	}
	caughtUp(t, url, store)
	out, err := exec.Command(ledgerBinary(t), "audit", "--database-url", url, "--nats-url", natsURL, "--events-out", "--log-level", "warn").CombinedOutput()
	if err != nil {
		t.Fatalf("ledger audit --events-out on the pair: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	dev.stop()
}

// TestDevStandby: `ledger dev --standby` runs its private PostgreSQL as a
// primary and a synchronous standby, reached by one multi-host URL, and the
// standby holds what the ledger acknowledged.
func TestDevStandby(t *testing.T) {
	ledgerBinary(t)
	dir := t.TempDir()
	stopClusterOnCleanup(t, dir)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = pgcluster.StopDir(ctx, filepath.Join(dir, "postgres-standby"), nil)
	})
	natsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	dev := startDev(t, dir, []string{"--standby", "--nats-addr", natsAddr}, nil)
	url := dev.info.DatabaseURL
	if !strings.Contains(url, "target_session_attrs=read-write") || strings.Count(url, ",") != 1 {
		t.Fatalf("database URL %s: want two hosts and target_session_attrs=read-write", url)
	}
	nc := devtest.ConnectURL(t, "nats://"+natsAddr)
	if r, ok := sendOnce(nc, mkCrashCmd("open_account", "open-sb", "sb", 0, map[string]any{"currency": "EUR"}), 20*time.Second); !ok || r.Status != domain.StatusApplied {
		t.Fatalf("open: %+v", r)
	}
	pool, err := projections.NewPool(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var sync int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").Scan(&sync); err != nil || sync != 1 {
		t.Fatalf("synchronous standbys: %d (%v)", sync, err)
	}
	dev.stop()
	if out, err := exec.Command(ledgerBinary(t), "dev", "--standby", "--database-url", url).CombinedOutput(); err == nil || !strings.Contains(string(out), "--standby") {
		t.Fatalf("--standby with --database-url: %v\n%s", err, out)
	}
}

// TestProgramsOnTheProductionShape runs each program on the production shape:
// `ledger serve` and `projector run` on a PostgreSQL pair through one
// multi-host URL and on a 3-node JetStream cluster through a multi-server NATS
// URL with every stream at 3 replicas; `ledger post`, `ledger statement` and
// `ledger audit --events-out` on the same URLs. Commands are applied with one
// NATS node down, and after the pair failed over without any program being
// restarted; the statement shows them, the audit (read models, events out) is
// clean on the promoted database.
func TestProgramsOnTheProductionShape(t *testing.T) {
	if testing.Short() {
		t.Skip("production shape")
	}
	ledgerBin, projBin := ledgerBinary(t), projectorBinary(t)
	ctx := context.Background()
	pair := devtest.Pair(t, "shape")
	cluster, servers := devtest.NATSCluster(t)
	env := []string{config.EnvDatabaseURL + "=" + pair.URL(), config.EnvEventStoreURL + "=" + pair.URL(),
		config.EnvNATSURL + "=" + cluster.URL(), config.EnvJetStreamReplicas + "=3", config.EnvDataDir + "=" + t.TempDir()}
	startProc(t, ledgerBin, []string{"serve", "--log-format", "json", "--http-addr", anyPort}, env, "intake started")
	startProc(t, projBin, []string{"run", "--log-format", "json", "--http-addr", anyPort}, env, "projector running")

	post := func(args ...string) {
		t.Helper()
		if r, out, code := postCLI(t, env, args...); code != 0 || r["status"] != "applied" {
			t.Fatalf("ledger post %v: exit %d\n%s", args, code, out)
		}
	}
	post("open_account", "--key", "ps-open", "--account", "ps", "--currency", "EUR")
	post("deposit", "--key", "ps-1", "--account", "ps", "--amount", "100", "--currency", "EUR")

	nc := devtest.ConnectURL(t, cluster.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"LEDGER_COMMANDS", "LEDGER_DLQ", projections.EventsStream} {
		devtest.Eventually(t, 30*time.Second, name+" at 3 replicas", func() bool {
			s, err := js.Stream(ctx, name)
			return err == nil && s.CachedInfo().Config.Replicas == 3
		})
	}

	servers[2].Shutdown() // one node of three down
	servers[2].WaitForShutdown()
	post("deposit", "--key", "ps-2", "--account", "ps", "--amount", "20", "--currency", "EUR")

	if err := pair.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pair.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	post("deposit", "--key", "ps-3", "--account", "ps", "--amount", "3", "--currency", "EUR")

	devtest.Eventually(t, time.Minute, "the statement shows every deposit", func() bool {
		out, code := runToExit(t, ledgerBin, []string{"statement", "--csv", "ps"}, env)
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Split(line, ","); len(f) > 5 && f[3] == "closing_balance" {
				return code == 0 && f[5] == "123"
			}
		}
		return false
	})
	devtest.Eventually(t, time.Minute, "ledger audit --events-out is clean on the promoted database", func() bool {
		out, code := runToExit(t, ledgerBin, []string{"audit", "--events-out"}, env)
		if code != 0 {
			t.Log(out)
		}
		return code == 0
	})
}

// streamLeader is the name of the server leading a stream's replicas.
func streamLeader(t *testing.T, js jetstream.JetStream, name string) string {
	t.Helper()
	var leader string
	devtest.Eventually(t, 30*time.Second, name+" has a leader", func() bool {
		s, err := js.Stream(context.Background(), name)
		if err != nil || s.CachedInfo().Cluster == nil {
			return false
		}
		leader = s.CachedInfo().Cluster.Leader
		return leader != ""
	})
	return leader
}

// TestNATSLeadersKilled runs two `ledger serve` and two `projector run` on a
// 3-node JetStream cluster, the streams at 3 replicas, with eight clients
// depositing, and shuts down in turn the node leading JetStream's meta group,
// the one leading LEDGER_COMMANDS and the one leading LEDGER_EVENTS (each
// started again on its store after 2 s). Every key without a definite reply
// is then resent by key: each is applied once, and `ledger audit --events-out`
// is clean. The commands applied during each outage are logged.
func TestNATSLeadersKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("production shape")
	}
	ledgerBin, projBin := ledgerBinary(t), projectorBinary(t)
	dbURL := pgtest.URL(t)
	cluster, servers := devtest.NATSCluster(t)
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
		}
	})
	env := []string{config.EnvDatabaseURL + "=" + dbURL, config.EnvEventStoreURL + "=" + dbURL,
		config.EnvNATSURL + "=" + cluster.URL(), config.EnvJetStreamReplicas + "=3", config.EnvDataDir + "=" + t.TempDir()}
	for i := range 2 {
		startProc(t, ledgerBin, []string{"serve", "--log-format", "json", "--instance-name", fmt.Sprintf("ledger-%d", i), "--command-timeout", "3s",
			"--http-addr", anyPort}, env, "intake started")
		startProc(t, projBin, []string{"run", "--log-format", "json", "--http-addr", anyPort}, env, "projector running")
	}
	nc := devtest.ConnectURL(t, cluster.URL(), nats.ReconnectWait(50*time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const clients = 8
	for g := range clients {
		id := fmt.Sprintf("fo-%d", g)
		if r, ok := sendOnce(nc, mkCrashCmd("open_account", "open-"+id, id, 0, map[string]any{"currency": "EUR"}), 20*time.Second); !ok || r.Status != domain.StatusApplied {
			t.Fatalf("open %s: %+v", id, r)
		}
	}
	streamLeader(t, js, projections.EventsStream) // the publisher declared it
	cl := startFailoverClients(nc, clients)
	applied := func() int {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return len(cl.definite)
	}
	var outages []string
	for _, target := range []string{"meta", "LEDGER_COMMANDS", projections.EventsStream} {
		time.Sleep(time.Second)
		i := -1
		for j, s := range servers {
			if target == "meta" && s.JetStreamIsLeader() || target != "meta" && s.Name() == streamLeader(t, js, target) {
				i = j
			}
		}
		if i < 0 {
			t.Fatalf("no leader of %s", target)
		}
		before := applied()
		servers[i].Shutdown()
		servers[i].WaitForShutdown()
		time.Sleep(2 * time.Second)
		during := applied() - before
		s, err := cluster.StartNode(i)
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = s
		outages = append(outages, fmt.Sprintf("%s leader %s down 2 s: %d commands definite meanwhile", target, cluster.Nodes[i].Name, during))
	}
	time.Sleep(time.Second)
	cl.halt()
	retried := cl.resendUndecided(t, nc)
	t.Logf("NATS leaders killed: %v; %d commands sent, %d resent by key", outages, len(cl.sent), retried)
	store := devtest.Store(t, dbURL)
	for _, c := range cl.sent {
		if r := cl.definite[c.key]; r.Status != domain.StatusApplied {
			t.Errorf("%s: %+v", c.key, r)
		}
	}
	cl.appliedOnce(t, store)
	caughtUp(t, dbURL, store)
	if out, code := runToExit(t, ledgerBin, []string{"audit", "--events-out"}, env); code != 0 {
		t.Fatalf("ledger audit --events-out: exit %d\n%s", code, out)
	}
}

// TestCancelledWaitForTheStandbyIsNotAcknowledged: `ledger dev` on a
// PostgreSQL pair whose standby is frozen (SIGSTOP), so a deposit's commit
// waits for it; an operator's pg_cancel_backend ends that wait, and
// PostgreSQL commits the deposit on the primary alone, answering COMMIT with
// a warning. The command must not be acknowledged: its reply is `error`
// (indefinite), and so is its resend while the standby is still away (the
// duplicate's reply waits for the standby to have its events, and that wait
// is cancelled too). Once the standby is thawed, the same command sent again
// by its key is answered as the duplicate it is, applied, and the money moved
// once. Fails on an event store that takes the warning for success (the
// first reply is then `applied`), and on a ledger that answers a duplicate
// from events the standby may lack (the resend is then `applied`).
func TestCancelledWaitForTheStandbyIsNotAcknowledged(t *testing.T) {
	ctx := context.Background()
	pair, dev, natsURL := devOnAPair(t, "syncwait", "--command-timeout", "30s")
	url := pair.URL()
	nc := devtest.ConnectURL(t, natsURL)
	if r, ok := sendOnce(nc, mkCrashCmd("open_account", "open-sw", "sw", 0, map[string]any{"currency": "EUR"}), 20*time.Second); !ok || r.Status != domain.StatusApplied {
		t.Fatalf("open: %+v", r)
	}
	store := devtest.Store(t, url)
	caughtUp(t, url, store) // the projector and the publisher idle
	admin, err := projections.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	standby := pair.Standby()
	if _, err := standby.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if _, err := standby.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	defer thaw()
	dep := mkCrashCmd("deposit", "sw-1", "sw", 500, map[string]any{"amount": 500, "currency": "EUR"})
	// The operator ends every wait for the standby (the deposit's among them)
	// until the deposit is answered.
	sendCancelling := func(what string) {
		t.Helper()
		answer := make(chan reply.Reply, 1)
		go func() {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			// One request, not resent: the test looks at the ledger's first
			// answer (LEDGER_COMMANDS is NoAck: the first message is the
			// ledger's reply).
			var r reply.Reply
			if m, err := nc.RequestWithContext(cctx, client.CommandSubjectPrefix+dep.typ, dep.body); err == nil {
				_ = json.Unmarshal(m.Data, &r)
			}
			answer <- r
		}()
		var r reply.Reply
		cancelled := 0
		devtest.Eventually(t, time.Minute, what+" answered", func() bool {
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n); err == nil {
				cancelled += n
			}
			select {
			case r = <-answer:
				return true
			default:
				return false
			}
		})
		if r.Status != domain.StatusError {
			t.Fatalf("%s, the standby frozen and every wait for it cancelled: %+v, want status error (indefinite)", what, r)
		}
		t.Logf("%s: %d waits for the standby cancelled; answered %s: %s", what, cancelled, r.Status, r.Message)
	}
	sendCancelling("the deposit")
	// Its events are on the primary alone: a resend that finds them must not
	// answer them as decided either (it did, applied and duplicate, before the
	// ledger made a duplicate's events durable first).
	sendCancelling("the deposit sent again before the standby is back")

	thaw()
	again, ok := sendOnce(nc, dep, 30*time.Second)
	if !ok || again.Status != domain.StatusApplied || !again.Duplicate {
		t.Fatalf("the deposit sent again: %+v, want applied, duplicate", again)
	}
	if acc := devtest.Account(t, store, "sw"); acc.Balance != 500 {
		t.Fatalf("balance %d, want 500: the deposit moved money %d times", acc.Balance, acc.Balance/500)
	}
	perKey := 0
	for _, ev := range devtest.StreamEvents(t, store, domain.AccountStream("sw")) {
		if m, err := domain.DecodeMetadata(ev.Metadata); err == nil && m.Key == dep.key {
			perKey++
		}
	}
	if perKey != 1 {
		t.Fatalf("%s has %d events, want 1", dep.key, perKey)
	}
	dev.stop()
}

// devOnAPair runs `ledger dev` (args added) on a PostgreSQL pair of its own,
// reached by the pair's multi-host URL, and returns them with dev's NATS URL.
// Skipped under -short.
func devOnAPair(t *testing.T, prefix string, args ...string) (*pgcluster.Pair, *devProc, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("PostgreSQL pair")
	}
	ledgerBinary(t)
	pair := devtest.Pair(t, prefix)
	natsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	dev := startDev(t, t.TempDir(), append([]string{"--nats-addr", natsAddr, "--database-url", pair.URL()}, args...), nil)
	return pair, dev, "nats://" + natsAddr
}
