package devtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
)

// ForgeSnapshotState is snap (an encoded account snapshot) with its state, read
// as JSON, edited by edit and its hash taken again: a forgery that passes the
// hash check, as anyone who can write the snapshots table can make.
func ForgeSnapshotState(t testing.TB, snap []byte, edit func(state map[string]any)) []byte {
	t.Helper()
	var s map[string]json.RawMessage
	if err := json.Unmarshal(snap, &s); err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(s["state"], &st); err != nil {
		t.Fatal(err)
	}
	edit(st)
	state, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(state)
	s["state"], s["hash"] = state, json.RawMessage(`"`+hex.EncodeToString(sum[:])+`"`)
	out, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
