package audit

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
)

// TestEffectiveWithoutUntouchedRead (review r463): in an incremental audit
// of the whole ledger the untouched accounts' check by effective time is
// only what was read beside the fold (readUntouched, untouchedOf): reached
// without it, the audit is refused, not passed with those accounts
// unchecked. A full audit and an audit of one account have no untouched
// accounts and make their statement in turn: an account of the fold's that
// the (empty) read model lacks is named. The refusal is typed: an
// *UntouchedNotReadError naming the read model, matched by
// ErrUntouchedNotRead.
func TestEffectiveWithoutUntouchedRead(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, devtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	l := liveGen{name: projections.Balances}
	for _, c := range []struct {
		name    string
		resumed bool
		account string
		refused string // the error's text, "" for none
		named   int    // the violations the check in turn names
	}{
		{"incremental, whole ledger, the untouched not read", true, "", "balances of the accounts not touched: not read", 1},
		{"incremental, one account", true, "a", "", 1},
		{"full", false, "", "", 1},
	} {
		f := NewFold()
		if c.resumed {
			f.resumed = &resumedAccounts{}
		}
		r := &auditRun{f: f, opts: Options{Account: c.account}, tx: tx}
		err := r.checkEffective(ctx, nil, l, map[string][2]int64{"a": {5, 0}}, map[string]bool{})
		if (c.refused == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.refused) || len(f.Violations) != c.named {
			t.Errorf("%s: %v, %d violations %v; want %q and %d", c.name, err, len(f.Violations), f.Violations, c.refused, c.named)
		}
		var notRead *UntouchedNotReadError
		if c.refused != "" && (!errors.As(err, &notRead) || notRead.ReadModel != l.name || !errors.Is(err, ErrUntouchedNotRead)) {
			t.Errorf("%s: %#v, want an *UntouchedNotReadError naming %s, matched by ErrUntouchedNotRead", c.name, err, l.name)
		}
	}
}
