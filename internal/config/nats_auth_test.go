package config

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/ledgerworks/ledger/internal/devenv/devtest"
	"github.com/ledgerworks/ledger/internal/testcert"
)

// startAuthNATS starts a nats-server with opts (auth and TLS set by the caller).
func startAuthNATS(t *testing.T, opts *server.Options) *server.Server {
	return devtest.NATSWith(t, opts)
}

func writeFile(t *testing.T, name string, b []byte) string { return testcert.WriteFile(t, name, b) }

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
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		other, _ := nkeys.CreateUser()
		otherSeed, _ := other.Seed()
		ns := startAuthNATS(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
		url := ns.ClientURL()
		connects(t, NATS{URL: url, NKey: writeFile(t, "user.nk", seed)}, map[string]NATS{
			"another nkey": {URL: url, NKey: writeFile(t, "other.nk", otherSeed)},
			"no nkey":      {URL: url},
		}, string(seed), string(otherSeed))
	})
	t.Run("credentials", func(t *testing.T) {
		opKP, _ := nkeys.CreateOperator()
		opPub, _ := opKP.PublicKey()
		op := jwt.NewOperatorClaims(opPub)
		opJWT, err := op.Encode(opKP)
		if err != nil {
			t.Fatal(err)
		}
		opClaims, err := jwt.DecodeOperatorClaims(opJWT)
		if err != nil {
			t.Fatal(err)
		}
		accKP, _ := nkeys.CreateAccount()
		accPub, _ := accKP.PublicKey()
		acc := jwt.NewAccountClaims(accPub)
		accJWT, err := acc.Encode(opKP)
		if err != nil {
			t.Fatal(err)
		}
		creds := func(signer nkeys.KeyPair, issuerAccount string) ([]byte, string) {
			uKP, _ := nkeys.CreateUser()
			uPub, _ := uKP.PublicKey()
			u := jwt.NewUserClaims(uPub)
			u.IssuerAccount = issuerAccount
			uJWT, err := u.Encode(signer)
			if err != nil {
				t.Fatal(err)
			}
			seed, _ := uKP.Seed()
			b, err := jwt.FormatUserConfig(uJWT, seed)
			if err != nil {
				t.Fatal(err)
			}
			return b, string(seed)
		}
		good, goodSeed := creds(accKP, "")
		strangerKP, _ := nkeys.CreateAccount() // an account the operator never signed
		bad, badSeed := creds(strangerKP, "")
		resolver := &server.MemAccResolver{}
		if err := resolver.Store(accPub, accJWT); err != nil {
			t.Fatal(err)
		}
		ns := startAuthNATS(t, &server.Options{TrustedOperators: []*jwt.OperatorClaims{opClaims}, AccountResolver: resolver})
		url := ns.ClientURL()
		connects(t, NATS{URL: url, Creds: writeFile(t, "user.creds", good)}, map[string]NATS{
			"a user of an unknown account": {URL: url, Creds: writeFile(t, "stranger.creds", bad)},
			"no credentials":               {URL: url},
		}, goodSeed, badSeed)
	})

	ca := testcert.NewCA(t)
	serverCert := ca.Issue(t, "nats-server", true)
	clientCert := ca.Issue(t, "ledger", false)
	caFile := writeFile(t, "ca.pem", ca.CertPEM)
	t.Run("TLS", func(t *testing.T) {
		cfg := &tls.Config{Certificates: []tls.Certificate{serverCert.Pair(t)}, MinVersion: tls.VersionTLS12}
		ns := startAuthNATS(t, &server.Options{TLS: true, TLSConfig: cfg, TLSTimeout: 2})
		url := "tls://" + ns.Addr().String()
		connects(t, NATS{URL: url, TLSCA: caFile}, map[string]NATS{
			"no CA":      {URL: url},
			"another CA": {URL: url, TLSCA: writeFile(t, "other-ca.pem", testcert.NewCA(t).CertPEM)},
		})
	})
	t.Run("mutual TLS", func(t *testing.T) {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca.CertPEM)
		cfg := &tls.Config{Certificates: []tls.Certificate{serverCert.Pair(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS12}
		ns := startAuthNATS(t, &server.Options{TLS: true, TLSVerify: true, TLSConfig: cfg, TLSTimeout: 2})
		url := "tls://" + ns.Addr().String()
		certFile, keyFile := writeFile(t, "client.pem", clientCert.CertPEM), writeFile(t, "client-key.pem", clientCert.KeyPEM)
		stranger := testcert.NewCA(t).Issue(t, "stranger", false)
		connects(t, NATS{URL: url, TLSCA: caFile, TLSCert: certFile, TLSKey: keyFile}, map[string]NATS{
			"no client certificate": {URL: url, TLSCA: caFile},
			"a certificate of another CA": {URL: url, TLSCA: caFile,
				TLSCert: writeFile(t, "s.pem", stranger.CertPEM), TLSKey: writeFile(t, "s-key.pem", stranger.KeyPEM)},
		}, string(clientCert.KeyPEM))
	})
}
