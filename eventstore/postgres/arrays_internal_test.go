package postgres

import (
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestEncodeArrayIsPgxs: the insert's arrays encode to the very bytes pgx's
// own array codec sends for the same values (PostgreSQL receives the same),
// an empty element included, and an empty array.
func TestEncodeArrayIsPgxs(t *testing.T) {
	m := pgtype.NewMap()
	for _, tc := range []struct {
		name  string
		oid   uint32
		ours  binaryArray
		plain any
	}{
		{"text", pgtype.TextArrayOID, textArray{"account-a", "", "key-é/1"}, []string{"account-a", "", "key-é/1"}},
		{"int8", pgtype.Int8ArrayOID, int8Array{0, 1, -1, 1 << 40}, []int64{0, 1, -1, 1 << 40}},
		{"uuid", pgtype.UUIDArrayOID, uuidArray{{1, 2, 3}, {15: 0xff}}, [][16]byte{{1, 2, 3}, {15: 0xff}}},
		{"bytea", pgtype.ByteaArrayOID, byteaArray{[]byte(`{"a":1}`), {}, {0}}, [][]byte{[]byte(`{"a":1}`), {}, {0}}},
		{"empty", pgtype.TextArrayOID, textArray{}, []string{}},
	} {
		want, err := m.Encode(tc.oid, pgtype.BinaryFormatCode, tc.plain, []byte("prefix"))
		if err != nil {
			t.Fatalf("%s: pgx: %v", tc.name, err)
		}
		if got := encodeArray(tc.ours, []byte("prefix")); !bytes.Equal(got, want) {
			t.Errorf("%s: encoded\n%x\nwant (pgx)\n%x", tc.name, got, want)
		}
	}
}

// TestRegisterArraysLeavesOtherValues: on a map with arrayCodec registered, the
// insert's arrays take its plan, and a plain slice is still encoded by pgx.
func TestRegisterArraysLeavesOtherValues(t *testing.T) {
	m := pgtype.NewMap()
	registerArrays(m)
	registerArrays(m) // once is enough; again changes nothing
	if _, ok := m.PlanEncode(pgtype.ByteaArrayOID, pgtype.BinaryFormatCode, byteaArray{}).(arrayPlan); !ok {
		t.Fatal("byteaArray is not encoded by arrayPlan")
	}
	want, err := pgtype.NewMap().Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, []string{"a", "b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, []string{"a", "b"}, nil)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a []string after registerArrays: %x, %v; want %x", got, err, want)
	}
	if _, ok := m.PlanEncode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, textArray{}).(arrayPlan); ok {
		t.Fatal("a textArray given for a uuid[] took arrayPlan")
	}
}
