package audit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ledgerworks/ledger/internal/app/reply"
)

// The comparison reads a read model's rows as the driver hands them
// (pgx.Rows.RawValues), without pgx's Scan: a text column is used as the
// bytes the driver received (valid until the next row), not a string made
// of them, and a bigint, timestamptz or uuid in the binary format the
// statement's description asks for is decoded here. The rows were the
// audit's largest allocation (pgx's strings, 48 of the 86 MB that reading
// them held at the audit's peak) and 12% of its CPU (Scan's plans and the
// variables they moved to the heap). A column in another format or of
// another type (a connection in the simple protocol sends text) is decoded
// by pgx's type map, as Scan decodes it: the same values, a row's text the
// same.

// rawRow decodes the columns of the row at a cursor. The first error is
// kept (err); the values after it are zero.
type rawRow struct {
	vals   [][]byte
	fields []pgconn.FieldDescription
	types  *pgtype.Map // pgx's, for the columns not decoded here; made once needed
	err    error
}

// errNull is reading a NULL where the table holds none (as Scan fails
// scanning NULL into a string or an integer).
var errNull = errors.New("cannot scan NULL into a non-null column")

// microsecY2K is 2000-01-01 UTC, PostgreSQL's epoch, in microseconds since 1970.
const microsecY2K = 946_684_800_000_000

func (r *rawRow) fail(i int, err error) {
	if r.err == nil {
		r.err = fmt.Errorf("column %d (%s): %w", i, r.fields[i].Name, err)
	}
}

// scan decodes column i through pgx's type map into dst.
func (r *rawRow) scan(i int, dst any) {
	if r.types == nil {
		r.types = pgtype.NewMap()
	}
	f := r.fields[i]
	if err := r.types.Scan(f.DataTypeOID, f.Format, r.vals[i], dst); err != nil {
		r.fail(i, err)
	}
}

// binary reports whether column i is of type oid in the binary format.
func (r *rawRow) binary(i int, oid uint32) bool {
	return r.fields[i].Format == pgtype.BinaryFormatCode && r.fields[i].DataTypeOID == oid
}

// text is column i's text: the driver's bytes of a text column, in either
// format (the same bytes), valid until the next row.
func (r *rawRow) text(i int) []byte {
	b := r.vals[i]
	if b == nil {
		r.fail(i, errNull)
		return nil
	}
	switch r.fields[i].DataTypeOID {
	case pgtype.TextOID, pgtype.VarcharOID:
		return b
	}
	var s string
	r.scan(i, &s)
	return []byte(s)
}

// int8 is column i's bigint.
func (r *rawRow) int8(i int) int64 {
	if r.vals[i] == nil {
		r.fail(i, errNull)
		return 0
	}
	if r.binary(i, pgtype.Int8OID) && len(r.vals[i]) == 8 {
		return int64(binary.BigEndian.Uint64(r.vals[i]))
	}
	var n int64
	r.scan(i, &n)
	return n
}

// at is column i's timestamptz, NULL refused.
func (r *rawRow) at(i int) time.Time {
	t, ok := r.atOrNull(i)
	if !ok {
		r.fail(i, errNull)
	}
	return t
}

// atOrNull is column i's timestamptz; false when NULL. An infinite one is
// left to pgx, which refuses it as Scan does.
func (r *rawRow) atOrNull(i int) (time.Time, bool) {
	b := r.vals[i]
	if b == nil {
		return time.Time{}, false
	}
	if r.binary(i, pgtype.TimestamptzOID) && len(b) == 8 {
		if us := int64(binary.BigEndian.Uint64(b)); us != math.MaxInt64 && us != math.MinInt64 {
			return time.UnixMicro(microsecY2K + us).UTC(), true
		}
	}
	var t time.Time
	r.scan(i, &t)
	return t, true
}

// uuidText renders column i's uuid as uuid.UUID.String does, into buf.
func (r *rawRow) uuidText(i int, buf *[36]byte) []byte {
	b := r.vals[i]
	if b == nil {
		r.fail(i, errNull)
		return nil
	}
	if r.binary(i, pgtype.UUIDOID) && len(b) == 16 {
		return reply.AppendUUID(buf[:0], uuid.UUID(b))
	}
	var u uuid.UUID // on the heap (scan's), declared here to stay off the path above
	r.scan(i, &u)
	return reply.AppendUUID(buf[:0], u)
}
