package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/internal/testing/testcert"
)

// proc is a long-running program of a test (`ledger serve`, `projector run`),
// its stdout and stderr collected together.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
}

// startProc starts bin with args, with env added to the test's environment, and
// waits until its output holds ready. It is killed when t ends.
func startProc(t *testing.T, bin string, args, env []string, ready string) *proc {
	t.Helper()
	p := &proc{t: t, name: strings.Join(append([]string{bin}, args...), " "), out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	deadline := time.After(time.Minute)
	for !strings.Contains(p.out.String(), ready) {
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before %q:\n%s", p.name, p.err, ready, p.out.String())
		case <-deadline:
			t.Fatalf("%s: no %q within 1m:\n%s", p.name, ready, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return p
}

// stop sends SIGTERM, requires a clean exit and returns the whole output.
func (p *proc) stop() string {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		p.t.Fatalf("%s did not stop within 1m:\n%s", p.name, p.out.String())
	}
	if p.err != nil {
		p.t.Fatalf("%s stopped with %v:\n%s", p.name, p.err, p.out.String())
	}
	return p.out.String()
}

// runToExit runs bin with args and env until it exits (within a minute) and
// returns its output and exit status.
func runToExit(t *testing.T, bin string, args, env []string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee) && ctx.Err() == nil:
		return string(out), ee.ExitCode()
	}
	t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	return "", 0
}

// natsSettings are the set fields of cfg: each one's flag, variable and value.
func natsSettings(cfg config.NATS) [][3]string {
	var out [][3]string
	for _, s := range [][3]string{
		{config.FlagNATSURL, config.EnvNATSURL, cfg.URL}, {config.FlagNATSCreds, config.EnvNATSCreds, cfg.Creds},
		{config.FlagNATSNKey, config.EnvNATSNKey, cfg.NKey}, {config.FlagNATSUser, config.EnvNATSUser, cfg.User},
		{config.FlagNATSPassword, config.EnvNATSPassword, cfg.Password}, {config.FlagNATSToken, config.EnvNATSToken, cfg.Token},
		{config.FlagNATSTLSCert, config.EnvNATSTLSCert, cfg.TLSCert}, {config.FlagNATSTLSKey, config.EnvNATSTLSKey, cfg.TLSKey},
		{config.FlagNATSTLSCA, config.EnvNATSTLSCA, cfg.TLSCA},
	} {
		if s[2] != "" {
			out = append(out, s)
		}
	}
	return out
}

// natsEnv is cfg as the LEDGER_NATS_* variables of every program.
func natsEnv(cfg config.NATS) []string {
	var env []string
	for _, s := range natsSettings(cfg) {
		env = append(env, s[1]+"="+s[2])
	}
	return env
}

// natsArgs is cfg as the --nats-* flags.
func natsArgs(cfg config.NATS) []string {
	var args []string
	for _, s := range natsSettings(cfg) {
		args = append(args, "--"+s[0], s[2])
	}
	return args
}

// natsMode is one way of authenticating that the NATS flags offer, with a
// server that requires it.
type natsMode struct {
	name    string
	server  *server.Options // without JetStream's store, added by the test
	scheme  string          // of the server's URL: nats or tls
	right   config.NATS     // connects (URL added by the test)
	wrong   config.NATS     // is refused
	flags   bool            // pass the settings as flags (else as LEDGER_* variables)
	mode    string          // what the refusal names
	secrets []string        // what must never be printed
}

// natsModes are the modes of RELIABILITY.md's Security table, each with its
// material made here.
func natsModes(t *testing.T) []natsMode {
	nkPub, nkSeed := devtest.NKeyUser(t)
	_, otherSeed := devtest.NKeyUser(t)
	op := devtest.NewOperator(t)
	creds, credsSeed := devtest.UserCreds(t, op.Account(t, true))
	stranger, _ := nkeys.CreateAccount() // never signed by the operator
	strangerCreds, strangerSeed := devtest.UserCreds(t, stranger)
	jwtServer := &server.Options{}
	op.Trust(jwtServer)
	ca := testcert.NewCA(t)
	serverCert := ca.Issue(t, "nats-server", true)
	client := ca.Issue(t, "ledger", false)
	caFile := testcert.WriteFile(t, "ca.pem", ca.CertPEM)
	otherCA := testcert.NewCA(t)
	otherClient := otherCA.Issue(t, "stranger", false)
	return []natsMode{{
		name:   "user and password",
		server: &server.Options{Username: "ledger", Password: "pw-Right-7d1e"},
		right:  config.NATS{User: "ledger", Password: "pw-Right-7d1e"}, wrong: config.NATS{User: "ledger", Password: "pw-Wrong-93ab"},
		mode: "auth: user ledger with a password", secrets: []string{"pw-Right-7d1e", "pw-Wrong-93ab"},
	}, {
		name:   "token",
		server: &server.Options{Authorization: "tok-Right-51c0"},
		right:  config.NATS{Token: "tok-Right-51c0"}, wrong: config.NATS{Token: "tok-Wrong-e2f4"}, flags: true,
		mode: "auth: token", secrets: []string{"tok-Right-51c0", "tok-Wrong-e2f4"},
	}, {
		name:   "nkey",
		server: &server.Options{Nkeys: []*server.NkeyUser{{Nkey: nkPub}}},
		right:  config.NATS{NKey: testcert.WriteFile(t, "user.nk", []byte(nkSeed))}, wrong: config.NATS{NKey: testcert.WriteFile(t, "other.nk", []byte(otherSeed))},
		mode: "auth: nkey seed file", secrets: []string{nkSeed, otherSeed},
	}, {
		name:   "JWT credentials",
		server: jwtServer,
		right:  config.NATS{Creds: testcert.WriteFile(t, "user.creds", creds)}, wrong: config.NATS{Creds: testcert.WriteFile(t, "stranger.creds", strangerCreds)}, flags: true,
		mode: "auth: credentials file", secrets: []string{credsSeed, strangerSeed},
	}, {
		name:   "TLS",
		server: &server.Options{TLS: true, TLSConfig: ca.ServerTLS(t, serverCert, false), TLSTimeout: 2}, scheme: "tls",
		right: config.NATS{TLSCA: caFile}, wrong: config.NATS{TLSCA: testcert.WriteFile(t, "other-ca.pem", otherCA.CertPEM)},
		mode: "auth: no authentication, TLS",
	}, {
		name:   "mutual TLS",
		server: &server.Options{TLS: true, TLSVerify: true, TLSConfig: ca.ServerTLS(t, serverCert, true), TLSTimeout: 2}, scheme: "tls",
		right: config.NATS{TLSCA: caFile, TLSCert: testcert.WriteFile(t, "client.pem", client.CertPEM), TLSKey: testcert.WriteFile(t, "client-key.pem", client.KeyPEM)},
		wrong: config.NATS{TLSCA: caFile, TLSCert: testcert.WriteFile(t, "s.pem", otherClient.CertPEM), TLSKey: testcert.WriteFile(t, "s-key.pem", otherClient.KeyPEM)},
		flags: true, mode: "auth: no authentication, mutual TLS", secrets: []string{pemBody(client.KeyPEM), pemBody(otherClient.KeyPEM)},
	}}
}

// pemBody is the base64 body of a PEM block: the secret part of a key file.
func pemBody(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[1:len(lines)-1], "")
}

// leak returns the first of secrets that out holds, whole or (one longer than
// 64 characters: a PEM body) any run of 31 characters of it (it holds one of
// its aligned 16-character pieces), even across a line break; or "" when none.
func leak(out string, secrets ...string) string {
	flat := strings.ReplaceAll(out, "\n", "")
	for _, s := range secrets {
		if s == "" {
			continue
		}
		pieces := []string{s}
		if len(s) > 64 {
			pieces = nil
			for i := 0; i+16 <= len(s); i += 16 {
				pieces = append(pieces, s[i:i+16])
			}
		}
		for _, p := range pieces {
			if strings.Contains(out, p) || strings.Contains(flat, p) {
				return p
			}
		}
	}
	return ""
}

// noSecret fails t when out (the output of what) holds one of secrets (leak).
func noSecret(t *testing.T, what, out string, secrets ...string) {
	t.Helper()
	if p := leak(out, secrets...); p != "" {
		t.Fatalf("%s printed a secret (%.6s...):\n%s", what, p, out)
	}
}

// TestLeakFindsSecrets: the search of the logs finds a secret printed whole, a
// piece of a key's PEM body, and one cut by a line break.
func TestLeakFindsSecrets(t *testing.T) {
	key := testcert.NewCA(t).Issue(t, "x", false).KeyPEM
	body := pemBody(key)
	for what, out := range map[string]string{
		"a password":          `{"level":"DEBUG","msg":"connect","password":"pw-Leak-1"}`,
		"a piece of a key":    "key: " + body[20:51],
		"cut by a line break": `token tok-Le` + "\n" + `ak-2`,
		"a key file as it is": string(key),
	} {
		if leak(out, "pw-Leak-1", "tok-Leak-2", body) == "" {
			t.Errorf("%s: not found in %q", what, out)
		}
	}
	if p := leak(`{"msg":"ledger serving","nats":"nats://xxxxx@127.0.0.1:4222"}`, "pw-Leak-1", "tok-Leak-2", body); p != "" {
		t.Errorf("found %q where there is none", p)
	}
}

// TestServeAndProjectorNATSModes runs `ledger serve`, `projector run` and
// `ledger post` against a nats-server requiring each mode the NATS flags offer,
// with the settings as flags or as LEDGER_* variables: with the right settings
// the command is applied, its outcome answered by serve, the projector answers a
// query and publishes to LEDGER_EVENTS; with wrong ones each program exits
// non-zero naming the mode and printing none of the secrets.
func TestServeAndProjectorNATSModes(t *testing.T) {
	ledgerBin, projBin := ledgerBinary(t), projectorBinary(t)
	for _, m := range natsModes(t) {
		t.Run(m.name, func(t *testing.T) {
			m.server.JetStream, m.server.StoreDir = true, t.TempDir()
			ns := devtest.NATSWith(t, m.server)
			url := ns.ClientURL()
			if m.scheme == "tls" {
				url = "tls://" + ns.Addr().String()
			}
			m.right.URL, m.wrong.URL = url, url
			settings := func(cfg config.NATS) (args, env []string) {
				if m.flags {
					return natsArgs(cfg), nil
				}
				return nil, natsEnv(cfg)
			}
			dbURL := pgtest.URL(t)
			db := []string{config.EnvDatabaseURL + "=" + dbURL, config.EnvEventStoreURL + "=" + dbURL, config.EnvDataDir + "=" + t.TempDir()}
			serveArgs := []string{"serve", "--log-format", "json", "--http-addr", anyPort}
			projArgs := []string{"run", "--log-format", "json", "--http-addr", anyPort}

			args, env := settings(m.right)
			env = append(env, db...)
			serve := startProc(t, ledgerBin, append(serveArgs, args...), env, "intake started")
			proj := startProc(t, projBin, append(projArgs, args...), env, "projector running")
			post := func(pargs ...string) (map[string]any, string, int) {
				t.Helper()
				if m.flags {
					// post takes its flags after the command type
					pargs = append(pargs, args...)
				}
				return postCLI(t, env, pargs...)
			}
			if r, o, code := post("open_account", "--key", "o-1", "--account", "a", "--currency", "EUR"); code != 0 || r["status"] != "applied" {
				t.Fatalf("open_account: exit %d\n%s", code, o)
			}
			r, o, code := post("deposit", "--key", "d-1", "--account", "a", "--amount", "250", "--currency", "EUR")
			if code != 0 || r["status"] != "applied" {
				t.Fatalf("deposit: exit %d\n%s", code, o)
			}
			if r, o, code := post("--query", "--key", "d-1"); code != 0 || r["idempotency_key"] != "d-1" {
				t.Fatalf("query of the command: exit %d\n%s", code, o)
			}
			nc, err := m.right.Connect("test")
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if acc := accountQuery(t, nc, "a", r["position"]); acc["balance"] != float64(250) {
				t.Fatalf("the projector's account: %v", acc)
			}
			streamHolds(t, nc, "LEDGER_EVENTS", 2)

			wargs, wenv := settings(m.wrong)
			wenv = append(wenv, db...)
			for _, run := range []struct {
				what string
				bin  string
				args []string
			}{
				{"ledger serve", ledgerBin, append(serveArgs, wargs...)},
				{"projector run", projBin, append(projArgs, wargs...)},
				{"ledger post", ledgerBin, append([]string{"post", "deposit", "--key", "d-2", "--account", "a", "--amount", "1", "--currency", "EUR"}, wargs...)},
			} {
				out, code := runToExit(t, run.bin, run.args, wenv)
				if code == 0 || !strings.Contains(out, m.mode) {
					t.Fatalf("%s with wrong settings: exit %d, want non-zero naming %q:\n%s", run.what, code, m.mode, out)
				}
				if run.what == "ledger post" && code != exitNoReply {
					t.Fatalf("ledger post with wrong settings: exit %d, want %d:\n%s", code, exitNoReply, out)
				}
				noSecret(t, run.what+" with wrong settings", out, m.secrets...)
			}
			noSecret(t, "ledger serve", serve.stop(), m.secrets...)
			noSecret(t, "projector run", proj.stop(), m.secrets...)
		})
	}
}

// accountQuery asks ledger.v1.query.account for id once the read model reaches
// position (a command reply's).
func accountQuery(t *testing.T, nc *nats.Conn, id string, position any) map[string]any {
	t.Helper()
	if p, _ := position.(string); p == "" {
		t.Fatalf("no position to read at: %v", position)
	}
	req, _ := json.Marshal(map[string]any{"account_id": id, "min_position": position})
	msg, err := nc.Request("ledger.v1.query.account", req, 10*time.Second)
	if err != nil {
		t.Fatalf("ledger.v1.query.account: %v", err)
	}
	var acc map[string]any
	if err := json.Unmarshal(msg.Data, &acc); err != nil {
		t.Fatalf("ledger.v1.query.account: %v: %s", err, msg.Data)
	}
	return acc
}

// streamHolds waits until the JetStream stream holds at least n messages.
func streamHolds(t *testing.T, nc *nats.Conn, stream string, n uint64) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 30*time.Second, fmt.Sprintf("%d messages in %s", n, stream), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		return err == nil && s.CachedInfo().State.Msgs >= n
	})
}

// The least NATS permissions of each program, as RELIABILITY.md's Security table
// gives them.
var (
	clientPermissions = &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"ledger.v1.cmd.>", "ledger.v1.query.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
	servePermissions = &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{"_INBOX.>", "ledger.v1.dlq", "$JS.API.>", "$JS.ACK.LEDGER_COMMANDS.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"ledger.v1.cmd.>", "ledger.v1.query.command", "ledger.v1.query.transaction",
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.LEDGER_COMMANDS.ledger", "_INBOX.>"}},
	}
	projectorPermissions = &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"_INBOX.>", "ledger.v1.events.>", "$JS.API.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"ledger.v1.query.>", "_INBOX.>"}},
	}
	readerPermissions = &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.CONSUMER.*.LEDGER_EVENTS.>", "$JS.API.CONSUMER.MSG.NEXT.LEDGER_EVENTS.>", "$JS.ACK.LEDGER_EVENTS.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
)

// TestLeastPermissions runs `ledger serve` and `projector run`, each as a user
// with exactly its documented permissions (RELIABILITY.md, Security), with a
// client and an integration reading events, each with its own: a command posted
// by request-reply and one through LEDGER_COMMANDS are applied, an invalid one is
// dead-lettered, the commands' outcome and the projector's account are answered,
// the events reach LEDGER_EVENTS and the reader; the server logs no violation.
// Then the client can neither consume LEDGER_COMMANDS nor publish to
// ledger.v1.events.>.
func TestLeastPermissions(t *testing.T) {
	user := func(name string, p *server.Permissions) *server.User {
		return &server.User{Username: name, Password: name + "-pw", Permissions: p}
	}
	ns, nlog := devtest.NATSLogged(t, &server.Options{
		JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{
			user("admin", nil), user("ledger", servePermissions), user("projector", projectorPermissions),
			user("client", clientPermissions), user("reader", readerPermissions),
		},
	})
	as := func(name string) []string {
		return natsEnv(config.NATS{URL: ns.ClientURL(), User: name, Password: name + "-pw"})
	}
	dbURL := pgtest.URL(t)
	db := []string{config.EnvDatabaseURL + "=" + dbURL, config.EnvEventStoreURL + "=" + dbURL}
	serve := startProc(t, ledgerBinary(t), []string{"serve", "--log-format", "json", "--jetstream-grace", "100ms", "--http-addr", anyPort},
		append(as("ledger"), db...), "intake started")
	proj := startProc(t, projectorBinary(t), []string{"run", "--log-format", "json", "--http-addr", anyPort},
		append(as("projector"), db...), "projector running")

	client := append(as("client"), config.EnvDataDir+"="+t.TempDir())
	if r, o, code := postCLI(t, client, "open_account", "--key", "o-1", "--account", "a", "--currency", "EUR"); code != 0 || r["status"] != "applied" {
		t.Fatalf("the client's command: exit %d\n%s", code, o)
	}
	if r, o, code := postCLI(t, client, "deposit", "--jetstream", "--key", "d-1", "--account", "a", "--amount", "250", "--currency", "EUR"); code != 0 || r["stream"] != "LEDGER_COMMANDS" {
		t.Fatalf("the client's command through LEDGER_COMMANDS: exit %d\n%s", code, o)
	}
	if _, o, code := postCLI(t, client, "deposit", "--jetstream", "--key", "d-bad", "--json", `{"idempotency_key":"d-bad","account_id":"a","amount":1.5,"currency":"EUR"}`); !strings.Contains(o, "invalid_request") {
		// The intake's reply, first, is the publish error; the stream keeps it.
		t.Fatalf("an invalid command through LEDGER_COMMANDS: exit %d\n%s", code, o)
	}
	var outcome map[string]any
	devtest.Eventually(t, 30*time.Second, "the command of LEDGER_COMMANDS applied and its outcome answered", func() bool {
		r, _, code := postCLI(t, client, "--query", "--key", "d-1")
		outcome = r
		return code == 0 && r["status"] == "applied"
	})
	violations := make(chan error, 4)
	cnc := devtest.Connect(t, ns, nats.UserInfo("client", "client-pw"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if acc := accountQuery(t, cnc, "a", outcome["position"]); acc["balance"] != float64(250) {
		t.Fatalf("the projector's account: %v", acc)
	}
	admin := devtest.Connect(t, ns, nats.UserInfo("admin", "admin-pw"))
	streamHolds(t, admin, "LEDGER_EVENTS", 2)
	streamHolds(t, admin, "LEDGER_DLQ", 1) // the invalid command

	rnc := devtest.Connect(t, ns, nats.UserInfo("reader", "reader-pw"))
	rjs, err := jetstream.New(rnc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := rjs.CreateOrUpdateConsumer(ctx, "LEDGER_EVENTS", jetstream.ConsumerConfig{Durable: "integration", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("the reader's consumer of LEDGER_EVENTS: %v", err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for m := range batch.Messages() {
		subjects = append(subjects, m.Subject())
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("the reader's ack: %v", err)
		}
	}
	if len(subjects) != 2 || batch.Error() != nil {
		t.Fatalf("the reader got %v (%v), want the account's two events", subjects, batch.Error())
	}
	serve.stop()
	proj.stop()
	if v := nlog.Matching("Violation"); len(v) > 0 {
		t.Fatalf("the programs needed more than their documented permissions:\n%s", strings.Join(v, "\n"))
	}

	js, err := jetstream.New(cnc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "LEDGER_COMMANDS", jetstream.ConsumerConfig{Durable: "thief"}); err == nil {
		t.Fatal("the client made a consumer of LEDGER_COMMANDS")
	}
	if err := cnc.Publish("ledger.v1.events.account.Credited", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = cnc.Flush()
	deadline := time.After(5 * time.Second)
	for found := false; !found; {
		select {
		case err := <-violations:
			found = strings.Contains(err.Error(), "ledger.v1.events.account.Credited")
		case <-deadline:
			t.Fatal("publishing to ledger.v1.events.> was not refused")
		}
	}
}

// TestSecretsNotLogged runs `ledger serve`, `projector run` and `ledger post`
// with every secret they take set at once: a NATS password and token, an nkey
// seed, the key of a mutual TLS client certificate and the PostgreSQL password,
// against a nats-server requiring the nkey and mutual TLS (it has no way to
// require a password or a token beside them: they are sent and ignored). The
// programs log at debug; a command is applied and answered; each program also
// runs once with a wrong nkey. No output, log or error, holds a secret.
// (`ledger dev` takes only its generated passwords: TestDevNATSAuth.)
func TestSecretsNotLogged(t *testing.T) {
	nkPub, nkSeed := devtest.NKeyUser(t)
	_, otherSeed := devtest.NKeyUser(t)
	ca := testcert.NewCA(t)
	client := ca.Issue(t, "ledger", false)
	ns := devtest.NATSWith(t, &server.Options{
		JetStream: true, StoreDir: t.TempDir(), Nkeys: []*server.NkeyUser{{Nkey: nkPub}},
		TLS: true, TLSVerify: true, TLSConfig: ca.ServerTLS(t, ca.Issue(t, "nats-server", true), true), TLSTimeout: 2,
	})
	dbURL, dbPassword := databaseWithPassword(t)
	cfg := config.NATS{
		URL: "tls://" + ns.Addr().String(), NKey: testcert.WriteFile(t, "user.nk", []byte(nkSeed)),
		User: "ledger", Password: "pw-Every-4c2d", Token: "tok-Every-8e1f",
		TLSCA: testcert.WriteFile(t, "ca.pem", ca.CertPEM), TLSCert: testcert.WriteFile(t, "client.pem", client.CertPEM),
		TLSKey: testcert.WriteFile(t, "client-key.pem", client.KeyPEM),
	}
	wrong := cfg
	wrong.NKey = testcert.WriteFile(t, "other.nk", []byte(otherSeed))
	secrets := []string{"pw-Every-4c2d", "tok-Every-8e1f", nkSeed, otherSeed, pemBody(client.KeyPEM), dbPassword}
	db := []string{config.EnvDatabaseURL + "=" + dbURL, config.EnvEventStoreURL + "=" + dbURL, config.EnvDataDir + "=" + t.TempDir()}
	debug := []string{"--log-format", "json", "--log-level", "debug"}

	// serve takes the settings from the environment, the others as flags.
	serveArgs := append([]string{"serve", "--http-addr", anyPort}, debug...)
	serve := startProc(t, ledgerBinary(t), serveArgs, append(natsEnv(cfg), db...), "intake started")
	projArgs := append([]string{"run", "--http-addr", anyPort}, debug...)
	proj := startProc(t, projectorBinary(t), append(projArgs, natsArgs(cfg)...), db, "projector running")
	r, postOut, code := postCLI(t, db, append([]string{"open_account", "--key", "o-1", "--account", "a", "--currency", "EUR"}, natsArgs(cfg)...)...)
	if code != 0 || r["status"] != "applied" {
		t.Fatalf("open_account: exit %d\n%s", code, postOut)
	}
	nc, err := cfg.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if acc := accountQuery(t, nc, "a", r["position"]); acc["account_id"] != "a" {
		t.Fatalf("the projector's account: %v", acc)
	}
	outputs := map[string]string{"ledger post": postOut, "ledger serve": serve.stop(), "projector run": proj.stop()}
	if !strings.Contains(outputs["ledger serve"], `"level":"DEBUG"`) {
		t.Fatalf("ledger serve logged nothing at debug (the search would be vacuous):\n%s", outputs["ledger serve"])
	}
	for what, run := range map[string]struct {
		bin  string
		args []string
		env  []string
	}{
		"ledger serve with a wrong nkey":  {ledgerBinary(t), serveArgs, append(natsEnv(wrong), db...)},
		"projector run with a wrong nkey": {projectorBinary(t), append(projArgs, natsArgs(wrong)...), db},
		"ledger post with a wrong nkey":   {ledgerBinary(t), append([]string{"post", "deposit", "--key", "d-1", "--account", "a", "--amount", "1", "--currency", "EUR"}, natsArgs(wrong)...), db},
	} {
		out, code := runToExit(t, run.bin, run.args, run.env)
		if code == 0 || !strings.Contains(out, "auth: nkey seed file") {
			t.Fatalf("%s: exit %d, want non-zero naming the mode:\n%s", what, code, out)
		}
		outputs[what] = out
	}
	for what, out := range outputs {
		noSecret(t, what, out, secrets...)
	}
}
