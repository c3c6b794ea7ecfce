package kurrentdb_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/eventstore/storetest"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/testcert"
)

const (
	adminPassword  = "changeit-7Qx"
	readerPassword = "reader-pw-9Kz"
)

// secureServer starts a test server that requires TLS, with a certificate of a
// CA made here, and credentials: admin (in $admins) and reader (not). It
// returns the server's host:port and the CA file.
func secureServer(t *testing.T) (*kurrenttest.Server, string) {
	t.Helper()
	ca := testcert.NewCA(t)
	srv, _ := kurrenttest.Start(t,
		kurrenttest.WithTLS(ca.Issue(t, "kurrentdb", true).Pair(t)),
		kurrenttest.WithUsers(
			kurrenttest.User{Name: "admin", Password: adminPassword, Admin: true},
			kurrenttest.User{Name: "reader", Password: readerPassword}))
	return srv, testcert.WriteFile(t, "ca.crt", ca.CertPEM)
}

// TestSecureNode: the backend connects to a node that requires TLS and
// credentials through its URL, and works (append, read, subscribe).
func TestSecureNode(t *testing.T) {
	srv, caFile := secureServer(t)
	s := devtest.OpenKurrentDB(t, "kurrentdb://admin:"+adminPassword+"@"+srv.Addr()+"?tlsCAFile="+caFile)
	e := ev("Opened")
	res := mustAppend(t, s, "account-1", eventstore.NoStream, e)
	sub, err := s.SubscribeAll(ctxT(t), eventstore.Start, eventstore.SubscribeOptions{StreamPrefixes: []string{"account-"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sameIDs(t, devtest.Receive(t, sub, 1), []eventstore.EventData{e})
	if head, err := s.Head(ctxT(t)); err != nil || head != res.Position {
		t.Fatalf("head %s, %v; want %s", head, err, res.Position)
	}
}

// TestConformanceSecureNode runs the event-store suite on one secure server,
// as the admin, every subtest with its own connection.
func TestConformanceSecureNode(t *testing.T) {
	srv, caFile := secureServer(t)
	url := "kurrentdb://admin:" + adminPassword + "@" + srv.Addr() + "?tlsCAFile=" + caFile
	storetest.Run(t, func(t *testing.T) eventstore.Store { return devtest.OpenKurrentDB(t, url) })
}

// TestSecureNodeRefusesWrongSettings: without the right credentials, or
// without the CA, Open fails at once with an error that says why and never
// holds a password.
func TestSecureNodeRefusesWrongSettings(t *testing.T) {
	srv, caFile := secureServer(t)
	addr := srv.Addr()
	fail := "&maxDiscoverAttempts=1&discoveryInterval=1"
	for _, c := range []struct {
		name, url string
		want      []string
		is        error
	}{
		{"wrong password", "kurrentdb://admin:wrong-" + adminPassword + "@" + addr + "?tlsCAFile=" + caFile,
			[]string{"authentication"}, kurrentdb.ErrUnauthenticated},
		{"no credentials", "kurrentdb://" + addr + "?tlsCAFile=" + caFile,
			[]string{"access denied"}, kurrentdb.ErrAccessDenied},
		{"a user not in $admins", "kurrentdb://reader:" + readerPassword + "@" + addr + "?tlsCAFile=" + caFile,
			[]string{"access denied", "$all"}, kurrentdb.ErrAccessDenied},
		{"no CA", "kurrentdb://admin:" + adminPassword + "@" + addr + "?tls=true" + fail,
			[]string{"certificate"}, eventstore.ErrUnavailable},
		{"no TLS", "kurrentdb://admin:" + adminPassword + "@" + addr + "?tls=false" + fail,
			[]string{"connect"}, eventstore.ErrUnavailable},
		// With the store's rediscovery (3,000 attempts) Open ends at its deadline:
		// the client's last error says why.
		{"no CA, rediscovering", "kurrentdb://admin:" + adminPassword + "@" + addr,
			[]string{"deadline", "certificate"}, eventstore.ErrUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			s, err := kurrentdb.Open(ctx, c.url)
			if err == nil {
				_ = s.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, c.is) {
				t.Errorf("error %v, want %v", err, c.is)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			for _, secret := range []string{adminPassword, readerPassword} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q holds a password", err)
				}
			}
		})
	}
}
