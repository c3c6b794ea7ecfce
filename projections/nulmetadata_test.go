package projections_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// nulMetadata is client metadata holding U+0000 in a value and in a key, as
// builds before 3de8c97 accepted it; "k\uFFFD" collides with "k\x00" once
// the NUL is replaced, and the first key in byte order ("k\x00") keeps its
// value.
var nulMetadata = map[string]string{"note": "refund a\x00b", "k\x00": "v0", "k\uFFFD": "vf"}

// nulMetadataHeld is nulMetadata as the read models hold it
// (projections.ReadModelMetadata).
var nulMetadataHeld = map[string]string{"note": "refund a\uFFFDb", "k\uFFFD": "v0"}

// postAsOldBuilds decides typ's body with metadata md set after the decoder,
// which refuses U+0000 since 3de8c97: the events are written as the builds
// before it wrote them (the same encoder, the request hash over the same
// fields, the chain over those bytes).
func postAsOldBuilds(t *testing.T, env *projtest.Env, typ domain.CommandType, body string, md map[string]string) string {
	t.Helper()
	cmd, ierr := domain.DecodeCommand(typ, []byte(body))
	if ierr != nil {
		t.Fatal(ierr)
	}
	cmd.Metadata = md
	r := env.Ledger.Handle(context.Background(), cmd)
	if r.Status != domain.StatusApplied {
		t.Fatalf("%s %s: %+v", typ, body, r)
	}
	return r.Position
}

// TestOldEventsWithNulMetadataProject: events whose client metadata holds
// U+0000 (an opening, a deposit, a capture), which PostgreSQL's jsonb
// refuses, are projected live and by a rebuild, with each U+0000 held as
// U+FFFD (projections.ReadModelMetadata), and the audit finds the read models
// equal to the store.
func TestOldEventsWithNulMetadataProject(t *testing.T) {
	env := projtest.New(t)
	postAsOldBuilds(t, env, domain.CmdOpenAccount, `{"idempotency_key":"o-n","account_id":"n","currency":"EUR"}`, nulMetadata)
	postAsOldBuilds(t, env, domain.CmdDeposit, `{"idempotency_key":"d-n","account_id":"n","amount":100,"currency":"EUR"}`, nulMetadata)
	postAsOldBuilds(t, env, domain.CmdPlaceHold, `{"idempotency_key":"h-n","account_id":"n","hold_id":"h","amount":30,"currency":"EUR"}`, nulMetadata)
	postAsOldBuilds(t, env, domain.CmdCaptureHold, `{"idempotency_key":"c-n","account_id":"n","hold_id":"h","amount":20}`, nulMetadata)
	env.MustApply(t, "withdraw", map[string]any{"idempotency_key": "w-n", "account_id": "n", "amount": 5, "currency": "EUR"})

	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	checkNulMetadataHeld(t, env, "live")
	projtest.AuditOK(t, env.Store, env.Pool)
	live := projtest.Snapshot(t, env.Pool)
	if _, err := rebuild(t, env, projections.RebuildOptions{}); err != nil {
		t.Fatal(err)
	}
	checkNulMetadataHeld(t, env, "rebuilt")
	projtest.SameSnapshot(t, "live read models vs a rebuild", live, projtest.Snapshot(t, env.Pool))
	projtest.AuditOK(t, env.Store, env.Pool)
}

// checkNulMetadataHeld reads account n's metadata and its statement's: the
// opening's, the deposit's and the capture's are nulMetadataHeld, the
// withdrawal's empty.
func checkNulMetadataHeld(t *testing.T, env *projtest.Env, what string) {
	t.Helper()
	var accountMD []byte
	if err := env.Pool.QueryRow(context.Background(), `SELECT metadata::text FROM readmodel.accounts WHERE account_id = 'n'`).Scan(&accountMD); err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(accountMD, &got); err != nil || !reflect.DeepEqual(got, nulMetadataHeld) {
		t.Errorf("%s: the account's metadata %s (%v), want %v", what, accountMD, err, nulMetadataHeld)
	}
	rows, err := env.Pool.Query(context.Background(), `SELECT key, metadata::text FROM (SELECT idempotency_key AS key, metadata FROM readmodel.entries WHERE account_id = 'n') e ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[string]map[string]string{"c-n": nulMetadataHeld, "d-n": nulMetadataHeld, "w-n": {}}
	seen := map[string]map[string]string{}
	for rows.Next() {
		var key string
		var md []byte
		if err := rows.Scan(&key, &md); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		if err := json.Unmarshal(md, &m); err != nil {
			t.Fatal(err)
		}
		seen[key] = m
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("%s: the entries' metadata %v, want %v", what, seen, want)
	}
}
