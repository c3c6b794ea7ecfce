// Package testcert makes a certificate authority and its certificates for
// tests: a server certificate for 127.0.0.1, client certificates, all valid for
// an hour. It serves the TLS tests of NATS and of KurrentDB alike.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for a test.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

// Cert is a certificate and its private key, PEM-encoded.
type Cert struct{ CertPEM, KeyPEM []byte }

// Pair is the certificate as a tls.Certificate.
func (c Cert) Pair(t testing.TB) tls.Certificate {
	t.Helper()
	p, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// NewCA makes a certificate authority.
func NewCA(t testing.TB) *CA {
	t.Helper()
	ca, err := MakeCA()
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// MakeCA makes a certificate authority, for a program rather than a test (the
// KurrentDB client suite's harness).
func MakeCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ledger test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Issue makes a certificate for 127.0.0.1 (server) or a client certificate.
func (ca *CA) Issue(t testing.TB, name string, server bool) Cert {
	t.Helper()
	c, err := ca.Make(name, server)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Make is Issue for a program rather than a test.
func (ca *CA) Make(name string, server bool) (Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Cert{}, err
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
		return Cert{}, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Cert{}, err
	}
	return Cert{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})}, nil
}

// Pool is a certificate pool holding ca, to verify what it signed.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
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

// WriteFile writes b to name in a directory removed after the test (mode 0600)
// and returns its path.
func WriteFile(t testing.TB, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
