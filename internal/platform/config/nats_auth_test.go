package config

import (
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/testcert"
)

// startAuthNATS starts a nats-server with opts (auth and TLS set by the caller).
func startAuthNATS(t *testing.T, opts *server.Options) *server.Server {
	return devtest.NATSWith(t, opts)
}

// connects asserts that cfg connects, and that each wrong configuration is
// refused with an error naming the mode and holding none of the secrets.
func connects(t *testing.T, cfg NATS, wrong map[string]NATS, secrets ...string) {
	t.Helper()
	nc, err := cfg.Connect("auth-test")
	if err != nil {
		t.Fatalf("right settings (%s): %v", cfg.Mode(), err)
	}
	nc.Close()
	for what, w := range wrong {
		nc, err := w.Connect("auth-test")
		if err == nil {
			nc.Close()
			t.Fatalf("%s: connected", what)
		}
		msg := err.Error()
		if !strings.Contains(msg, "auth: ") {
			t.Fatalf("%s: error %q does not name the mode", what, msg)
		}
		for _, s := range secrets {
			if s != "" && strings.Contains(msg, s) {
				t.Fatalf("%s: error %q holds a secret", what, msg)
			}
		}
	}
}

// TestNATSAuthModes: each mode the NATS flags offer, against a server that
// requires it: user/password, token, nkey, credentials (an operator, an account
// and a user made here with nats-io/jwt), TLS with a CA made here, mutual TLS.
func TestNATSAuthModes(t *testing.T) {
	t.Run("user and password", func(t *testing.T) {
		ns := startAuthNATS(t, &server.Options{Username: "ledger", Password: "pw-Secret-1"})
		url := ns.ClientURL()
		connects(t, NATS{URL: url, User: "ledger", Password: "pw-Secret-1"}, map[string]NATS{
			"wrong password": {URL: url, User: "ledger", Password: "pw-Wrong-2"},
			"no password":    {URL: url},
		}, "pw-Secret-1", "pw-Wrong-2")
	})
	t.Run("token", func(t *testing.T) {
		ns := startAuthNATS(t, &server.Options{Authorization: "tok-Secret-1"})
		url := ns.ClientURL()
		connects(t, NATS{URL: url, Token: "tok-Secret-1"}, map[string]NATS{
			"wrong token": {URL: url, Token: "tok-Wrong-2"},
			"no token":    {URL: url},
		}, "tok-Secret-1", "tok-Wrong-2")
	})
	t.Run("nkey", func(t *testing.T) {
		pub, seed := devtest.NKeyUser(t)
		_, otherSeed := devtest.NKeyUser(t)
		ns := startAuthNATS(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
		url := ns.ClientURL()
		connects(t, NATS{URL: url, NKey: testcert.WriteFile(t, "user.nk", []byte(seed))}, map[string]NATS{
			"another nkey": {URL: url, NKey: testcert.WriteFile(t, "other.nk", []byte(otherSeed))},
			"no nkey":      {URL: url},
		}, seed, otherSeed)
	})
	t.Run("credentials", func(t *testing.T) {
		op := devtest.NewOperator(t)
		good, goodSeed := devtest.UserCreds(t, op.Account(t, false))
		stranger, _ := nkeys.CreateAccount() // an account the operator never signed
		bad, badSeed := devtest.UserCreds(t, stranger)
		opts := &server.Options{}
		op.Trust(opts)
		ns := startAuthNATS(t, opts)
		url := ns.ClientURL()
		connects(t, NATS{URL: url, Creds: testcert.WriteFile(t, "user.creds", good)}, map[string]NATS{
			"a user of an unknown account": {URL: url, Creds: testcert.WriteFile(t, "stranger.creds", bad)},
			"no credentials":               {URL: url},
		}, goodSeed, badSeed)
	})

	ca := testcert.NewCA(t)
	serverCert := ca.Issue(t, "nats-server", true)
	clientCert := ca.Issue(t, "ledger", false)
	caFile := testcert.WriteFile(t, "ca.pem", ca.CertPEM)
	t.Run("TLS", func(t *testing.T) {
		ns := startAuthNATS(t, &server.Options{TLS: true, TLSConfig: ca.ServerTLS(t, serverCert, false), TLSTimeout: 2})
		url := "tls://" + ns.Addr().String()
		connects(t, NATS{URL: url, TLSCA: caFile}, map[string]NATS{
			"no CA":      {URL: url},
			"another CA": {URL: url, TLSCA: testcert.WriteFile(t, "other-ca.pem", testcert.NewCA(t).CertPEM)},
		})
	})
	t.Run("mutual TLS", func(t *testing.T) {
		ns := startAuthNATS(t, &server.Options{TLS: true, TLSVerify: true, TLSConfig: ca.ServerTLS(t, serverCert, true), TLSTimeout: 2})
		url := "tls://" + ns.Addr().String()
		certFile, keyFile := testcert.WriteFile(t, "client.pem", clientCert.CertPEM), testcert.WriteFile(t, "client-key.pem", clientCert.KeyPEM)
		stranger := testcert.NewCA(t).Issue(t, "stranger", false)
		connects(t, NATS{URL: url, TLSCA: caFile, TLSCert: certFile, TLSKey: keyFile}, map[string]NATS{
			"no client certificate": {URL: url, TLSCA: caFile},
			"a certificate of another CA": {URL: url, TLSCA: caFile,
				TLSCert: testcert.WriteFile(t, "s.pem", stranger.CertPEM), TLSKey: testcert.WriteFile(t, "s-key.pem", stranger.KeyPEM)},
		}, string(clientCert.KeyPEM))
	})
}
