package projections_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditPoolRunsWithoutJIT: an audit's pool opens its sessions with jit
// off, a URL's own jit wins, and the projector's pool keeps the server's
// setting (on here, PostgreSQL's default: the test fails if the server's is
// off, which would prove nothing of the audit's).
func TestAuditPoolRunsWithoutJIT(t *testing.T) {
	env := projtest.New(t)
	ctx := context.Background()
	var server string
	if err := env.Pool.QueryRow(ctx, `SELECT current_setting('jit')`).Scan(&server); err != nil {
		t.Fatal(err)
	}
	if server != "on" {
		t.Fatalf("the server's jit is %q: this test needs PostgreSQL's default, on", server)
	}
	withJIT, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := withJIT.Query()
	q.Set("jit", "on")
	withJIT.RawQuery = q.Encode()
	for _, c := range []struct {
		name, url, want string
		open            func(context.Context, string) (*pgxpool.Pool, error)
	}{
		{"the audit's pool", env.URL, "off", projections.NewAuditPool},
		{"the audit's pool, the URL's jit=on", withJIT.String(), "on", projections.NewAuditPool},
		{"the projector's pool", env.URL, "on", projections.NewPool},
	} {
		pool, err := c.open(ctx, c.url)
		if err != nil {
			t.Fatal(err)
		}
		// Two sessions at once: every connection of the pool, not only its first.
		a, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, conn := range []*pgxpool.Conn{a, b} {
			var got string
			if err := conn.QueryRow(ctx, `SELECT current_setting('jit')`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("%s, session %d: jit %q, want %q", c.name, i, got, c.want)
			}
		}
		a.Release()
		b.Release()
		pool.Close()
	}
}
