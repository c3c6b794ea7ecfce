package devtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// The NATS authentication material of tests: files, a certificate authority
// (TLS, mutual TLS), nkeys, and an operator with accounts and users (JWT
// credentials), all made in the test.

// WriteFile writes b to a new file name in a temp dir of t (mode 0600) and
// returns its path.
func WriteFile(t testing.TB, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// CA is a certificate authority made for a test.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

// Cert is a certificate and its key, in PEM.
type Cert struct{ CertPEM, KeyPEM []byte }

// Pair is c as a tls.Certificate.
func (c Cert) Pair(t testing.TB) tls.Certificate {
	t.Helper()
	p, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// NewCA makes a certificate authority valid for an hour.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ledger test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a certificate pool holding ca, to verify what it signed.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// Issue makes a certificate for 127.0.0.1 (server) or a client certificate.
func (ca *CA) Issue(t testing.TB, name string, server bool) Cert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Cert{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})}
}

// ServerTLS is the TLS configuration of a server holding cert; with verify, it
// requires and verifies client certificates signed by ca (mutual TLS).
func (ca *CA) ServerTLS(t testing.TB, cert Cert, verify bool) *tls.Config {
	t.Helper()
	cfg := &tls.Config{Certificates: []tls.Certificate{cert.Pair(t)}, MinVersion: tls.VersionTLS12}
	if verify {
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, ca.Pool()
	}
	return cfg
}

// NKeyUser makes a user nkey: its public key and its seed.
func NKeyUser(t testing.TB) (pub, seed string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ = kp.PublicKey()
	s, _ := kp.Seed()
	return pub, string(s)
}

// Operator is a NATS operator made for a test, with an in-memory resolver of
// the accounts it signs (decentralized JWT authentication) and a system account
// (JetStream needs one).
type Operator struct {
	kp       nkeys.KeyPair
	claims   *jwt.OperatorClaims
	resolver *server.MemAccResolver
	system   string
}

// NewOperator makes an operator.
func NewOperator(t testing.TB) *Operator {
	t.Helper()
	kp, _ := nkeys.CreateOperator()
	pub, _ := kp.PublicKey()
	enc, err := jwt.NewOperatorClaims(pub).Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeOperatorClaims(enc)
	if err != nil {
		t.Fatal(err)
	}
	o := &Operator{kp: kp, claims: claims, resolver: &server.MemAccResolver{}}
	o.system, _ = o.Account(t, false).PublicKey()
	return o
}

// Trust makes the server of opts trust o and resolve its accounts.
func (o *Operator) Trust(opts *server.Options) {
	opts.TrustedOperators, opts.AccountResolver, opts.SystemAccount = []*jwt.OperatorClaims{o.claims}, o.resolver, o.system
}

// Account makes an account signed by o, with JetStream allowed when
// jetStream, and returns its key, which signs its users.
func (o *Operator) Account(t testing.TB, jetStream bool) nkeys.KeyPair {
	t.Helper()
	kp, _ := nkeys.CreateAccount()
	pub, _ := kp.PublicKey()
	acc := jwt.NewAccountClaims(pub)
	if jetStream {
		acc.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	enc, err := acc.Encode(o.kp)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.resolver.Store(pub, enc); err != nil {
		t.Fatal(err)
	}
	return kp
}

// UserCreds makes a user signed by account (any account key: one no operator
// signed makes a user the server refuses) and returns its credentials file
// (JWT and seed) and its seed.
func UserCreds(t testing.TB, account nkeys.KeyPair) (creds []byte, seed string) {
	t.Helper()
	pub, seed := NKeyUser(t)
	enc, err := jwt.NewUserClaims(pub).Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	creds, err = jwt.FormatUserConfig(enc, []byte(seed))
	if err != nil {
		t.Fatal(err)
	}
	return creds, seed
}

// ServerLog collects what a nats-server logs at notice level and above.
type ServerLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *ServerLog) add(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, level+" "+fmt.Sprintf(format, v...))
}

// Noticef, Warnf, Fatalf, Errorf, Debugf and Tracef make it a server.Logger.
func (l *ServerLog) Noticef(format string, v ...any) { l.add("[INF]", format, v...) }
func (l *ServerLog) Warnf(format string, v ...any)   { l.add("[WRN]", format, v...) }
func (l *ServerLog) Fatalf(format string, v ...any)  { l.add("[FTL]", format, v...) }
func (l *ServerLog) Errorf(format string, v ...any)  { l.add("[ERR]", format, v...) }
func (l *ServerLog) Debugf(string, ...any)           {}
func (l *ServerLog) Tracef(string, ...any)           {}

// Matching returns the lines holding s.
func (l *ServerLog) Matching(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}
