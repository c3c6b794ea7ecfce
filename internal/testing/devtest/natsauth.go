package devtest

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// The NATS authentication material of tests: nkeys, and an operator with
// accounts and users (JWT credentials), all made in the test. The certificate
// authority of the TLS tests is internal/testing/testcert's.

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
